"""One drafter object serving many sequences: what both decoding loops ask for drafts.

Like llama.cpp's ``common_speculative``, vLLM's suffix proposer and specdec's own vLLM proposer
(:class:`specdec_cli.serving.chains.ChainDrafter`): one object, per-sequence state keyed by the sequence's id, what
the method learns about the run held once, and one life cycle for one sequence (:mod:`specdec_cli.engine.loop`)
and many (:mod:`specdec_cli.engine.batch`):

    drafters.open(rows)                                       # a run of up to ``rows`` sequences at once
    drafters.begin(seq, prompt, sampling, generator, cache)   # a new sequence takes an idle slot
    draft = drafters.propose(seq, tokens, max_tokens)         # priced by drafters.budget(seq)
    drafters.accept(seq, tokens, outcome)
    drafters.end(seq)                                         # finished: its slot is idle again
    drafters.finish()                                         # after the last run: what is learnt is saved

A *slot* is a method's :class:`~specdec_cli.engine.drafter.Drafter` holding one sequence's state at a time: its
budget (what it learnt carries over to the next sequence of the slot, as it does one sequence at a time), its
sources' per-sequence parts (the request's context index, a draft model's cache and chain). The slots are made
once (:func:`specdec_cli.api.make_drafters`) and hold the run-wide parts once: ``auto``'s memory of outputs and
its calibration, ``aded``'s adapted matrix, the opened datastores (``MethodContext.held_once``).
"""

from __future__ import annotations

from typing import Iterator

from .drafter import Draft, Drafter, Outcome
from .budget import Budget
from .sampling import SamplingConfig


class Drafters:
    """The drafter of a run: ``slots`` (one per sequence decoded at once), sequences keyed by id."""

    def __init__(self, slots: list[Drafter]):
        if not slots:
            raise ValueError("a run needs one drafter slot at least")
        self.slots = list(slots)
        self.idle: list[Drafter] = list(self.slots)
        self.live: dict[int, Drafter] = {}

    @classmethod
    def of(cls, drafters: "Drafters | list[Drafter] | Drafter") -> "Drafters":
        """``drafters`` as a :class:`Drafters`: one drafter is a run of one slot, any other iterable one slot each."""
        if isinstance(drafters, Drafters):
            return drafters
        if hasattr(drafters, "propose"):  # one drafter (a Drafter, or any object with its two methods)
            return cls([drafters])
        slots = list(drafters)
        if not all(hasattr(d, "propose") for d in slots):
            raise TypeError(f"not drafters: {[type(d).__name__ for d in slots if not hasattr(d, 'propose')]}")
        return cls(slots)

    # -- the run ------------------------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.slots[0].name

    @property
    def cache_mode(self):
        """The engine path the slots' budgets were priced for (None: made outside ``api.make_drafter``)."""
        return self.slots[0].cache_mode

    def open(self, rows: int) -> None:
        """A run decoding up to ``rows`` sequences at once: the first ``rows`` slots, idle, in order (the slot a
        sequence takes is the one idle longest, so a run's assignment does not depend on an earlier run's). The
        sequences of a run that did not end (an error, a ctrl-c) are forgotten: so a run must not open the
        object another run is still using (no ``api.run`` with a batch's drafters from its ``on_result``)."""
        self.live.clear()
        self.idle = self.slots[:max(1, min(rows, len(self.slots)))]

    def state(self) -> list[dict]:
        """What each slot learnt, its budget's calibration included, as JSON data (``bench`` checkpoints it after
        each unit, and restores it after its warm-up)."""
        return [{"budget": slot.budget.state(), "drafter": slot.state()} for slot in self.slots]

    def load_state(self, state: list[dict]) -> None:
        """Continue from :meth:`state`'s answer, slot by slot."""
        for slot, learnt in zip(self.slots, state, strict=True):
            slot.budget.load_state(learnt["budget"])
            slot.load_state(learnt["drafter"])

    def finish(self) -> None:
        """After the last run: every slot's ``finish``, the first last (it saves the run-wide parts it owns, auto's
        ``--memory``, after the others have added to them)."""
        for slot in reversed(self.slots):
            slot.finish()

    # -- one sequence -------------------------------------------------------------------------------------------

    def begin(self, seq: int, prompt: list[int], sampling: SamplingConfig, generator, cache, price=None) -> None:
        """Sequence ``seq`` starts in the idle slot that waited longest. ``cache``: the target's cache of it (a
        drafter whose draft model is a copy of the target reads it); ``price``: what a forward costs this
        sequence (a batch row's share), None: the slot's own profile."""
        if seq in self.live:
            raise ValueError(f"sequence {seq} is already live")
        if not self.idle:
            raise ValueError(f"no idle drafter slot for sequence {seq} ({len(self.slots)} slots, all live)")
        slot = self.live[seq] = self.idle.pop(0)
        try:
            if price is not None:
                slot.budget.profile = price
            slot.budget.start(sampled=not sampling.greedy)
            slot.use_target_cache(cache)
            slot.start(list(prompt), sampling, generator)
        except BaseException:  # the sequence never began: its slot is idle again, first in line
            del self.live[seq]
            self.idle.insert(0, slot)
            raise

    def budget(self, seq: int) -> Budget:
        return self.live[seq].budget

    def propose(self, seq: int, tokens: list[int], max_tokens: int) -> Draft:
        return self.live[seq].propose(tokens, max_tokens)

    def accept(self, seq: int, tokens: list[int], outcome: Outcome) -> None:
        self.live[seq].accept(tokens, outcome)

    def stats(self, seq: int) -> dict:
        """The sequence's method and budget statistics (its generation's result reports them)."""
        slot = self.live[seq]
        return {**slot.stats(), **slot.budget.stats()}

    def end(self, seq: int) -> None:
        """Sequence ``seq`` finished: its slot is idle again (after the slots idle longer)."""
        self.idle.append(self.live.pop(seq))

    # -- the slots, read as a list (callers of the earlier API got one): len, indexing, iteration, reversed ------

    def __len__(self) -> int:
        return len(self.slots)

    def __iter__(self) -> Iterator[Drafter]:
        return iter(self.slots)

    def __getitem__(self, i):
        return self.slots[i]
