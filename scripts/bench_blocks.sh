#!/usr/bin/env bash
# Issue 35's GGUF stretch: `--kernels blocks` (the model's GGUF blocks read as stored) against llama.cpp reading the
# same file (`llama-cpp-stored`) and the same weights at F32 (`llama-cpp`), in the same run; then the float32 path
# (`--kernels auto`) against the same llama.cpp file, for the ratio blocks / float32 through that common anchor.
# One thread, 8 prompts, 128 tokens, the four sets. Needs the llama-cpp extra (scripts/install-llama-cpp.sh).
#   bash scripts/bench_blocks.sh MODEL OUT_PREFIX
set -euo pipefail
model=$1; out=$2
for set in humaneval mt-bench rag long-edit; do
  specdec bench --model "$model" --prompts "$set" --limit 8 -n 128 --threads 1 --kernels blocks \
    --methods ar,auto,llama-cpp-stored,llama-cpp --out "$out-$set-blocks.jsonl"
  specdec bench --model "$model" --prompts "$set" --limit 8 -n 128 --threads 1 --kernels auto \
    --methods ar,auto,llama-cpp-stored --out "$out-$set-float32.jsonl"
done
