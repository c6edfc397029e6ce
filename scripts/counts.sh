#!/usr/bin/env bash
# Per-prompt counts (target forwards, emitted, drafted, accepted) of every method, to show that a refactor keeps
# behaviour: run it on the code before and after, then `python scripts/compare_counts.py BEFORE AFTER`.
#   bash scripts/counts.sh STORE_PREFIX OUT_PREFIX
# STORE_PREFIX-sa (suffix array) and STORE_PREFIX-tri (tri-grams) built with SmolLM2 from python-stdlib.
# Three runs: greedy with --budget paper; greedy with --budget auto; sampled (t=0.8) with --budget auto, where only
# the cached hardware profile prices time, so the counts are reproducible (greedy --budget auto also learns from
# measured drafting times, and may differ between two runs of the same code).
set -euo pipefail
ds=$1; out=$2
common=(--model smollm2-135m --limit 2 -n 32 --threads 1 --no-warmup --draft int8: --draft bf16:
  --methods ar,sd,self-verify,hsddw,rest,aded,ngram-trie,pld,auto
  --datastore "rest=$ds-sa" --datastore "aded=$ds-tri" --datastore "auto=$ds-sa" --datastore "auto=$ds-tri")
for set in humaneval mt-bench long-edit; do
  specdec bench "${common[@]}" --prompts "$set" --budget paper --out "$out-$set-paper.jsonl"
  specdec bench "${common[@]}" --prompts "$set" --budget auto --out "$out-$set-auto.jsonl"
  specdec bench "${common[@]}" --prompts "$set" --budget auto -t 0.8 --seed 1 --out "$out-$set-auto-t08.jsonl"
done
