#!/usr/bin/env bash
# Add llama.cpp (llama-cpp-python) to a specdec install, as a `specdec bench` baseline (methods llama-cpp,
# llama-cpp-f16, llama-cpp-q: docs/bench.md). The registry has it as source only: it builds llama.cpp with cmake,
# 10-20 minutes on two cores (nice'd, so a machine's other work keeps its cores). It also keeps llama.cpp's own
# converter (convert_hf_to_gguf.py and the gguf-py it was written for) from the same source release under
# $SPECDEC_CACHE/llama-cpp/, which bench uses to write F32/F16 GGUFs of the model it compares against.
# Run scripts/install.sh first; safe to run again (nothing is rebuilt when the version is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERSION=0.3.36  # the release the baseline was measured with (docs/profiling.md, issue 35)
PIP="$PY -m pip install --disable-pip-version-check -q"
CACHE=${SPECDEC_CACHE:-$HOME/.cache/specdec}
TOOLS="$CACHE/llama-cpp/$VERSION"

if ! command -v cmake >/dev/null 2>&1 || ! command -v c++ >/dev/null 2>&1; then
  SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
  $SUDO apt-get update -q && $SUDO apt-get install -y -q cmake build-essential
fi

if ! $PY -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
  # two parallel compile jobs (a two-core runner), lowest priority; CPU-only build (no BLAS: llama.cpp's own
  # kernels, as its release binaries for the CPU); without the multimodal library (LLAVA_BUILD: 51 of the 178
  # objects; llama_cpp imports it only for image chat formats)
  CMAKE_ARGS="-DLLAVA_BUILD=OFF ${CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
    nice -n 19 $PIP "llama-cpp-python==$VERSION" sentencepiece
fi

if [ ! -f "$TOOLS/convert_hf_to_gguf.py" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  $PY -m pip download --disable-pip-version-check -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$tmp"
  tar xzf "$tmp"/llama_cpp_python-$VERSION.tar.gz -C "$tmp" \
    "llama_cpp_python-$VERSION/vendor/llama.cpp/convert_hf_to_gguf.py" \
    "llama_cpp_python-$VERSION/vendor/llama.cpp/gguf-py" \
    "llama_cpp_python-$VERSION/vendor/llama.cpp/conversion"
  mkdir -p "$TOOLS.tmp"
  cp -r "$tmp/llama_cpp_python-$VERSION/vendor/llama.cpp/." "$TOOLS.tmp/"
  rm -rf "$TOOLS" && mv "$TOOLS.tmp" "$TOOLS"
fi
$PY -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'installed for specdec bench --methods llama-cpp')" >&2
