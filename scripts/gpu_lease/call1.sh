# Call 1 (carry .whl .gguf/a .gguf/name): the wheels, the model's first part; the tiny-model GPU tests start in a process session
# of their own, so they run on while call 2's part travels. Log: /tmp/keep/tiny.txt (call 2 returns it).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
mkdir -p /tmp/keep && cp .gguf/a .gguf/name /tmp/keep/ || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
rm -rf /tmp/repo && cp -r "$PWD" /tmp/repo && rm -rf /tmp/repo/.gguf /tmp/repo/.whl || exit 1
export PYTHONPATH=/tmp/site:/tmp/repo
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
  python3 -c "import sys,torch,transformers;print(sys.version);print(torch.__version__,transformers.__version__)"; } \
  | tee $OUT/env.txt
cd /tmp/repo || exit 1; setsid nohup python3 -m pytest -p no:cacheprovider -rA tests/test_gpu.py -k "tiny or sd_sampling" \
  --timeout 150 > /tmp/keep/tiny.txt 2>&1 < /dev/null &
echo $! > /tmp/keep/tiny.pid
sleep 1
