#!/usr/bin/env bash
# The issue-20 measurement of `auto`, one model: first `auto` with no flags (what a new user gets) against `ar`,
# then `auto` with every source against every single method with the same resources (--draft int8:, the stdlib
# suffix-array and tri-gram stores) and transformers' baselines, in the same run; 8 prompts, 128 tokens, 1 thread.
#   bash scripts/bench_auto.sh MODEL STORE_PREFIX OUT_PREFIX
# STORE_PREFIX-stdlib (suffix array) and STORE_PREFIX-stdlib-tri (tri-grams) from `specdec build-datastore`.
set -euo pipefail
model=$1; ds=$2; out=$3
for set in humaneval long-edit rag mt-bench; do
  specdec bench --model "$model" --prompts "$set" --limit 8 -n 128 --threads 1 --methods ar,auto \
    --out "$out-$set-bare.jsonl"
done
for set in humaneval long-edit rag mt-bench; do
  hf=""; case $set in humaneval|long-edit) hf=",hf,hf-pld";; esac
  specdec bench --model "$model" --prompts "$set" --limit 8 -n 128 --threads 1 --draft int8: \
    --methods "ar,auto,pld,ngram-trie,rest,aded,sd$hf" \
    --datastore "auto=$ds-stdlib" --datastore "auto=$ds-stdlib-tri" --datastore "rest=$ds-stdlib" \
    --datastore "aded=$ds-stdlib-tri" --out "$out-$set.jsonl"
done
