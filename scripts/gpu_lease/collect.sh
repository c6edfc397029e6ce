# Every call after call 1: wait up to $1 seconds for run.sh, then return what it has written so far (8 files at most).
K=/tmp/keep; end=$((SECONDS + ${1:-500}))
while [ $SECONDS -lt $end ] && ! grep -q "done" $K/steps.txt 2>/dev/null && kill -0 "$(cat $K/run.pid)" 2>/dev/null
do sleep 5; done  # until run.sh ends (done, or died) or the seconds given pass
cat $K/steps.txt; tail -3 $K/tiny.txt 2>/dev/null
cd $K && tar czf $OUT/logs.tgz *.txt 2>/dev/null; cp *.jsonl $OUT/ 2>/dev/null
for f in bench-*.txt; do echo "--- $f"; tail -14 $f; done; grep -E "PASSED|FAILED|ERROR|passed|failed" pytest-smollm2.txt 2>/dev/null | tail -16
