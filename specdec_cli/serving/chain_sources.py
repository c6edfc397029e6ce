"""The sources a :class:`~specdec_cli.serving.chains.ChainDrafter` drafts from, each offering a chain or two per
sequence and step: ``auto``'s cheap sources, reshaped for engines that verify chains (vLLM's proposer interface).

* :class:`ContextChains` -- the sequence's own prompt and output (its :class:`NgramIndex`, per sequence);
* :class:`MemoryChains` -- earlier outputs of every sequence the engine served (one :class:`OutputMemory`);
* :class:`SuffixArrayChains` -- a suffix-array datastore (REST's longest-match continuations), shared;
* :class:`TrigramChains` -- a tri-gram datastore (ADED's matrix, adapted from the verified tokens), shared.

A source's chain is the most frequent path through the frequency trie of its continuations (:func:`best_chain`);
each token carries the source's raw estimate that it is accepted given the ones before it (the share of the
continuations that agree, times a trust in the match length: ``auto``'s scores, :mod:`specdec_cli.drafting.sources`),
which the drafter calibrates per (source, match-length bucket).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..drafting.output_memory import OutputMemory
from ..drafting.ngram_index import CopyCursor
from ..drafting.sources import bucket_of, cursor_bucket, prior
from ..runtime.jit import njit

CONTEXT_ROWS = 16  # occurrences of the context's longest tail read per lookup (auto's ContextSource)
CONTEXT_LONGEST = 8  # longest tail n-gram the copy cursor resynchronises on (auto's max_ngram)
MEMORY_ROWS = 32  # ... of the memory's (auto's MemorySource)
REACH = 2.0  # a chain drawn from tail matches goes at most this many tokens per matched token (SuffixDecoding's
# max_spec_factor); the cursor's copy of a located occurrence is not cut. Replayed against SuffixDecoding
# (scripts/replay_vllm.py, docs/vllm.md): uncut, the calibration trusted the deep end of long chains after short
# matches too much. Cutting the cursor's copy too gained on SmolLM2 and lost on Gemma-3 by about as much, and cost
# steps on edits (tests/test_serving.py)
BESIDE_CURSOR = 10  # calibration buckets of the other occurrences while the cursor copies: bucket_of(n) + this
# (0-5 are bucket_of's, 6-9 cursor_bucket's)
STORE_MATCHES = 256  # suffix-array matches sampled per lookup (auto's SuffixArraySource)
STORE_NGRAM = 16  # longest context tail the suffix array matches (REST's n_max)
TRIGRAM_DEPTH = 3  # tri-gram chains stop here: each step multiplies in a probability rarely above 0.5
MIN_TRIGRAM_PROB = 0.05  # ... or when the chain's probability falls below this


@dataclass
class Offer:
    """One source's chain for one sequence this step."""

    source: str
    bucket: int  # match-length bucket its estimates are calibrated in
    tokens: list[int]
    raw: list[float]  # per token: the source's estimate that it is accepted given the ones before it are
    est: list[float] = field(default_factory=list)  # the same, calibrated (filled by the drafter)


@njit(cache=True, nogil=True)
def best_chain(rows, tokens_out, share_out):
    """The most frequent path through the frequency trie of ``rows`` (continuations, ``-1`` after their end):
    at each depth the most common token among the rows still on the path (ties: the earliest row, the most
    recent occurrence) and its share of them. Returns the chain's length; tokens and shares are written out."""
    k, length = rows.shape
    alive = np.ones(k, dtype=np.bool_)
    n_alive = k
    for d in range(length):
        best, best_count = -1, 0
        for i in range(k):
            t = rows[i, d]
            if not alive[i] or t < 0 or t == best:
                continue
            count = 0
            for j in range(i, k):
                if alive[j] and rows[j, d] == t:
                    count += 1
            if count > best_count:
                best, best_count = t, count
        if best < 0:
            return d
        tokens_out[d] = best
        share_out[d] = best_count / n_alive
        for i in range(k):
            if rows[i, d] != best:
                alive[i] = False
        n_alive = best_count
    return length


def rows_chain(rows: np.ndarray, trust: float) -> tuple[list[int], list[float]]:
    """:func:`best_chain` of continuation rows, its shares scaled by ``trust``."""
    if not rows.size:
        return [], []
    tokens = np.empty(rows.shape[1], dtype=np.int64)
    share = np.empty(rows.shape[1], dtype=np.float64)
    n = best_chain(np.ascontiguousarray(rows, dtype=np.int64), tokens, share)
    return tokens[:n].tolist(), (share[:n] * trust).tolist()


def reach(length: int, evidence: int) -> int:
    """How far a chain drawn from ``evidence`` matched tokens may go: ``length`` at most, :data:`REACH` a token."""
    return min(length, max(1, int(REACH * evidence)))


