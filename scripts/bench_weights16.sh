#!/usr/bin/env bash
# 16-bit weights against float32 and llama.cpp (issue 35's matrix), on one thread, both models, HumanEval, MT-Bench,
# rag and long-edit, 8 prompts, 128 new tokens, llama.cpp in the same runs (scripts/install-llama-cpp.sh first).
#   bash scripts/bench_weights16.sh OUT_DIR [MODELS...]        (default: smollm2-135m gemma3-270m)
# Writes into OUT_DIR:
#   MODEL-SET-bf16.jsonl  --dtype bfloat16: ar, auto, llama.cpp on F16 and on BF16 (the same weights as ar)
#   MODEL-SET-f16.jsonl   --dtype float16: ar, auto
#   MODEL-SET-f32.jsonl   --dtype float32: ar, auto, llama.cpp on F32 (the same weights as ar)
#   MODEL-memory-DTYPE.jsonl  ar alone per dtype (the record's peak_rss_mib: the model and one method only)
#   MODEL-ceiling.md      the step against the memory-bound ceiling per dtype (scripts/step_ceiling.py)
#   MODEL-agreement.json  how often 16-bit greedy output equals float32's (scripts/dtype_agreement.py)
#   7b.json               the codellama-7b-shaped target in bfloat16 (scripts/bench_7b.py)
#   summary.md            the done-criteria ratios (scripts/weights16_table.py)
# Needs a quiet machine for its timings; about 3 hours on the 2-core VM of docs/benchmarks.md (Gemma-3's float32
# runs are the longest).
set -euo pipefail
out=$1; shift
models=("${@:-smollm2-135m gemma3-270m}")
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$out"
run() { nice -n 0 specdec bench --limit 8 -n 128 --threads 1 "$@"; }
for model in ${models[@]}; do
  python3 "$here/step_ceiling.py" --model "$model" --dtypes float32,bfloat16,float16 --rows 1,2,4 \
    > "$out/$model-ceiling.md"
  for set in humaneval mt-bench rag long-edit; do
    run --model "$model" --prompts "$set" --dtype bfloat16 --methods ar,auto,llama-cpp-f16,llama-cpp \
      --out "$out/$model-$set-bf16.jsonl"
    run --model "$model" --prompts "$set" --dtype float16 --methods ar,auto --out "$out/$model-$set-f16.jsonl"
    run --model "$model" --prompts "$set" --dtype float32 --methods ar,auto,llama-cpp \
      --out "$out/$model-$set-f32.jsonl"
  done
  for dtype in float32 bfloat16 float16; do
    specdec bench --model "$model" --prompts humaneval --limit 2 -n 32 --threads 1 --dtype "$dtype" --methods ar \
      --out "$out/$model-memory-$dtype.jsonl"
  done
  python3 "$here/dtype_agreement.py" --model "$model" --json > "$out/$model-agreement.json"
done
python3 "$here/bench_7b.py" --json > "$out/7b.json"
python3 "$here/weights16_table.py" "$out" > "$out/summary.md"
cat "$out/summary.md"
