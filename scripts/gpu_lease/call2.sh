# Call 2 (carry .gguf/b): the model's second part; SmolLM2's GPU tests, then the compiled bench. Cold, one model's
# 8 buckets compile in about two minutes on the H200 machine (docs/gpu.md, third run): give the tests room.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/site:/tmp/repo
W=/tmp/keep/$(cat /tmp/keep/name)
cat /tmp/keep/a .gguf/b > $W && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/site $W || exit 1
cd /tmp/repo; SD="python3 -c 'import sys; from specdec_cli.cli import main; sys.exit(main())'"; set -o pipefail
( mkdir -p /tmp/st; eval $SD build-datastore --corpus python-stdlib --max-tokens 3000000 --out /tmp/st/sa -q
  eval $SD build-datastore --corpus python-stdlib --max-tokens 3000000 --kind trigram --out /tmp/st/tri -q
) > /tmp/keep/stores.txt 2>&1 &
timeout ${TESTS_S:-420} python3 -m pytest -p no:cacheprovider -v -rA tests/test_gpu.py -k "not tiny and not sd_sampling" \
  --timeout 400 --durations=0 2>&1 | grep -v -E "^(DEBUG|INFO)" | tee $OUT/pytest-smollm2.txt | grep -E "PASS|FAIL|ERR|passed"
cp /tmp/keep/tiny.txt $OUT/pytest-tiny.txt; wait
timeout ${BENCH_S:-150} bash -c "$SD bench -m smollm2-135m -p humaneval --limit 4 -n 128 --dtype float32 --compile on \
  --methods ar,auto,pld,ngram-trie,rest,aded --datastore rest=/tmp/st/sa --datastore aded=/tmp/st/tri \
  --out $OUT/bench-compiled.jsonl" 2>&1 | tail -14
