#!/usr/bin/env bash
# The issue-24 measurement: throughput mode (docs/bench.md) on SmolLM2-135M and Gemma-3-270M, 32 HumanEval
# prompts and 32 MT-Bench first turns, 128 new tokens, 2 threads: sequential ar, transformers' batched greedy
# generate and our batched methods at each batch size; every output checked against sequential ar's.
#   bash scripts/bench_batch.sh OUT_PREFIX [SIZES] [METHODS]
set -euo pipefail
out=$1
sizes=${2:-8,16,32}
methods=${3:-auto}
for model in smollm2-135m gemma3-270m; do
  for set in humaneval mt-bench; do
    specdec bench --model "$model" --prompts "$set" --limit 32 -n 128 --threads 2 --methods "$methods" \
      --batch-size "$sizes" --out "$out-$model-$set.jsonl"
  done
done
