"""Values of the command line that need no model and no torch, checked where they enter (before anything loads):
the sampling settings and the draft budget. ``sampling`` and ``budget`` re-export them."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import SpecdecError

HF_BASELINES = {  # transformers' own decoding, as bench baselines

    "hf": "transformers generate(), greedy",
    "hf-assisted": "transformers generate(assistant_model=first --draft)",
    "hf-pld": "transformers generate(prompt_lookup_num_tokens=10)",
    "hf-static": "transformers generate(cache_implementation='static'), compiled by transformers where it compiles",
}
MAX_PROMPT_BYTES = 8 << 20  # no model's context holds more text than this; larger prompts are refused unread


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> "SamplingConfig":
        if not self.temperature >= 0 or self.temperature == float("inf"):  # nan fails the comparison
            raise SpecdecError(f"--temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise SpecdecError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise SpecdecError(f"--top-k must be >= 0, got {self.top_k}")
        return self


def parse_budget(spec: str | int | None) -> str | int:
    """``auto`` (default), ``paper``, or a positive number of draft nodes."""
    if spec is None or spec == "auto":
        return "auto"
    if spec == "paper":
        return "paper"
    try:
        n = int(spec)
    except (TypeError, ValueError):
        raise SpecdecError(f"--budget must be auto, paper or a number of draft tokens, got {spec!r}") from None
    if n < 0:
        raise SpecdecError(f"--budget must be >= 0, got {n}")
    return n


def check_prompt_size(text: str | bytes, what: str = "prompt") -> None:
    """Refuse a prompt too large for any model's context before it is tokenized."""
    if len(text) > MAX_PROMPT_BYTES:
        raise SpecdecError(f"{what} is larger than any model's context could hold (over {MAX_PROMPT_BYTES:,} "
                           "characters); shorten it")
