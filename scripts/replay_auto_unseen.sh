#!/usr/bin/env bash
# `auto` on prompts it was not tuned on, deterministic counts (issue 36): `auto`, `pld` and `ngram-trie` replayed
# against the recorded `ar` outputs in docs/results/ar-outputs/ (both models; humaneval, long-edit, rag,
# mt-bench: 8 prompts; wide: 30; wide-heldout: 20; 128 tokens), priced with the forward times recorded with them and
# with a quiet machine's (docs/profiling.md). No model, no timing; the same counts on any machine.
#   bash scripts/replay_auto_unseen.sh            (record fresh outputs first: python scripts/ar_outputs.py ...)
set -euo pipefail
cd "$(dirname "$0")/.."
for model in smollm2-135m gemma3-270m; do
  files=(docs/results/ar-outputs/ar-$model-{humaneval,long-edit,rag,mt-bench,wide,wide-heldout}.json.gz)
  echo "== $model, forward times recorded with the outputs"
  PYTHONPATH=. python scripts/replay_bench.py "${files[@]}" --by-category
  echo "== $model, a quiet machine's forward times"
  PYTHONPATH=. python scripts/replay_bench.py "${files[@]}" --by-category \
    --profile docs/results/ar-outputs/profile-quiet-$model.json
done
