#!/usr/bin/env bash
# Issue 32: specdec on vLLM against vLLM's own drafters and specdec's own engine, in one run per model and set:
# vLLM plain (the baseline), vLLM's n-gram and SuffixDecoding drafters, specdec's proposer on vLLM (auto), and
# specdec's own ar and auto; 8 prompts, 128 new tokens, one thread. Then the throughput mode (32 HumanEval prompts,
# B = 32) and a second pass over the same prompts (memory).
#   bash scripts/bench_issue32.sh MODEL OUT_PREFIX
set -euo pipefail
model=$1; out=$2
for set in humaneval mt-bench rag long-edit; do
  specdec bench --engine vllm --model "$model" --prompts "$set" --limit 8 -n 128 --threads 1 \
    --methods vllm,vllm-ngram,vllm-suffix,auto,ar,auto@specdec --out "$out-$set.jsonl"
done
specdec bench --engine vllm --model "$model" --prompts humaneval --limit 32 -n 128 --threads 1 --batch-size 32 \
  --methods vllm,auto,auto@specdec --out "$out-throughput.jsonl"
specdec bench --engine vllm --model "$model" --prompts 'humaneval*2' --limit 8 -n 128 --threads 1 \
  --methods vllm,vllm-suffix,auto --out "$out-second-pass.jsonl"
