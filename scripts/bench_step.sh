#!/usr/bin/env bash
# Issue 25's measurement: `ar`'s decode step against the single-thread memory-bound ceiling, in the same run as
# transformers' `generate` (`hf`): the issue's prompt ("def quicksort(items):", raw) three times, 64 new tokens,
# one thread, float32. Prints the read bandwidth the ceiling is taken from, then appends the bench record.
#   bash scripts/bench_step.sh MODEL OUT.jsonl [SPECDEC_COMMAND...]
set -euo pipefail
model=$1; out=$2; shift 2
prompts="$(cd "$(dirname "$0")/.." && pwd)/docs/results/step/quicksort-prompt.jsonl"
cmd=("${@:-specdec}")
python3 - <<'PY'
import time, numpy as np
a = np.ones(512 * 1024 * 1024 // 8)
best = min((lambda t: (a.sum(), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(5))
print(f"single-thread read bandwidth (numpy sum over 512 MB, best of 5): {a.nbytes / best / 1e9:.1f} GB/s")
PY
"${cmd[@]}" bench --model "$model" --prompts "$prompts" -n 64 --threads 1 \
  --methods ar,hf --out "$out"
