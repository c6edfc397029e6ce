"""One prompt prefill (``keep=0``: no logits) of ``--tokens`` random tokens, timed and split (docs/profiling.md,
"16-bit prefills"): process CPU seconds (the least of ``--reps``: robust to another process on the core), and one
profiled prefill split into MKL products (``aten::mm``), SDPA attention and the rest (the 16-bit register tiles
are numba code, not profiler ops: they fall into the rest).

    PYTHONPATH=CHECKOUT python scripts/profile_prefill.py --model smollm2-135m --dtype bfloat16 --tokens 780

Output: one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tokens", type=int, default=780)  # SmolLM2's rag prompts: about 780 tokens each
    ap.add_argument("--reps", type=int, default=4)
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    from specdec_cli.io.models import load_model
    from specdec_cli.runtime import forward as engine
    from specdec_cli.runtime import kernels

    model = load_model(args.model, dtype=args.dtype, device="cpu").model
    kernels.install(model)
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (args.tokens,), generator=torch.Generator().manual_seed(0)).tolist()

    def prefill() -> tuple[float, float]:
        cache = engine.new_cache(model, args.tokens + 80)
        c0, w0 = time.process_time(), time.perf_counter()
        engine.forward_chain(model, cache, ids, keep=0)
        return time.process_time() - c0, time.perf_counter() - w0

    cpu = [prefill()[0] for _ in range(args.reps)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _, wall = prefill()
    split = {"attention": 0.0, "mkl_products": 0.0}
    for e in prof.key_averages():
        if "scaled_dot_product" in e.key:
            split["attention"] += e.self_cpu_time_total / 1e6
        elif e.key in ("aten::mm", "aten::addmm"):
            split["mkl_products"] += e.self_cpu_time_total / 1e6
    print(json.dumps({"model": args.model, "dtype": args.dtype, "tokens": args.tokens,
                      "cpu_s_min": round(min(cpu), 3), "profiled_wall_s": round(wall, 3),
                      **{k: round(v, 3) for k, v in split.items()},
                      "rest_s": round(wall - sum(split.values()), 3)}))


if __name__ == "__main__":
    main()
