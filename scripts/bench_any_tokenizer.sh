#!/usr/bin/env bash
# The issue-23 measurement: Gemma-3-270M (target) with SmolLM2-135M (a draft of another tokenizer), 8 prompts,
# 128 tokens, 1 thread. ar, sd with the draft, transformers' assisted generation with the same draft (Universal
# Assisted Generation: tokenizer + assistant_tokenizer), auto with the draft; then auto without a draft on
# MT-Bench for the comparison. Greedy: every output is checked against ar's.
#   bash scripts/bench_any_tokenizer.sh OUT_PREFIX
set -euo pipefail
out=$1
for set in humaneval mt-bench long-edit; do
  specdec bench --model gemma3-270m --draft smollm2-135m --prompts "$set" --limit 8 -n 128 --threads 1 \
    --methods ar,sd,hf-assisted,auto --out "$out-$set.jsonl"
done
specdec bench --model gemma3-270m --prompts mt-bench --limit 8 -n 128 --threads 1 --methods ar,auto \
  --out "$out-mt-bench-nodraft.jsonl"
# acceptance per position of the draft's chain, verified whole (--budget paper: a fixed window of 5)
specdec bench --model gemma3-270m --draft smollm2-135m --prompts mt-bench --limit 8 -n 128 --threads 1 \
  --methods ar,sd --budget paper --out "$out-mt-bench-paper.jsonl"
