#!/usr/bin/env bash
# Issue 25: every method with the same resources, one prompt set, run by the code under test -- run it twice,
# the old code and the new, back to back, to see the faster step carried into each method:
#   bash scripts/bench_before_after.sh MODEL SET STORE_PREFIX OUT.jsonl [SPECDEC_COMMAND...]
# STORE_PREFIX-stdlib (suffix array) and STORE_PREFIX-stdlib-tri (tri-grams) from `specdec build-datastore`.
set -euo pipefail
model=$1; set=$2; ds=$3; out=$4; shift 4
cmd=("${@:-specdec}")
"${cmd[@]}" bench --model "$model" --prompts "$set" --limit 8 -n 128 --threads 1 --draft int8: \
  --methods ar,auto,pld,ngram-trie,rest,aded,sd,self-verify \
  --datastore "auto=$ds-stdlib" --datastore "auto=$ds-stdlib-tri" --datastore "rest=$ds-stdlib" \
  --datastore "aded=$ds-stdlib-tri" --out "$out"
