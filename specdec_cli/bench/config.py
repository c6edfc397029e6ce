"""Benchmark configuration, one timed generation, and the method list."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

from ..config import HF_BASELINES, LLAMA_CPP_METHODS, RunSettings, SamplingConfig  # noqa: F401 - re-exported

HF_PLD_TOKENS = 10
WARMUP_TOKENS = 8
RECORD_SCHEMA = "specdec-bench/1"
REGRESSION_EXIT_CODE = 3


@dataclass
class BenchConfig:
    model: str = "smollm2-135m"
    drafts: list[str] = field(default_factory=list)
    methods: list[str] = field(default_factory=lambda: ["ar"])
    prompts: str = "mt-bench"
    limit: int | None = None
    offset: int = 0
    category: str | None = None
    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    warmup: bool = True
    dtype: str = "auto"
    device: str = "auto"
    datastore: list[str] = field(default_factory=list)  # DIR (every method) or METHOD=DIR, e.g. rest=ds/sa
    window: int | None = None
    options: dict[str, str] = field(default_factory=dict)
    threads: int | None = None  # torch.set_num_threads; 1 is far steadier on a busy CPU
    budget: str = "auto"  # draft budget of our methods: auto, paper or a node count (specdec_cli.engine.budget)
    kernels: str = "auto"  # the target's CPU linear kernels: auto (tuned) or torch
    compile: str = "auto"  # static cache + compiled forwards: auto (on for CUDA), on, off, static (runtime.cache_mode)
    engine: str = "specdec"  # the run's engine and its baseline (bench.engines): specdec (ar) or vllm (vllm)
    vllm: dict = field(default_factory=dict)  # vLLM's placement and proposer settings (bench.engines.vllm_options)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @cached_property
    def settings(self) -> RunSettings:
        """The run's values as one checked object (made once, on first use)."""
        return RunSettings(self.max_new_tokens, SamplingConfig(self.temperature), self.seed, self.window,
                           self.budget, self.threads)


@dataclass
class Generation:
    """One timed generation of one turn of one prompt by one method.

    ``forwards``/``emitted`` count target forwards and tokens they produced (stop token included); ``drafted``,
    ``accepted`` and ``draft_s`` are None where a method cannot report them (transformers' generate).
    """

    method: str
    prompt_id: str
    turn: int
    tokens: list[int]
    seconds: float
    forwards: int | None = None
    emitted: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    draft_s: float | None = None
    sources: dict | None = None  # auto: per draft source, nodes verified and accepted (methods.auto)
    prefill_s: float | None = None  # the prompt's evaluation (ours: no logits; llama.cpp: to its first token)


Runner = Callable[[list[int], int], Generation]


def method_list(methods: list[str], engine: str = "specdec") -> list[str]:
    """Validated method labels, the run's baseline first (``ar``, or ``vllm`` on ``--engine vllm``; added when
    missing: speedups and the identity check need it). ``NAME@ENGINE`` picks an engine (bench.engines)."""
    from ..methods import method_list as labels

    return labels(methods, engine)


