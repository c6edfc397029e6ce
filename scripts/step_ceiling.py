"""Issue 35: a decoding step against the memory-bound ceiling, per weight dtype.

    python scripts/step_ceiling.py --model smollm2-135m --dtypes float32,bfloat16,float16 --rows 1,2,4 --threads 1
    python scripts/step_ceiling.py --model smollm2-135m --dtypes float32,blocks --rows 1,2,4 --threads 1

`blocks`: the float32 model with `--kernels blocks` (the GGUF file's blocks read as stored: their bytes are what
the step reads for the layers that have them).

For each dtype (kernels installed as `specdec` installs them; the 16-bit models wide: runtime/kernels16.py) it
measures the single-thread read bandwidth (a numpy sum over 512 MB, best of five, as scripts/bench_step.sh), then
with 64 tokens cached the forward of ``n`` rows (best of ``--reps``; thread CPU time too, steadier on a shared
machine) and the same step's matrix products alone (every linear layer's kernel on ``n`` rows, back to back, as the
forward streams them). Rows: weights read per step (the linear layers' bytes: the embedding reads one row), the
ceiling (those bytes over the bandwidth), the step, its products and the rest, the step's share of the ceiling.
Markdown table, or JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def read_bandwidth() -> float:
    import numpy as np

    a = np.ones(512 * 1024 * 1024 // 8)
    best = min((lambda t: (a.sum(), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(5))
    return a.nbytes / best / 1e9


def best_of(fn, reps: int) -> tuple[float, float]:
    """(best wall seconds, best thread CPU seconds) of ``fn()``."""
    wall, cpu = float("inf"), float("inf")
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.thread_time() - c0)
    return wall, cpu


def product(layer, n: int):
    """One linear layer's product on ``n`` rows as the step computes it: the 16-bit kernel, or at one thread the GGUF
    blocks' tiles, called directly (the compiled layers of runtime/fused.py call them from inside numba), a float32
    layer through its measured plan."""
    import numpy as np
    import torch

    from specdec_cli.runtime import dot16, kernels16

    x, y = np.zeros((n, layer.in_features), np.float32), np.empty((n, layer.out_features), np.float32)
    found = layer._packed.get("blocks")
    if found is not None:  # a blocks model: the tiles its compiled layers call, at every row count
        from specdec_cli.runtime import tiles

        return lambda: tiles.dot_tiled(x, found[0], y, found[1], True)
    if layer._bits is None:
        x = torch.zeros(1, n, layer.in_features)
        return lambda: layer(x)
    kernel = dot16.KERNELS[kernels16.FORMATS[layer.weight.dtype]]
    block = kernels16.BLOCKED.get(layer.table[n], 2)
    return lambda: kernel(x, layer._bits, y, block)


def measure(model_name: str, dtype: str, rows: list[int], reps: int) -> list[dict]:
    import torch

    from specdec_cli import api
    from specdec_cli.runtime import forward as engine
    from specdec_cli.runtime import kernels

    blocks = dtype == "blocks"
    target, _ = api.load(model_name, dtype="float32" if blocks else dtype, device="cpu",
                         kernel_mode="blocks" if blocks else "auto")
    model = target.model
    linears = [m for m in model.modules() if isinstance(m, kernels.FastLinear)]
    # rows up to runtime/blocks.block_rows() read the blocks
    weight_bytes = sum(m._packed["blocks"][0].nbytes if "blocks" in m._packed
                       else m.weight.numel() * m.weight.element_size() for m in linears)
    cache = engine.new_cache(model)
    engine.forward_chain(model, cache, list(range(100, 164)), keep=0)
    out = []
    for n in rows:
        def step():
            engine.forward_chain(model, cache, [5] * n)
            engine.crop(cache, 64)

        calls = [product(m, n) for m in linears]

        def products():
            with torch.inference_mode(), kernels.active():
                for call in calls:
                    call()

        step()
        products()
        bandwidth = read_bandwidth()
        (s_wall, s_cpu), (p_wall, p_cpu) = best_of(step, reps), best_of(products, reps)
        ceiling = weight_bytes / (bandwidth * 1e9)
        out.append({"model": model_name, "dtype": dtype, "rows": n, "weights_mb": weight_bytes / 1e6,
                    "bandwidth_gbs": bandwidth, "ceiling_ms": 1000 * ceiling, "step_ms": 1000 * s_wall,
                    "step_cpu_ms": 1000 * s_cpu, "products_ms": 1000 * p_wall, "rest_ms": 1000 * (s_wall - p_wall),
                    "products_gbs": weight_bytes / p_wall / 1e9, "share_of_ceiling": ceiling / s_wall})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--rows", default="1,2,4")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    rows = [r for d in args.dtypes.split(",") for r in measure(args.model, d, [int(n) for n in args.rows.split(",")],
                                                                args.reps)]
    if args.json:
        print(json.dumps(rows))
        return
    print("| model | dtype | rows | weights read | bandwidth | ceiling | step (CPU) | products | rest | "
          "products' rate | share of the ceiling |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['dtype']} | {r['rows']} | {r['weights_mb']:.0f} MB | {r['bandwidth_gbs']:.1f} GB/s "
              f"| {r['ceiling_ms']:.1f} ms | {r['step_ms']:.1f} ms ({r['step_cpu_ms']:.1f}) | {r['products_ms']:.1f} ms "
              f"| {r['rest_ms']:.1f} ms | {r['products_gbs']:.1f} GB/s | {100 * r['share_of_ceiling']:.0f}% |")


if __name__ == "__main__":
    main()
