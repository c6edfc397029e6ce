"""The draft sources ``auto`` merges. Each proposes a small tree of continuations of the sequence, scored with
its own estimates, and reports a match-length bucket its estimates are calibrated in:

* :class:`ContextSource` -- the request's own prompt and output so far (one :class:`NgramIndex`);
* :class:`MemorySource` -- earlier outputs of this run, or of earlier runs with ``--memory DIR``;
* :class:`SuffixArraySource` -- a ``rest`` datastore (suffix array), its longest-match continuations;
* :class:`TrigramSource` -- an ``aded`` tri-gram store, expanded best-first (no MCTS: a few vectorised row reads),
  adapted from the verified output as ADED does.

Draft models are not a source of this kind: ``auto`` grows a model chain from the merged tree's most promising
node (:mod:`specdec_cli.methods.auto`).
"""

from __future__ import annotations

import numpy as np

from .count_trie import count_trie, top_by_count
from ..engine.trees import Draft
from .ngram_index import CopyCursor, NgramIndex, evidence_score
from .output_memory import OutputMemory


def bucket_of(n: int) -> int:
    """Match lengths 0, 1, 2, 3-4, 5-8, 9+ as calibration buckets 0..5."""
    return 0 if n <= 0 else 1 if n == 1 else 2 if n == 2 else 3 if n <= 4 else 4 if n <= 8 else 5


def prior(n: int) -> float:
    """How much a continuation after an ``n``-token match is trusted before any is verified (prompt lookup's
    rule): the calibration of each (source, bucket) learns the real rate from there."""
    return evidence_score(n)


def cursor_bucket(run: int) -> int:
    """Copies from the cursor after 1-2, 3-8, 9-32 and 33+ tokens copied in a row as calibration buckets 6..9
    (after :func:`bucket_of`'s): the longer a copy has held, the likelier it goes on -- until the edit comes."""
    return 6 if run <= 2 else 7 if run <= 8 else 8 if run <= 32 else 9


def rows_to_draft(rows: np.ndarray, top_c: int, trust: float = 1.0) -> Draft:
    """A frequency trie of continuation rows, its ``top_c`` most frequent nodes, scored by frequency ratios times
    ``trust``."""
    if not rows.size:
        return Draft()
    if rows.shape[0] == 1:  # one continuation (a long match: the common case): its trie is the chain itself
        chain = rows[0][rows[0] >= 0][:top_c].tolist()
        return Draft.chain(chain, scores=[trust] * len(chain))
    draft = top_by_count(count_trie(rows), top_c).to_draft()
    if trust != 1.0:
        draft.scores = [s * trust for s in draft.scores]
    return draft


class Source:
    """One of ``auto``'s draft sources. Besides drafting (``start``, ``propose``, ``accept``) a source has hooks for
    what outlives a generation, so that the drafter never needs to know its class: ``state``/``load_state`` (a
    ``bench --resume`` checkpoint, kept under ``state_key``) and ``finish`` (after the last generation). What the
    slots of a batch hold once (the memory of outputs) is handed to each slot's source when it is made
    (``MethodContext.held_once``)."""

    name = "source"
    cost_s = 5e-5  # what a proposal is assumed to cost where the clock is not read (sampled runs)
    gated = True  # auto skips it while the tokens only it got accepted do not pay for its time (drafting.gate)
    state_key: str | None = None  # the checkpoint's key for this kind of source's states (None: it keeps none)

    @classmethod
    def for_store(cls, store, top_c: int):
        """The source drafting from an opened datastore of its kind (the kinds registry names the class)."""
        return cls(store)

    def start(self, prompt: list[int]) -> None:
        pass

    def state(self):
        """What the source learnt that a resumed run needs, as JSON data (with ``state_key`` set)."""
        return None

    def load_state(self, data) -> None:
        """Continue from :meth:`state`'s answer; the data comes from a file: ValueError, KeyError or TypeError
        when it is not one."""

    def finish(self) -> None:
        """After the run's last generation."""

    def propose(self, tokens: list[int], length: int) -> list[tuple[Draft, int]]:
        """Draft trees, each with the calibration bucket of its estimates."""
        raise NotImplementedError

    def accept(self, tokens: list[int], new: int) -> None:
        """``tokens`` gained ``new`` verified tokens."""

    def stats(self) -> dict:
        return {}


class CopySource(Source):
    """Drafts copied from a token buffer (:class:`NgramIndex`): the continuation where a :class:`CopyCursor` says
    the sequence is copying (a chain, calibrated by how long the copy has held: :func:`cursor_bucket`) and a
    frequency trie of the most recent occurrences of the longest tail n-gram (calibrated by ``n``)."""

    def __init__(self, index: NgramIndex, rows: int, top_c: int, max_n: int):
        self.index, self.rows, self.top_c, self.max_n = index, rows, top_c, max_n
        self.cursor = CopyCursor(index)

    def copies(self, tokens: list[int], length: int) -> list[tuple[Draft, int]]:
        starts, _, n, run = self.cursor.candidates(tokens, self.rows, self.max_n)
        out = []
        if run > 0:
            chain = self.index.continuation(starts[0], length)
            out.append((Draft.chain(chain, scores=[prior(run)] * len(chain)), cursor_bucket(run)))
            starts = starts[1:]
        if starts:
            out.append((rows_to_draft(self.index.rows(starts, length), self.top_c, prior(n)), bucket_of(n)))
        return out


