"""Methods of several engines in one ``bench`` run: labels, vLLM's runners (latency mode) and rows (throughput).

``--engine`` names the engine of the run and of its baseline (``ar`` on specdec's own engine, ``vllm`` on vLLM);
a method name runs on that engine when it has it, else on the one engine that does, and ``NAME@ENGINE`` picks
explicitly: ``--engine vllm --methods vllm,vllm-suffix,auto,ar,auto@specdec`` holds vLLM's plain decoding, its
SuffixDecoding drafter and specdec's proposer on vLLM, and specdec's own ``ar`` and ``auto``, in one table. A
result's ``method`` is the label (the bare name unless the run's engine would take it elsewhere) and its
``engine`` says where it ran.
"""

from __future__ import annotations

import sys
import time

from .labels import BASELINES, engine_of, label_of, method_list, split_label  # noqa: F401 - re-exported
from .config import Generation, Runner

def vllm_options(cfg, batch: int = 1, kv_tokens: int | None = None):
    """The :class:`~specdec_cli.serving.vllm_engine.EngineOptions` of a bench run."""
    from ..serving.vllm_engine import EngineOptions

    v = cfg.vllm
    s = cfg.settings
    return EngineOptions(dtype=cfg.dtype, threads=s.threads, tensor_parallel_size=v.get("tensor_parallel_size", 1),
                         pipeline_parallel_size=v.get("pipeline_parallel_size", 1), executor=v.get("executor"),
                         window=s.window, max_num_seqs=batch, seed=s.seed, extra=dict(v.get("args") or {}),
                         drafter=v.get("drafter") or {}, kv_tokens=kv_tokens)


def start_engine(name: str, target, opts, log=None):
    """A started :class:`~specdec_cli.serving.vllm_engine.VllmEngine` for method ``name`` (one to three
    minutes: vLLM loads and compiles the model; its compile cache makes later starts shorter)."""
    from ..serving.vllm_engine import VllmEngine

    (log or note)(f"starting vLLM with {name} (1-3 min) ...")
    t0 = time.perf_counter()
    engine = VllmEngine(name, target.info["source"], target, opts)
    engine.start()
    (log or note)(f"vLLM with {name} ready in {time.perf_counter() - t0:.0f} s")
    return engine


def note(text: str) -> None:
    sys.stderr.write(f"bench: {text}\n")
    sys.stderr.flush()


def proposer_delta(engine) -> dict | None:
    """specdec's proposer statistics since the last call (auto on vLLM), per-source rows as bench sums them."""
    stats = engine.stats(reset=True) if engine.method == "auto" else None
    if stats is not None:
        for row in stats["sources"].values():
            row.pop("draft_ms_per_step", None)  # a ratio: recomputed from the sums
    return stats


def vllm_runner(label: str, name: str, target, cfg, engine) -> Runner:
    """A latency-mode runner: one prompt at a time on a started engine (after the warm-up its prefix cache is
    reset, so no timed prompt finds its prefill done, and auto's proposer forgets what the warm-up taught it)."""

    def run(ids: list[int], max_new_tokens: int) -> Generation:
        proposer_delta(engine)
        result = engine.generate([ids], max_new_tokens, cfg.settings.sampling)[0]
        stats = proposer_delta(engine)
        return Generation(label, "", 0, result.tokens, result.seconds, forwards=result.forwards,
                          emitted=result.emitted, drafted=stats["verified"] if stats else None,
                          accepted=result.emitted - result.forwards, draft_s=stats["draft_s"] if stats else None,
                          sources=stats["sources"] if stats else None)

    run.state = lambda: None  # vLLM's state lives in its processes: a resumed run starts them afresh
    run.load_state = lambda state: None
    run.engine = engine
    run.before_warmup = engine.mark
    run.after_warmup = lambda: (engine.mark(back=True), engine.reset_prefix_cache())  # nothing learnt, nothing cached
    return run


def start_vllm_engines(cfg, target, batch: int = 1, kv_tokens: int | None = None) -> dict:
    """One started engine per vLLM method of the run, keyed by label, all alive at once: the latency mode's
    methods stay interleaved per prompt (the throughput mode starts one at a time: ``bench.throughput``)."""
    engines = {}
    try:
        for label in cfg.methods:
            name, engine = split_label(label, cfg.engine)
            if engine == "vllm":
                engines[label] = start_engine(name, target, vllm_options(cfg, batch, kv_tokens))
    except BaseException:
        close_engines(engines)
        raise
    return engines


def close_engines(engines: dict) -> None:
    for engine in engines.values():
        engine.close()


def vllm_rss_mib(engine) -> float | None:
    """Resident memory of the engine's processes (vLLM runs the model in child processes of this one)."""
    try:
        import psutil
    except ImportError:
        return None
    total = 0
    for child in psutil.Process().children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20 if total else None