class ChainSource:
    """A draft source for chains: ``offer`` one chain for a sequence (``tokens``: its prompt and output so far,
    the sequence's own list), ``learn`` from the tokens a step verified. ``cheap`` sources cost microseconds;
    the drafter gates every source whose accepted tokens stop paying for its time."""

    name = "source"
    gated = True  # skipped while the tokens only it got accepted do not pay for its time (drafting.gate)

    def offer(self, seq, tokens: list[int], length: int) -> Offer | None:
        raise NotImplementedError

    def offers(self, seq, tokens: list[int], length: int) -> list[Offer]:
        """This step's chains for ``seq`` (the drafter sends the best prefix of one of them): :meth:`offer`'s."""
        offer = self.offer(seq, tokens, length)
        return [offer] if offer is not None else []

    def learn(self, seq, tokens: list[int], new: int) -> None:
        """``tokens`` gained ``new`` verified tokens."""


class ContextChains(ChainSource):
    """The sequence's own text, as ``auto``'s :class:`~specdec_cli.drafting.sources.CopySource` drafts it, in
    chains: where a :class:`CopyCursor` says the sequence is copying (an edit of code in its prompt), the
    continuation of that occurrence, calibrated by how long the copy has held (:func:`cursor_bucket`); and the most
    frequent path through the other recent occurrences of the longest tail n-gram (calibrated by its length).

    Both chains are offered, each calibrated on its own (the other occurrences beside a copying cursor in buckets
    of their own, :data:`BESIDE_CURSOR`: in cells shared with the occurrences read where nothing is copied, an
    exploratory replay gained about 1% less on both models), and the drafter sends the one whose calibrated
    prefix pays best. Offering the cursor's chain alone while it copied lost where a cursor's copy goes wrong
    (HumanEval: a completion copies the prompt's signature, then writes code of its own; replayed against the
    recorded greedy outputs, ``scripts/replay_vllm.py``, docs/vllm.md). :meth:`offer` is the first of them."""

    name = "context"
    gated = False  # the request's own text costs ~0.07 ms a step; one gate shared by every sequence closed it for
    # all of them after a run of chats (619 of 1063 steps in a 12-prompt bench), edits included

    def offer(self, seq, tokens, length):
        return next(iter(self.offers(seq, tokens, length)), None)

    def offers(self, seq, tokens, length):
        if seq.cursor is None:
            seq.cursor = CopyCursor(seq.index)
        starts, _, n, run = seq.cursor.candidates(tokens, CONTEXT_ROWS, CONTEXT_LONGEST)
        out, bucket = [], bucket_of(n)
        if run > 0:
            chain = seq.index.continuation(starts[0], length)  # its run buckets learn how far a located copy holds
            if chain:
                out.append(Offer(self.name, cursor_bucket(run), chain, [prior(run)] * len(chain)))
            starts, bucket = starts[1:], bucket + BESIDE_CURSOR
        if starts:
            chain, raw = rows_chain(seq.index.rows(starts, reach(length, n)), prior(n))
            if chain:
                out.append(Offer(self.name, bucket, chain, raw))
        return out


class MemoryChains(ChainSource):
    name = "memory"

    def __init__(self, memory: OutputMemory):
        self.memory = memory

    def offer(self, seq, tokens, length):
        n, rows = self.memory.continuations(tokens, length, MEMORY_ROWS)
        chain, raw = rows_chain(rows[:, : reach(length, n)], prior(n))
        return Offer(self.name, bucket_of(n), chain, raw) if chain else None


class SuffixArrayChains(ChainSource):
    name = "datastore"

    def __init__(self, store):
        self.store = store

    def offer(self, seq, tokens, length):
        found = self.store.retrieve(tokens, STORE_NGRAM, length, STORE_MATCHES)
        # a corpus match is trusted half as much as one in the request itself (auto's SuffixArraySource)
        chain, raw = rows_chain(found.continuations.reshape(-1, length), prior(found.match_length) / 2)
        return Offer(self.name, bucket_of(found.match_length), chain, raw) if chain else None


class TrigramChains(ChainSource):
    name = "trigram"

    def __init__(self, matrix, adapt: bool = True, increment: float = 0.1):
        self.matrix, self.adapt, self.increment = matrix, adapt, increment  # ADED's default increment

    def offer(self, seq, tokens, length):
        vocab = self.matrix.vocab_size
        a, b = (tokens[-2] if len(tokens) > 1 else tokens[-1]), tokens[-1]
        chain, raw, path = [], [], 1.0
        for _ in range(min(TRIGRAM_DEPTH, length)):
            offsets, ids, probs = self.matrix.gather(np.array([a * vocab + b]))
            if offsets[1] <= offsets[0]:
                break
            j = int(offsets[0] + np.argmax(probs[offsets[0]: offsets[1]]))
            p = float(probs[j])
            path *= p
            if path < MIN_TRIGRAM_PROB:
                break
            chain.append(int(ids[j]))
            raw.append(p)
            a, b = b, int(ids[j])
        return Offer(self.name, 0, chain, raw) if chain else None

    def learn(self, seq, tokens, new):
        if self.adapt:  # ADED's Algorithm 2 over the tri-grams that end in the new tokens
            self.matrix.adjust(tokens[-(new + 2):], increment=self.increment)
