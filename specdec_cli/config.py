"""The typed values a run is made of, checked once where they enter (the command line or the library API) and
passed down as these objects: nothing below re-checks them. Torch-free, so that a bad value is refused before
torch or a model loads.

* :class:`SamplingConfig` -- temperature, top-p, top-k;
* :class:`BudgetSpec` -- ``--budget``: adaptive (``auto``), the papers' settings (``paper``) or a node limit;
* :class:`RunSettings` -- everything a generation is asked for: new tokens, sampling, seed, draft window, budget,
  threads, and how many sequences decode together (``--batch-size``);
* :class:`BatchSizes` -- bench's ``--batch-size 1,4,8``: the batch sizes of a throughput run;
* the engines (``--engine``) and vLLM's methods (bench's outside baselines: :mod:`specdec_cli.bench.baselines`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from .errors import SpecdecError

ENGINES = {  # --engine: where the target runs
    "specdec": "specdec's own engine (PyTorch + transformers): every method",
    "vllm": "vLLM (the extra: bash scripts/install-vllm.sh): its plain decoding, its drafters, specdec's proposer",
}
VLLM_METHODS = {  # methods on --engine vllm (specdec_cli.serving.vllm_engine)
    "vllm": "vLLM, plain decoding",
    "vllm-ngram": "vLLM's n-gram drafter (prompt lookup: 5 tokens after a 4-gram match, its documented setting)",
    "vllm-suffix": "vLLM's SuffixDecoding drafter (arctic-inference; up to 24 tokens, vLLM's default)",
    "auto": "specdec's proposer on vLLM: this request's context, the memory of earlier outputs, every --datastore; "
            "one chain per sequence, sized by what pays",
}
MAX_PROMPT_BYTES = 8 << 20  # no model's context holds more text than this; larger prompts are refused unread
MAX_BATCH_FILE_BYTES = 8 << 20  # a --batch-file (or stdin) of prompts: a path is read no further than this either
MAX_BATCH_SIZE = 256  # --batch-size: each slot holds its own drafter and cache row; batching gains flatten far below
MAX_MEMORY_TOKENS = 1 << 24  # auto's --opt memory_tokens: ~200 bytes a token indexed, about 3.4 GB at this bound


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0 or self.temperature == float("inf"):  # nan fails the comparison
            raise SpecdecError(f"--temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise SpecdecError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise SpecdecError(f"--top-k must be >= 0, got {self.top_k}")


@dataclass(frozen=True)
class BudgetSpec:
    """``--budget``, parsed once (:meth:`parse`): adaptive (``auto``: verify what pays on this machine), the
    papers' settings (``paper``: each drafter's own configuration, verified whole), or a ``limit`` of draft nodes
    (the ``limit`` most likely accepted; 0: no drafting). ``str()`` gives the flag's spelling and :meth:`to_json`
    the value records and checkpoints hold (``"auto"``, ``"paper"`` or the integer), which :meth:`parse` reads
    back."""

    limit: int | None = None  # a node limit; None: auto or paper
    paper: bool = False

    def __post_init__(self) -> None:
        if self.limit is not None and (self.paper or isinstance(self.limit, bool) or not isinstance(self.limit, int)
                                       or self.limit < 0):
            raise SpecdecError(f"--budget must be auto, paper or a number of draft tokens >= 0, got {self.limit!r}")

    @property
    def adaptive(self) -> bool:
        return self.limit is None and not self.paper

    @classmethod
    def parse(cls, spec: "BudgetSpec | str | int | None") -> "BudgetSpec":
        """``auto`` (also None: the default), ``paper``, or a number of draft nodes >= 0 (an int or its digits)."""
        if isinstance(spec, cls):
            return spec
        if spec is None or spec == "auto":
            return cls()
        if spec == "paper":
            return cls(paper=True)
        try:
            n = int(spec)
            if isinstance(spec, float) and n != spec:
                raise ValueError  # 8.7 is no number of draft tokens (a record or a library caller may hold one)
        except (TypeError, ValueError, OverflowError):  # OverflowError: JSON's 1e400 is an infinite float
            raise SpecdecError(f"--budget must be auto, paper or a number of draft tokens, got {spec!r}") from None
        if n < 0:
            raise SpecdecError(f"--budget must be >= 0, got {n}")
        return cls(limit=n)

    def to_json(self) -> str | int:
        return "paper" if self.paper else "auto" if self.limit is None else self.limit

    def __str__(self) -> str:
        return str(self.to_json())


AUTO_BUDGET, PAPER_BUDGET = BudgetSpec(), BudgetSpec(paper=True)


def positive(value: int | None, flag: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise SpecdecError(f"{flag} must be >= 1, got {value}")


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def check_threads(threads: int | None) -> None:
    """``--threads``: from 1 to the CPUs this process may use (more only slows torch down, and every kernel plan
    and forward-time profile would be measured again for a thread count that is never right)."""
    positive(threads, "--threads")
    if threads is not None and threads > cpu_count():
        raise SpecdecError(f"--threads must be at most {cpu_count()} (the CPUs this process may use), got {threads}")


# --dtype besides auto -> torch's name of the type (io.models.DTYPES maps them to torch dtypes, vLLM takes the names)
DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
               "float16": "float16", "fp16": "float16"}
KERNEL_MODES = ("auto", "exact", "blocks", "torch")  # --kernels: api.load


def check_dtype(dtype: str) -> None:
    """``--dtype`` (the one check of it: :func:`check_placement` and :func:`io.models.resolve_dtype` call it)."""
    if dtype != "auto" and dtype not in DTYPE_NAMES:
        raise SpecdecError(f"unknown --dtype {dtype!r}; choose auto, {', '.join(DTYPE_NAMES)}")


def check_placement(dtype: str, kernels: str) -> None:
    """``--dtype`` and ``--kernels``, checked before torch is imported (an error in well under a second, not after
    the prompts and the tokenizer): the one check of each, as :func:`api.load` calls it too."""
    check_dtype(dtype)
    if kernels not in KERNEL_MODES:
        raise SpecdecError(f"--kernels must be {', '.join(KERNEL_MODES[:-1])} or {KERNEL_MODES[-1]}, got {kernels!r}")
    if kernels == "blocks" and dtype not in ("auto", "float32", "fp32"):
        raise SpecdecError("--kernels blocks reads a GGUF's blocks into the float32 model: leave --dtype at float32")


def check_batch_size(size: int, flag: str = "--batch-size") -> int:
    """A batch size from 1 to :data:`MAX_BATCH_SIZE` (the one check, for :class:`RunSettings` and
    :class:`BatchSizes`)."""
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_BATCH_SIZE:
        raise SpecdecError(f"{flag} must be from 1 to {MAX_BATCH_SIZE}, got {size}")
    return size


@dataclass(frozen=True)
class BatchSizes:
    """``bench --batch-size 1,4,8``, parsed once (:meth:`parse`): the throughput mode's batch sizes, each checked,
    in the order given, without repeats. Each size reaches the step as a :class:`RunSettings`' ``batch_size``."""

    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        for size in self.sizes:
            check_batch_size(size)

    @classmethod
    def parse(cls, text: str) -> "BatchSizes":
        sizes = []
        for item in text.split(","):
            try:
                sizes.append(int(item.strip()))
            except ValueError:
                raise SpecdecError(f"--batch-size takes positive integers separated by commas, got {text[:40]!r}"
                                   ) from None
        return cls(tuple(dict.fromkeys(sizes)))

    def fitted(self, prompts: int) -> "BatchSizes":
        """The sizes with at most one slot per prompt (repeats made by the cut dropped)."""
        return BatchSizes(tuple(dict.fromkeys(min(size, prompts) for size in self.sizes)))

    def __iter__(self):
        return iter(self.sizes)


