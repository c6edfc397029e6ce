# The lent GPU machine's whole job (fourth run on): started in the background by call2.sh once the model is
# installed, so a call's 10-minute limit never cuts a step; each later call waits on it and returns its logs.
# The eager bench, then the SmolLM2 tests: cold, they compile the float32 target's buckets and the bf16: copy's (about
# three minutes each on the H200 machine, docs/gpu.md, fourth run), which the compiled benches then take from
# inductor's cache (the fourth run's compiled bench, run first, spent its 200 s compiling).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/site:/tmp/repo
K=/tmp/keep; cd /tmp/repo || exit 1
SD="python3 -c 'import sys; from specdec_cli.cli import main; sys.exit(main())'"
H="-m smollm2-135m --limit 4 -n 128 --dtype float32"
step() { echo "== $(date +%T) $1" >> $K/steps.txt; }
step stores  # in the background: the eager bench needs none, and builds on the CPU leave a GPU-bound bench alone
( mkdir -p /tmp/st; eval $SD build-datastore --corpus python-stdlib --max-tokens 3000000 --out /tmp/st/sa -q
  eval $SD build-datastore --corpus python-stdlib --max-tokens 3000000 --kind trigram --out /tmp/st/tri -q ) \
  > $K/stores.txt 2>&1 &
stores=$!
while kill -0 "$(cat $K/tiny.pid)" 2>/dev/null; do sleep 2; done  # call 1's tiny tests share the GPU: let them end
step bench-eager
eval timeout 120 $SD bench $H -p humaneval --compile off --methods ar,auto,pld,hf,hf-pld \
  --out $K/bench-eager.jsonl > $K/bench-eager.txt 2>&1
wait $stores
step tests
timeout 560 python3 -m pytest -p no:cacheprovider -v -rA tests/test_gpu.py -k "not tiny and not sd_sampling" \
  --timeout 420 --durations=0 2>&1 | grep -v -E "^(DEBUG|INFO)" > $K/pytest-smollm2.txt
step bench-compiled
eval timeout 300 $SD bench $H -p humaneval --compile on --methods ar,auto,pld,ngram-trie,rest,aded \
  --datastore rest=/tmp/st/sa --datastore aded=/tmp/st/tri --out $K/bench-compiled.jsonl > $K/bench-compiled.txt 2>&1
step bench-draft
eval timeout 200 $SD bench $H -p humaneval --compile on --draft bf16: --methods ar,sd,auto \
  --out $K/bench-draft.jsonl > $K/bench-draft.txt 2>&1
step bench-mtbench
eval timeout 150 $SD bench $H -p mt-bench --compile on --methods ar,auto,pld \
  --out $K/bench-mtbench.jsonl > $K/bench-mtbench.txt 2>&1
step done
