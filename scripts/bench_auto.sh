#!/usr/bin/env bash
# The issue-20 measurement of `auto` against every single method and transformers' baselines, in the same run:
# one model, four prompt sets, 8 prompts, 128 tokens, one thread; then `auto` with no flags (a new user's run).
#   bash scripts/bench_auto.sh MODEL STORE_PREFIX OUT_PREFIX
# STORE_PREFIX-stdlib (suffix array) and STORE_PREFIX-stdlib-tri (tri-grams) from `specdec build-datastore`.
set -euo pipefail
model=$1; ds=$2; out=$3
for set in humaneval long-edit mt-bench rag; do
  hf=""; case $set in humaneval|long-edit) hf=",hf,hf-pld,hf-assisted";; esac
  specdec bench --model "$model" --prompts "$set" --limit 8 -n 128 --threads 1 --draft int8: \
    --methods "ar,auto,pld,ngram-trie,rest,aded,sd$hf" \
    --datastore "auto=$ds-stdlib" --datastore "auto=$ds-stdlib-tri" --datastore "rest=$ds-stdlib" \
    --datastore "aded=$ds-stdlib-tri" --out "$out-$set.jsonl"
done
for set in humaneval long-edit mt-bench rag; do
  specdec bench --model "$model" --prompts "$set" --limit 8 -n 128 --threads 1 --methods ar,auto \
    --out "$out-$set-bare.jsonl"
done
