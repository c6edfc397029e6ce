# The lent GPU machine's whole job (fourth run on): started in the background by call2.sh once the model is
# installed, so a call's 10-minute limit never cuts a step; each later call waits on it and returns its logs.
# The SmolLM2 tests first: cold, they compile the float32 target's buckets and the bf16: copy's (about three minutes
# each on the H200 machine, docs/gpu.md, fourth run), which the compiled benches then take from inductor's cache.
# The eager bench, measured by four runs, is left out (fifth run on) to leave the lease's minutes to the rest.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/site:/tmp/repo
K=/tmp/keep; cd /tmp/repo || exit 1
SD="python3 -c 'import sys; from specdec_cli.cli import main; sys.exit(main())'"
H="-m smollm2-135m --limit 4 -n 128"
F="--dtype float32"
step() { echo "== $(date +%T) $1" >> $K/steps.txt; }
step stores  # in the background, on the CPU: only the compiled bench needs them, after the tests
( mkdir -p /tmp/st; eval $SD build-datastore --corpus python-stdlib --max-tokens 3000000 --out /tmp/st/sa -q
  eval $SD build-datastore --corpus python-stdlib --max-tokens 3000000 --kind trigram --out /tmp/st/tri -q ) \
  > $K/stores.txt 2>&1 &
stores=$!
step tests
timeout 560 python3 -m pytest -p no:cacheprovider -v -rA tests/test_gpu.py -k "not tiny and not sd_sampling" \
  --timeout 420 --durations=0 2>&1 | grep -v -E "^(DEBUG|INFO)" > $K/pytest-smollm2.txt
while kill -0 "$(cat $K/tiny.pid)" 2>/dev/null; do sleep 2; done  # the benches below are timed: the GPU alone
wait $stores
step bench-compiled
eval timeout 200 $SD bench $H $F -p humaneval --compile on --methods ar,auto,pld,ngram-trie,rest,aded \
  --datastore rest=/tmp/st/sa --datastore aded=/tmp/st/tri --out $K/bench-compiled.jsonl > $K/bench-compiled.txt 2>&1
step bench-draft
eval timeout 180 $SD bench $H $F -p humaneval --compile on --draft bf16: --methods ar,sd,auto \
  --out $K/bench-draft.jsonl > $K/bench-draft.txt 2>&1
step bench-mtbench
eval timeout 130 $SD bench $H $F -p mt-bench --compile on --methods ar,auto,pld \
  --out $K/bench-mtbench.jsonl > $K/bench-mtbench.txt 2>&1
step bench-bf16  # the target in bfloat16: the bf16: copy's graphs, compiled by the tests, are its own
eval timeout 120 $SD bench $H -p humaneval --dtype bfloat16 --compile on --methods ar,auto,pld \
  --out $K/bench-bf16.jsonl > $K/bench-bf16.txt 2>&1
step done
