#!/usr/bin/env bash
# Run the test suite offline (no hub access), on the CPU. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider "$@"
