#!/usr/bin/env bash
# `auto` on prompts it was not tuned on (issue 36's Done-means matrix), one model: `auto` with no flags beside the
# copy methods `pld` and `ngram-trie` (and `ar`), in the same interleaved run per prompt set; 128 new tokens, one
# thread. HumanEval, MT-Bench (both turns), rag and long-edit with 8 prompts each; the new `wide` set whole (its
# tuning split, 30 prompts) and `wide-heldout` (the 20 prompts kept aside). Then
# `python scripts/auto_unseen_table.py OUT_PREFIX...` makes the table.
#   bash scripts/bench_auto_unseen.sh MODEL OUT_PREFIX [SETS...]      (docs/results/auto-unseen/cpu-MODEL)
# With FULL=1 it also reruns the issue-20 measurement (`auto` with every source against every single method:
# docs/benchmarks.md, "`auto`, the default"; needs STORES=prefix of the stdlib suffix-array and tri-gram stores).
set -euo pipefail
model=$1; out=$2; shift 2
sets=("$@"); [ ${#sets[@]} -gt 0 ] || sets=(humaneval long-edit rag mt-bench wide wide-heldout)
for set in "${sets[@]}"; do
  limit=8; case $set in wide) limit=30;; wide-heldout) limit=20;; esac
  specdec bench --model "$model" --prompts "$set" --limit "$limit" -n 128 --threads 1 \
    --methods ar,auto,pld,ngram-trie --out "$out-$set.jsonl"
done
if [ "${FULL:-0}" = 1 ]; then
  bash "$(dirname "$0")/bench_auto.sh" "$model" "${STORES:?STORES=prefix of the stdlib stores}" "$out-auto-default"
fi
