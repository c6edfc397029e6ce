"""One drafter serving many sequences with chains drafted from token ids alone (vLLM's proposer interface).

Like llama.cpp's ``common_speculative`` and vLLM's suffix proposer: one object, per-sequence state keyed by a
sequence id (its context index and last step's chains), shared state held once (the memory of earlier outputs,
opened datastores, adapted tri-gram rows, the calibration and the step-cost model), and a uniform life cycle:

    drafter.begin(seq, prompt)            # a new request
    drafter.advance(seq, new_tokens)      # the engine verified last step's chain: accepted tokens + one
    drafts = drafter.draft(seqs, limits)  # one call for every running sequence: one chain each
    drafter.end(seq)                      # finished: its output joins the memory

Every source offers a chain or two per sequence (:mod:`.chain_sources`); estimates are calibrated per (source,
match-length bucket) from what the engine accepted -- of every source's chain, sent or not, as far as the
verified tokens reach. A node two sources agree on takes the better estimate. Each sequence gets the chain and
length that maximise expected accepted tokens minus their price: a token is sent while the probability that it
and its predecessors are accepted exceeds the engine's tokens per second times what one more computed token costs
(:class:`~specdec_cli.serving.pricing.StepCost`, learnt from the engine's own steps). A source whose accepted
tokens (those no other source offered) do not pay for its time and verification is gated
(:class:`~specdec_cli.drafting.gate.Gate`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..drafting.gate import Gate
from ..drafting.ngram_index import NgramIndex
from ..drafting.output_memory import OutputMemory
from ..drafting.union import SourceCalibration
from .chain_sources import ChainSource, Offer
from .pricing import StepCost

CONTEXT_NGRAMS = range(1, 9)  # tail n-grams the context index matches (auto's max_ngram default)
CONTEXT_POSITIONS = 16  # occurrences of an n-gram walked per lookup (auto's ContextSource)


@dataclass
class SeqState:
    index: NgramIndex  # the sequence's tokens (``index.tokens``) and their n-grams
    prompt_len: int
    offers: list[Offer] = field(default_factory=list)  # last step's chains, one or two per source
    sent: list[int] = field(default_factory=list)  # the chain the engine verifies
    sent_by: list[tuple[str, ...]] = field(default_factory=list)  # per sent token: the sources that offered it
    cursor: object = None  # the context's CopyCursor (made by ContextChains on the first offer)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def choose(offers: list[Offer], threshold: float) -> tuple[list[int], list[tuple[str, ...]]]:
    """The chain (one offer's prefix) maximising sum_j P(first j accepted) - threshold * length; a token that
    several offers agree on takes the best of their estimates. Returns it with each token's sources."""
    agree = [[common_prefix(o.tokens, q.tokens) for q in offers] for o in offers]
    best_gain, best, best_len = 0.0, -1, 0
    for i, o in enumerate(offers):
        p, gain = 1.0, 0.0
        for j in range(len(o.tokens)):
            est = max(q.est[j] for q, shared in zip(offers, agree[i]) if shared > j)
            p *= est
            gain += p - threshold
            if gain > best_gain:
                best_gain, best, best_len = gain, i, j + 1
    if best < 0:
        return [], []
    chain = offers[best].tokens[:best_len]
    by = [tuple(dict.fromkeys(q.source for q, shared in zip(offers, agree[best]) if shared > j))  # a source once,
          for j in range(best_len)]  # though two of its chains agree
    return chain, by


class ChainDrafter:
    def __init__(self, sources: list[ChainSource], memory: OutputMemory | None = None, context: bool = True):
        self.sources = list(sources)
        self.memory, self.context = memory, context
        self.seqs: dict[int, SeqState] = {}
        self.calibration = SourceCalibration()
        self.cost = StepCost()
        self.gates = {s.name: Gate() for s in self.sources if s.gated}  # the context is never gated (as in auto)
        self.pending: dict[tuple[str, int], tuple[list, list, list]] = {}  # calibration observations to add
        self.reset_stats()

    def reset_stats(self) -> None:
        self.totals: dict[str, dict[str, float]] = {}
        self.calls = self.rows = self.sent = self.accepted = self.begun = self.ended = 0
        self.draft_s = 0.0

    # -- per sequence ---------------------------------------------------------------------------------------

    def begin(self, seq_id: int, prompt: list[int]) -> None:
        index = NgramIndex(CONTEXT_NGRAMS, max_positions=CONTEXT_POSITIONS)
        index.extend([int(t) for t in prompt])
        self.seqs[seq_id] = SeqState(index, len(prompt))
        self.begun += 1

    def end(self, seq_id: int) -> None:
        """The sequence finished (or left the engine): what it wrote joins the memory."""
        st = self.seqs.pop(seq_id, None)
        if st is None:
            return
        self.ended += 1
        if self.memory is not None:
            tokens = st.index.tokens
            self.memory.remember(tokens[: st.prompt_len], tokens[st.prompt_len:])

    def tokens(self, seq_id: int) -> list[int]:
        return self.seqs[seq_id].index.tokens

    def advance(self, seq_id: int, new: list[int]) -> int:
        """The engine appended ``new`` (the accepted part of last step's chain and one token of its own) to the
        sequence; returns how many tokens of the sent chain it accepted."""
        st = self.seqs[seq_id]
        new = [int(t) for t in new]
        for o in st.offers:  # every offer is scored as far as the verified tokens reach
            matched = common_prefix(o.tokens, new)
            tested = min(len(o.tokens), len(new), matched + 1)
            cell = self.pending.setdefault((o.source, o.bucket), ([], [], []))
            cell[0].extend(range(1, tested + 1))
            cell[1].extend(o.raw[:tested])
            cell[2].extend(j < matched for j in range(tested))
        accepted = min(common_prefix(st.sent, new), len(new) - 1)
        self._count(st, accepted)
        st.index.extend(new)
        for source in self.sources:
            source.learn(st, st.index.tokens, len(new))
        st.offers, st.sent, st.sent_by = [], [], []
        return accepted

    def _count(self, st: SeqState, accepted: int) -> None:
        only_sent: dict[str, int] = {}
        only_accepted: dict[str, int] = {}
        for j, names in enumerate(st.sent_by):
            for name in names:
                row = self._row(name)
                row["verified"] += 1
                row["accepted"] += j < accepted
                if len(names) == 1:
                    only_sent[name] = only_sent.get(name, 0) + 1
                    only_accepted[name] = only_accepted.get(name, 0) + (j < accepted)
        for name, total in only_accepted.items():
            self._row(name)["accepted_only"] += total
        self.sent += len(st.sent)
        self.accepted += accepted
        for name in dict.fromkeys(o.source for o in st.offers):  # a source once, however many chains it offered
            gate = self.gates.get(name)
            if gate is not None:
                cost = self._row(name)["last_s"] + self.cost.per_token * only_sent.get(name, 0)
                gate.record(only_accepted.get(name, 0), cost, self.cost.value)

    def _row(self, name: str) -> dict:
        row = self.totals.get(name)
        if row is None:
            row = self.totals[name] = {"steps": 0, "offered": 0, "verified": 0, "accepted": 0, "accepted_only": 0,
                                       "draft_s": 0.0, "last_s": 0.0, "gated_steps": 0}
        return row

    # -- one step, every sequence ---------------------------------------------------------------------------

    def draft(self, seq_ids: list[int], limits: list[int]) -> list[list[int]]:
        """One chain per sequence (at most ``limits[i]`` tokens; empty: draft nothing)."""
        self._flush_calibration()
        offers = [self._offers(self.seqs[s], limit) if limit > 0 else [] for s, limit in zip(seq_ids, limits)]
        self._calibrate([o for row in offers for o in row])
        threshold = self.cost.threshold
        out = []
        for s, row in zip(seq_ids, offers):
            st = self.seqs[s]
            st.offers = row
            st.sent, st.sent_by = choose(row, threshold) if row else ([], [])
            out.append(list(st.sent))
        return out

    def record_call(self, rows: int, seconds: float) -> None:
        """The engine's proposer call that served ``rows`` sequences took ``seconds`` (everything: matching rows
        to sequences, advancing them, drafting)."""
        self.calls += 1
        self.rows += rows
        self.draft_s += seconds

    def _offers(self, st: SeqState, limit: int) -> list[Offer]:
        tokens = st.index.tokens
        out = []
        for source in self.sources:
            if source.name == "context" and not self.context:
                continue
            row = self._row(source.name)
            gate = self.gates.get(source.name)
            if gate is not None and not gate.open():
                row["gated_steps"] += 1
                continue
            t0 = time.perf_counter()
            offers = source.offers(st, tokens, limit)
            row["last_s"] = time.perf_counter() - t0
            row["draft_s"] += row["last_s"]
            row["steps"] += 1
            for offer in offers:  # "offered": the tokens of every chain (two chains' shared prefix twice)
                row["offered"] += len(offer.tokens)
                out.append(offer)
        return out

    def _calibrate(self, offers: list[Offer]) -> None:
        """Every offer's calibrated estimates: one calibrator read per (source, bucket) for the whole batch."""
        groups: dict[tuple[str, int], list[Offer]] = {}
        for o in offers:
            groups.setdefault((o.source, o.bucket), []).append(o)
        for (source, bucket), group in groups.items():
            depths = [j + 1 for o in group for j in range(len(o.tokens))]
            raw = [r for o in group for r in o.raw]
            est = self.calibration.estimate(source, bucket, depths, raw).tolist()
            k = 0
            for o in group:
                o.est, k = est[k: k + len(o.tokens)], k + len(o.tokens)

    def _flush_calibration(self) -> None:
        for (source, bucket), (depths, raw, oks) in self.pending.items():
            if depths:
                self.calibration.calibrator(source, bucket).add(depths, np.asarray(raw), oks)
        self.pending = {}

    # -- what it did ----------------------------------------------------------------------------------------

    def stats(self, reset: bool = False) -> dict:
        sources = {}
        for name, row in self.totals.items():
            sources[name] = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items() if k != "last_s"}
            sources[name]["draft_ms_per_step"] = round(1000 * row["draft_s"] / row["steps"], 4) if row["steps"] else None
        out = {"sources": sources, "calls": self.calls, "rows": self.rows, "verified": self.sent, "accepted": self.accepted,
               "draft_s": round(self.draft_s, 6), "sequences_begun": self.begun, "sequences_ended": self.ended,
               "propose_ms_per_call": round(1000 * self.draft_s / self.calls, 4) if self.calls else None,
               "propose_ms_per_row": round(1000 * self.draft_s / self.rows, 4) if self.rows else None,
               "step_cost": self.cost.state(),
               "memory_tokens": self.memory.num_tokens if self.memory is not None else None}
        if reset:
            self.reset_stats()
        return out
