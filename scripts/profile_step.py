"""Step-time breakdown of the target forward pass (docs/profiling.md): where a decoding step's time goes.

    python scripts/profile_step.py --model gemma3-270m --context 600 --tokens 1,2,4,8 --threads 1 --kernels torch
    python scripts/profile_step.py --model gemma3-270m --context 600 --tokens 1,2,4,8 --threads 1 --kernels auto

For each forward size ``n`` (the root plus ``n - 1`` draft tokens, a chain) after ``--context`` cached tokens, it
times the forward (median of ``--reps``) and attributes its CPU time with ``torch.profiler`` to: the LM head, the
other linear layers, the KV-cache append (``aten::cat`` in transformers' ``DynamicCache``; absent with ours),
attention, Python time between the ops (transformers' module calls), and the other ops (norms, activations,
rotary embeddings). It also times the prefill of the context: with all logits (what the engine did
before) and with none (what it does now). ``--cache dynamic`` uses transformers' ``DynamicLayer`` (``DynamicCache``'s) instead of
:mod:`specdec_cli.runtime.kvcache`. ``--path module`` runs transformers' module code instead of the engine's lean
forward (:mod:`specdec_cli.runtime.decoder`); the numba ``dot`` kernel's calls count as linear. Output: a Markdown
table, or JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
DOT = "specdec::dot"  # the numba kernel's calls, marked for the profiler by this script only


def mark_dot_kernel(kernels, record_function) -> None:
    """Wrap the numba ``dot`` strategy in a profiler range (it is no aten op, so its time would count as Python)."""
    plain = kernels._dot

    def marked(x2, w_np):
        with record_function(DOT):
            return plain(x2, w_np)

    kernels._dot = marked


def time_lm_head(model, decoder, head_ms: dict) -> None:
    """Time the LM head however it is called: module hooks (transformers' path) and the lean path's handle."""
    head = model.get_output_embeddings()
    head.register_forward_pre_hook(lambda m, i: head_ms.__setitem__(-1, time.perf_counter()))
    head.register_forward_hook(lambda m, i, o: head_ms.__setitem__(
        0, head_ms.get(0, 0.0) + (time.perf_counter() - head_ms.pop(-1)) * 1000))
    dec = decoder.decoder_for(model)
    if dec is not None:
        plain = dec.lm_head

        def timed(x):
            t0 = time.perf_counter()
            out = plain(x)
            head_ms[0] = head_ms.get(0, 0.0) + (time.perf_counter() - t0) * 1000
            return out

        dec.lm_head = timed


def categorize(profile) -> dict[str, float]:
    """Self CPU milliseconds per category, from ``key_averages`` (per forward)."""
    out = {"linear": 0.0, "kv_append": 0.0, "attention": 0.0, "python": 0.0, "other": 0.0}
    for ev in profile.key_averages():
        ms = ev.self_cpu_time_total / 1000.0
        name = ev.key
        products = ("aten::mm", "aten::addmm", "aten::mkldnn_linear", "mkldnn::_linear_pointwise", "aten::bmm", DOT)
        if name in products and "attention" not in name:
            out["linear"] += ms
        elif name == "aten::cat":
            out["kv_append"] += ms
        elif "scaled_dot_product" in name or "attention" in name:
            out["attention"] += ms
        elif name == "step":  # the record_function around the forward: time in Python between the ops
            out["python"] += ms
        else:
            out["other"] += ms
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--context", type=int, default=600)
    ap.add_argument("--tokens", default="1,2,4,8")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kernels", choices=("auto", "torch"), default="auto")
    ap.add_argument("--cache", choices=("growing", "dynamic"), default="growing")
    ap.add_argument("--path", choices=("lean", "module"), default="lean",
                    help="lean: runtime/decoder.py's forward (the engine's); module: transformers' module code")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    from transformers.cache_utils import DynamicLayer

    torch.set_num_threads(args.threads)
    from specdec_cli.runtime import forward as engine
    from specdec_cli.runtime.kvcache import GrowingCache
    from specdec_cli.runtime import decoder, kernels
    from specdec_cli.io.models import load_model

    target = load_model(args.model, dtype="float32", device="cpu")
    model = target.model
    if args.kernels == "auto":
        kernels.install(model)
    if args.cache == "dynamic":  # transformers' cache layers: the lean path does not take them
        args.path = "module"
    if args.path == "module":
        decoder.disable(model)
    mark_dot_kernel(kernels, record_function)
    vocab = model.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, vocab, (args.context + 80,), generator=gen).tolist()

    def new_cache():
        if args.cache == "dynamic":  # transformers' DynamicLayer (a DynamicCache's), behind the engine's interface
            return GrowingCache(layer_class_to_replicate=DynamicLayer)
        return engine.new_cache(model, args.context + 80)

    rows = []
    # prefill: all logits (the old engine) vs none (now)
    for keep, label in ((None, "prefill, all logits"), (0, "prefill, no logits")):
        times = []
        for _ in range(2):
            cache = new_cache()
            t0 = time.perf_counter()
            engine.forward_chain(model, cache, ctx[: args.context], keep=keep)
            times.append(time.perf_counter() - t0)
        rows.append({"step": label, "ms": 1000 * min(times)})

    cache = new_cache()
    engine.forward_chain(model, cache, ctx[: args.context - 1], keep=0)
    base = engine.cache_len(cache)
    head_ms: dict[int, float] = {}
    time_lm_head(model, decoder, head_ms)
    for n in [int(x) for x in args.tokens.split(",")]:
        tokens = ctx[args.context - 1: args.context - 1 + n]

        def step():
            engine.forward_chain(model, cache, tokens)
            engine.crop(cache, base)

        step()
        wall = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            step()
            wall.append(time.perf_counter() - t0)
        head_ms.clear()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            with record_function("step"):
                step()
        cats = categorize(prof)
        lm = head_ms.get(0, 0.0)
        cats["linear"] = max(cats["linear"] - lm, 0.0)
        rows.append({"step": f"forward n={n}", "ms": 1000 * statistics.median(wall), "lm_head": lm, **cats})

    if args.json:
        print(json.dumps({"model": args.model, "context": args.context, "threads": args.threads,
                          "kernels": args.kernels, "cache": args.cache, "path": args.path, "rows": rows}))
        return
    print(f"{args.model}, context {args.context}, {args.threads} thread(s), kernels={args.kernels}, cache={args.cache}, "
          f"path={args.path}\n")
    print("| step | wall ms | LM head | other linear | KV append | attention | Python | other ops |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "lm_head" not in r:
            print(f"| {r['step']} | {r['ms']:.0f} | | | | | | |")
        else:
            keys = ("lm_head", "linear", "kv_append", "attention", "python", "other")
            total = sum(r[k] for k in keys) or 1.0
            cells = [f"{r[k]:.1f} ({100 * r[k] / total:.0f}%)" for k in keys]
            print(f"| {r['step']} | {r['ms']:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