class ContextSource(CopySource):
    name = "context"
    gated = False  # the request's own text: the source the others are measured against (docs/auto.md, "Gates")

    def __init__(self, max_n: int = 8, rows: int = 16, top_c: int = 32):
        super().__init__(NgramIndex(range(1, max_n + 1), max_positions=rows), rows, top_c, max_n)

    def start(self, prompt: list[int]) -> None:
        self.index.clear()
        self.index.extend(list(prompt))
        self.cursor.reset()

    def propose(self, tokens: list[int], length: int) -> list[tuple[Draft, int]]:
        self.index.follow(tokens)
        return self.copies(tokens, length)


class MemorySource(CopySource):
    name = "memory"
    state_key = "pending"  # the generation that joins the memory at the next start (the memory itself: "memory")

    def __init__(self, memory: OutputMemory, rows: int = 32, top_c: int = 32):
        super().__init__(memory.index, rows, top_c, max(memory.sizes))
        self.memory = memory
        self.prompt: list[int] | None = None
        self.sequence: list[int] | None = None

    def start(self, prompt: list[int]) -> None:
        self.flush()
        self.prompt, self.sequence = list(prompt), None
        self.index = self.memory.index  # a shared memory (batch slots) or one loaded from a checkpoint
        self.cursor = CopyCursor(self.index)  # positions of the last generation mean nothing after a forget

    def flush(self) -> None:
        """The generation that just ended joins the memory."""
        if self.prompt is not None and self.sequence is not None:
            self.memory.remember(self.prompt, self.sequence[len(self.prompt):])
        self.prompt = self.sequence = None

    def accept(self, tokens: list[int], new: int) -> None:
        self.sequence = tokens

    def propose(self, tokens: list[int], length: int) -> list[tuple[Draft, int]]:
        return self.copies(tokens, length)

    def state(self):
        if self.prompt is None or self.sequence is None:
            return None
        return [list(self.prompt), list(self.sequence[len(self.prompt):])]

    def load_state(self, data) -> None:
        from .output_memory import token_list

        if data is None:
            self.prompt = self.sequence = None
            return
        prompt, output = token_list(data[0]), token_list(data[1])
        self.prompt, self.sequence = prompt, prompt + output

    def finish(self) -> None:
        self.flush()

    def stats(self) -> dict:
        return {"memory_tokens": self.memory.num_tokens, "memory_sequences": len(self.memory.sequences)}


class SuffixArraySource(Source):
    name = "datastore"
    cost_s = 5e-4  # a suffix-array lookup and its trie, measured ~0.3-0.8 ms on the stdlib store

    def __init__(self, store, n_max: int = 16, max_matches: int = 256, top_c: int = 32):
        self.store, self.n_max, self.max_matches, self.top_c = store, n_max, max_matches, top_c

    @classmethod
    def for_store(cls, store, top_c: int):
        return cls(store, top_c=top_c)

    def propose(self, tokens: list[int], length: int) -> tuple[Draft, int]:
        found = self.store.retrieve(tokens, self.n_max, length, self.max_matches)
        rows = found.continuations.reshape(-1, length)
        return [(rows_to_draft(rows, self.top_c, prior(found.match_length) / 2), bucket_of(found.match_length))]


class TrigramSource(Source):
    name = "trigram"
    cost_s = 3e-4  # three levels of gathers from the matrix, measured ~0.2-0.4 ms
    state_key = "trigram"  # the matrix's adapted rows

    def __init__(self, matrix, max_depth: int = 3, width: int = 3, beam: int = 4, min_prob: float = 0.05,
                 adapt: bool = True, increment: float = 0.1):
        self.matrix, self.max_depth, self.width, self.beam, self.min_prob = matrix, max_depth, width, beam, min_prob
        self.adapt, self.increment = adapt, increment

    def start(self, prompt: list[int]) -> None:
        self.matrix.clear_cache()
        self.learnt = 0  # tokens of the sequence whose tri-grams the matrix has learnt
        self.pending: list[int] | None = list(prompt) if self.adapt else None

    def accept(self, tokens: list[int], new: int) -> None:
        if self.adapt:
            self.pending = tokens  # learnt when next consulted: a gated source costs nothing per step

    def state(self):
        return self.matrix.overlay_state()

    def load_state(self, data) -> None:
        self.matrix.load_overlay_state(data)

    def learn(self) -> None:
        """ADED's Algorithm 2 over the tri-grams that end in tokens not learnt yet (each counted once)."""
        if self.pending is not None and len(self.pending) > self.learnt:
            self.matrix.adjust(self.pending[max(self.learnt - 2, 0):], increment=self.increment)
            self.learnt = len(self.pending)

    def propose(self, tokens: list[int], length: int) -> list[tuple[Draft, int]]:
        """Best-first by path probability, level by level: at most ``width`` children per node and ``beam``
        nodes expanded per level, each scored with its tri-gram probability."""
        self.learn()
        out = Draft()
        out.scores = []
        vocab = self.matrix.vocab_size
        prev = tokens[-2] if len(tokens) > 1 else tokens[-1]
        frontier = [(-1, prev, tokens[-1], 1.0)]  # (node, a, b, path probability)
        for _ in range(min(self.max_depth, length)):
            offsets, ids, probs = self.matrix.gather(np.array([a * vocab + b for _, a, b, _ in frontier]))
            grown = []
            for f, (node, _, b, path) in enumerate(frontier):
                lo, hi = int(offsets[f]), int(offsets[f + 1])
                for j in (lo + np.argsort(-probs[lo:hi], kind="stable")[: self.width]).tolist():
                    p = float(probs[j])
                    if path * p < self.min_prob:
                        break
                    out.tokens.append(int(ids[j]))
                    out.parents.append(node)
                    out.scores.append(p)
                    grown.append((len(out.tokens) - 1, b, int(ids[j]), path * p))
            frontier = sorted(grown, key=lambda g: -g[3])[: self.beam]
            if not frontier:
                break
        return [(out, 0)]
