#!/usr/bin/env bash
# Per-prompt counts (target forwards, emitted, drafted, accepted) of every method, to show that a refactor keeps
# behaviour: run it on the code before and after, then `python scripts/compare_counts.py BEFORE AFTER`.
#   bash scripts/counts.sh STORE_PREFIX OUT_PREFIX
# STORE_PREFIX-sa (suffix array) and STORE_PREFIX-tri (tri-grams) built with SmolLM2 from python-stdlib.
# One sequence at a time (the single loop): greedy with --budget paper ("paper"); greedy with --budget auto
# ("auto"); sampled (t=0.8) with --budget auto ("auto-t08"), where only the cached hardware profile prices time, so
# the counts are reproducible (greedy --budget auto also learns from measured drafting times, and may differ
# between two runs of the same code). Batched (throughput mode, --batch-size 1,4: the batch loop with one row and
# with four rows): greedy --budget paper ("batch-paper") and sampled --budget auto ("batch-auto-t08"), whose
# per-sequence counts the throughput record keeps. Reproducible there: B=1 of both, and B=4 sampled (its prices are
# the measured table's only); a greedy B=4 step's common width also reads this run's learned forward times (the
# wall clock), so "batch-paper ... B=4" can differ between two runs of the same code on a busy machine.
# Sets of 2 prompts (4 for the batches, so that four rows fill), 32 new tokens. RUNS="paper auto-t08 ..." picks some
# of the five (default: all; the greedy "auto" run cannot be compared, it is there to show that outputs stay
# identical to ar's), SETS="humaneval ..." some of the sets.
set -euo pipefail
ds=$1; out=$2
runs=${RUNS:-paper auto auto-t08 batch-paper batch-auto-t08}
methods=ar,sd,self-verify,hsddw,rest,aded,ngram-trie,pld,auto
common=(--model smollm2-135m -n 32 --threads 1 --draft int8: --draft bf16: --methods "$methods"
  --datastore "rest=$ds-sa" --datastore "aded=$ds-tri" --datastore "auto=$ds-sa" --datastore "auto=$ds-tri")
for set in ${SETS:-humaneval mt-bench long-edit}; do
  one=(--limit 2 --no-warmup --prompts "$set")
  many=(--limit 4 --prompts "$set" --batch-size 1,4)
  for run in $runs; do
    case $run in
      paper) args=("${one[@]}" --budget paper);;
      auto) args=("${one[@]}" --budget auto);;
      auto-t08) args=("${one[@]}" --budget auto -t 0.8 --seed 1);;
      batch-paper) args=("${many[@]}" --budget paper);;
      batch-auto-t08) args=("${many[@]}" --budget auto -t 0.8 --seed 1);;
      *) echo "counts.sh: unknown run $run" >&2; exit 2;;
    esac
    specdec bench "${common[@]}" "${args[@]}" --out "$out-$set-$run.jsonl"
  done
done
