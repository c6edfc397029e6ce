#!/usr/bin/env bash
# specdec on vLLM against vLLM's own drafters and specdec's own engine, in one run per model: vLLM plain (the
# baseline), vLLM's n-gram and SuffixDecoding drafters, specdec's proposer on vLLM (auto), and specdec's own ar and
# auto; 12 prompts (3 each of HumanEval, MT-Bench (both turns), rag and long-edit: docs/results/vllm/mixed-12.jsonl,
# made by scripts/mixed_set.py; one file, so each vLLM method starts its engine once), 128 new tokens, one thread.
# With THROUGHPUT=1 also the throughput mode: 32 HumanEval prompts at once (B = 32).
#   bash scripts/bench_vllm.sh MODEL OUT_PREFIX
# Then python scripts/vllm_table.py OUT_PREFIX-latency.jsonl... makes the per-category table of docs/vllm.md.
set -euo pipefail
model=$1; out=$2
here="$(cd "$(dirname "$0")" && pwd)"
specdec bench --engine vllm --model "$model" --prompts "$here/../docs/results/vllm/mixed-12.jsonl" -n 128 \
  --threads 1 --methods vllm,vllm-ngram,vllm-suffix,auto,ar,auto@specdec --out "$out-latency.jsonl"
if [ "${THROUGHPUT:-0}" = 1 ]; then
  specdec bench --engine vllm --model "$model" --prompts humaneval --limit 32 -n 128 --threads 1 --batch-size 32 \
    --methods vllm,vllm-suffix,auto,ar@specdec,auto@specdec --out "$out-throughput.jsonl"
fi
