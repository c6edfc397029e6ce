# Call 3 (on the same warm machine): eager beside compiled, then what has not been measured on a GPU yet.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/site:/tmp/repo
cd /tmp/repo; SD="python3 -c 'import sys; from specdec_cli.cli import main; sys.exit(main())'"
H="-m smollm2-135m --limit 4 -n 128"
eval timeout 110 $SD bench $H -p humaneval --dtype float32 --compile off --methods ar,auto,pld,rest,hf,hf-pld \
  --datastore rest=/tmp/st/sa --out $OUT/bench-eager.jsonl 2>&1 | tail -12
eval timeout 240 $SD bench $H -p humaneval --dtype float32 --compile on --draft bf16: --methods ar,sd,auto \
  --out $OUT/bench-draft-compiled.jsonl 2>&1 | tail -8
eval timeout 200 $SD bench $H -p mt-bench --dtype float32 --compile on --methods ar,auto,pld \
  --out $OUT/bench-mtbench-compiled.jsonl 2>&1 | tail -8
