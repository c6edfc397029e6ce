#!/usr/bin/env bash
# `auto` against the single methods after the faster step (issue 25; the `auto` issue's table redone) -- `auto`
# with no flags (what a new user gets) against `ar`, the copy-based single methods, `sd` with the int8 copy as its
# draft (mt-bench) and, on the code sets, transformers' `hf` and `hf-pld`, all in the same run; 8 prompts, 128 new
# tokens, one thread.
#   bash scripts/bench_auto_vs_methods.sh MODEL OUT_PREFIX        (docs/results/auto-vs-methods/cpu-MODEL)
# Then `python scripts/auto_vs_methods_table.py` makes the table.
set -euo pipefail
model=$1; out=$2
for set in humaneval long-edit rag mt-bench; do
  extra=(); methods="ar,auto,pld,ngram-trie"
  case $set in
    humaneval|long-edit) methods="$methods,hf,hf-pld";;
    mt-bench) methods="$methods,sd"; extra=(--draft int8:);;
  esac
  specdec bench --model "$model" --prompts "$set" --limit 8 -n 128 --threads 1 --methods "$methods" \
    "${extra[@]}" --out "$out-$set.jsonl"
done
