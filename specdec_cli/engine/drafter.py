"""The drafter interface every method implements, and what a generation reports.

A drafter (cf. transformers' ``CandidateGenerator``) has two methods: ``propose`` a draft for the current
sequence, and ``accept`` -- learn from what the target accepted. :mod:`specdec_cli.engine.sequence` runs the
step around them; :mod:`specdec_cli.engine.loop` (one sequence) and :mod:`specdec_cli.engine.batch` (many) drive
sequences through the target's forwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import metrics
from .budget import Budget
from ..config import PAPER_BUDGET
from ..errors import SpecdecError
from ..runtime.cache_mode import CacheMode
from .sampling import SamplingConfig
from .trees import Draft

__all__ = ["Draft", "Outcome", "Drafter", "StepStats", "GenerationResult", "vocab_size", "cut_at_stop", "fit_draft"]


@dataclass
class Outcome:
    """What one verification step decided, handed to ``Drafter.accept``."""

    draft: Draft
    path: list[int]  # accepted draft node indices, root to leaf
    accepted: list[int]  # their tokens
    next_token: int  # token drawn by the target after the accepted ones (correction or bonus)
    logits: torch.Tensor | None = None  # target logits [1 + n, V] of this step (row 0 = root); a greedy batch's
    # rows may hold only their argmaxes instead (runtime/head_screen.GreedyRows): read them with .argmax()


class Drafter:
    """Base drafter: proposes nothing (that is autoregressive decoding).

    ``budget`` decides how much of each draft is verified (``specdec_cli.engine.budget``); model drafters also ask it
    whether one more draft token is worth a draft-model forward. Without one, drafts are verified whole.
    """

    name = "ar"
    _budget: Budget | None = None
    gated_by_budget = True  # False: the budget never skips drafting (the drafter gates its own costly sources)
    calibrated_scores = False  # True: its scores are calibrated acceptance estimates already; the budget keeps them
    probe_prefills = False  # True: a probe after a gated stretch first catches a draft model up on the prompt (a
    # prefill: tens of tokens' time on a long prompt), so the budget does not probe it again at every new prompt
    cache_mode: CacheMode | None = None  # the engine path its budget was priced for (api.make_drafter sets it)

    @property
    def budget(self) -> Budget:
        if self._budget is None:
            self._budget = Budget(PAPER_BUDGET)
        return self._budget

    @budget.setter
    def budget(self, budget: Budget) -> None:
        self._budget = budget

    def start(self, prompt: list[int], cfg: SamplingConfig, generator: torch.Generator | None) -> None:
        """Called once per generation before the first step."""
        self.cfg, self.generator = cfg, generator

    def propose(self, tokens: list[int], max_tokens: int) -> Draft:
        return Draft()

    def accept(self, tokens: list[int], outcome: Outcome) -> None:
        """``tokens`` already include the accepted tokens and the next token."""

    def use_target_cache(self, cache) -> None:
        """Called before ``start`` with the target's KV cache of this generation (it holds ``tokens[:-1]`` between
        steps; ``cache.mode`` is the generation's engine path). Drafters whose draft model is a copy of the target
        read their prefix states from it; draft models follow it onto the target's path."""

    def stats(self) -> dict:
        """Method-specific statistics for the whole generation (merged into the result's stats)."""
        return {}

    def finish(self) -> None:
        """Called once after the last generation: drafters that learn (``aded --save-adapted``) save it now."""

    def state(self) -> dict | None:
        """What this drafter learnt across generations (its budget's state aside), as JSON data -- ``bench``
        checkpoints it after each finished unit so that ``--resume`` continues exactly; None: it learns nothing
        that outlives a generation."""
        return None

    def load_state(self, state: dict | None) -> None:
        """Continue from :meth:`state`'s answer. The data comes from a file: check it (ValueError, KeyError or
        TypeError for data that is not one); it must never be able to do more than cost speed."""


@dataclass
class StepStats:
    drafted: int
    accepted: int
    new_tokens: int
    draft_s: float
    verify_s: float


@dataclass
class GenerationResult:
    prompt_tokens: list[int]
    tokens: list[int]  # generated tokens (stop token excluded)
    steps: list[StepStats]
    prefill_s: float
    total_s: float
    stopped_by: str  # "eos" or "length"
    extra: dict = field(default_factory=dict)

    def summary(self) -> dict:
        n = len(self.tokens)
        steps = len(self.steps)
        drafted = sum(s.drafted for s in self.steps)
        accepted = sum(s.accepted for s in self.steps)
        emitted = sum(s.new_tokens for s in self.steps)
        return {
            "new_tokens": n,
            "prompt_tokens": len(self.prompt_tokens),
            "target_forwards": steps,
            "drafted": drafted,
            "accepted": accepted,
            "acceptance_rate": metrics.acceptance_rate(accepted, drafted),
            "mean_accepted_length": metrics.mean_accepted_length(emitted, steps) or 0.0,
            "redundancy_sigma": metrics.sigma(accepted, drafted),
            "target_utilisation_eta": metrics.eta(steps, emitted),
            "draft_s": sum(s.draft_s for s in self.steps),
            "verify_s": sum(s.verify_s for s in self.steps),
            "prefill_s": self.prefill_s,
            "total_s": self.total_s,
            "tokens_per_s": n / self.total_s if self.total_s > 0 else 0.0,
            "stopped_by": self.stopped_by,
            **self.extra,
        }


def vocab_size(model) -> int:
    """Rows of the input embedding: token ids at or above it are not tokens of this model."""
    try:
        return int(model.get_input_embeddings().num_embeddings)
    except (AttributeError, TypeError, NotImplementedError):
        return int(getattr(getattr(model, "config", None), "vocab_size", None) or 2**62)


def cut_at_stop(tokens: list[int], stop_ids) -> list[int]:
    """Tokens before the first stop token: other engines (transformers, vLLM) keep it in their output and this
    loop does not -- compare like with like."""
    for i, tok in enumerate(tokens):
        if tok in stop_ids:
            return tokens[:i]
    return tokens


def fit_draft(draft: Draft, max_nodes: int | None, vocab: int, name: str) -> Draft:
    """The draft cut to ``max_nodes`` (nodes come after their parents: a prefix is a tree); a token outside the
    vocabulary is a user error."""
    if max_nodes is not None and len(draft) > max_nodes:
        draft = draft.subtree(range(max_nodes))
    if draft.tokens and not 0 <= min(draft.tokens) <= max(draft.tokens) < vocab:
        bad = next(t for t in draft.tokens if not 0 <= t < vocab)
        raise SpecdecError(f"{name}: drafted token id {bad} is outside the model's vocabulary of {vocab} "
                           "(corrupt datastore? check it with `specdec build-datastore --verify --out DIR`)")
    return draft
