"""Benchmark configuration, one timed generation, and the record schema (its /1 configs upgraded on reading)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

from ..errors import SpecdecError
from ..config import BudgetSpec, RunSettings, SamplingConfig  # noqa: F401 - SamplingConfig re-exported

HF_PLD_TOKENS = 10
WARMUP_TOKENS = 8
RECORD_SCHEMA = "specdec-bench/2"  # /2: the config holds the run's settings as one object (RunSettings.to_json)
READ_SCHEMAS = ("specdec-bench/1", RECORD_SCHEMA)  # /1: RunSettings' fields flat in the config (read, upgraded)
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
    settings: RunSettings = RunSettings()  # -n, -t, --seed, --window, --budget, --threads: checked when made
    warmup: bool = True
    dtype: str = "auto"
    device: str = "auto"
    datastore: list[str] = field(default_factory=list)  # DIR (every method) or METHOD=DIR, e.g. rest=ds/sa
    options: dict[str, str] = field(default_factory=dict)
    kernels: str = "auto"  # the target's CPU linear kernels: auto (tuned), exact or torch (api.load)
    compile: str = "auto"  # static cache + compiled forwards: auto (on for CUDA), on, off, static (runtime.cache_mode)
    engine: str = "specdec"  # the run's engine and its baseline (bench.engines): specdec (ar) or vllm (vllm)
    vllm: dict = field(default_factory=dict)  # vLLM's placement and proposer settings (bench.engines.vllm_options)

    @property
    def greedy(self) -> bool:
        return self.settings.sampling.greedy

    def to_json(self) -> dict:
        """The record's and the checkpoint's ``config`` (:data:`RECORD_SCHEMA`)."""
        return {**asdict(self), "settings": self.settings.to_json()}


V1_SETTINGS = ("max_new_tokens", "temperature", "seed", "window", "budget", "threads")  # flat in a /1 config


def upgraded_config(config: dict) -> dict:
    """A record's or checkpoint's ``config`` in the current shape: a /1 config (``specdec-bench/1``: the run's
    settings flat beside the other fields, the budget as typed on the command line) gets them as ``settings``,
    the budget in its one spelling; a current config comes back as it is."""
    if not isinstance(config, dict) or "settings" in config:
        return config
    default = RunSettings().to_json()
    flat = {k: v for k, v in config.items() if k not in V1_SETTINGS}
    settings = {k: config.get(k, default[k]) for k in V1_SETTINGS if k != "temperature"}
    settings["sampling"] = {**default["sampling"], "temperature": config.get("temperature", 0.0)}  # bench: no top-p/k
    try:
        settings["budget"] = BudgetSpec.parse(settings["budget"]).to_json()  # "8" as typed then, 8 now
    except SpecdecError:  # a damaged value stays as it was: compared, never used
        pass
    return {**flat, "settings": {k: settings[k] for k in default}}


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
