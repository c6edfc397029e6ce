# Call 2 (carry .gguf/b): the model's second part, installed; then run.sh in a process session of its own, and the
# first collect (the call's 10-minute limit leaves run.sh running; the next call collects the rest).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/site:/tmp/repo
W=/tmp/keep/$(cat /tmp/keep/name)
cat /tmp/keep/a .gguf/b > $W && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/site $W || exit 1
rm -f /tmp/keep/steps.txt  # a machine used before: collect.sh must not read an old "done"
setsid nohup bash /tmp/repo/scripts/gpu_lease/run.sh > /tmp/keep/run.txt 2>&1 < /dev/null &
echo $! > /tmp/keep/run.pid
bash scripts/gpu_lease/collect.sh $(( ${WAIT_S:-570} - SECONDS ))  # the transfer and install count: 30 s left to pack