@dataclass(frozen=True)
class RunSettings:
    """What a generation is asked for, checked when made (a :class:`SpecdecError` names the flag)."""

    max_new_tokens: int = 128
    sampling: SamplingConfig = SamplingConfig()
    seed: int = 0
    window: int | None = None  # draft window K; None: the method's default
    budget: BudgetSpec = AUTO_BUDGET  # --budget; given as "auto", "paper" or a node count, parsed here
    threads: int | None = None  # torch CPU threads; None: torch's choice
    batch_size: int = 1  # --batch-size: sequences decoded together (api.make_drafters makes one slot each)

    def __post_init__(self) -> None:
        positive(self.max_new_tokens, "--max-new-tokens")
        positive(self.window, "--window")
        check_threads(self.threads)
        check_batch_size(self.batch_size)
        object.__setattr__(self, "budget", BudgetSpec.parse(self.budget))

    def to_json(self) -> dict:
        """As bench records and checkpoints hold it: ``sampling`` a nested object, the budget as its spelling
        (``"auto"``, ``"paper"`` or the integer). The batch size is not a record's setting: the latency mode
        decodes one sequence at a time and a throughput record lists its ``batch_sizes``."""
        out = {**asdict(self), "budget": self.budget.to_json()}
        del out["batch_size"]
        return out


def check_prompt_size(text: str | bytes, what: str = "prompt") -> None:
    """Refuse a prompt too large for any model's context before it is tokenized."""
    if len(text) > MAX_PROMPT_BYTES:
        raise SpecdecError(f"{what} is larger than any model's context could hold (over {MAX_PROMPT_BYTES:,} "
                           "characters); shorten it")
