"""Every recent position of every n-gram (of the lengths in ``sizes``) of a growing token buffer, and the continuations that
followed them; and a copy cursor that follows the occurrence being copied from one step to the next.

One index serves both the request's own context (prompt + output so far: what prompt lookup, the N-gram trie and
``rest``'s context drafting each index separately) and the memory of earlier outputs (several sequences in one
buffer, separated by ``-1``, so no match or continuation crosses from one to the next). It is updated with the new
tokens only, a handful of dict operations per token, so a lookup costs the same on a 4,000-token prompt as on a
short one. A lookup returns the continuations of the *most recent* occurrences of the longest matching tail
(SuffixDecoding's per-request tree), so a frequency trie over them ranks what usually follows.

The most recent occurrence is often the wrong one when an answer re-emits its prompt in order (an edit, a
rewrite): a tail n-gram common in the text (``self.``, ``return``) recurs in many places, and right after an edit
only a short tail matches anything at all. :class:`CopyCursor` keeps what the last steps established instead: if
the last draft came from buffer position ``p`` and the target then wrote ``k`` tokens that agree with the buffer at
``p``, copying goes on at ``p + k`` (that is the occurrence prompt lookup finds on sequential copying, without its
leftmost rule, which goes wrong once an n-gram recurs). When the target leaves the copy (it inserts, drops or
changes text), the cursor looks for the tail again a few tokens around the place it left (:data:`RESYNC_BACK`,
:data:`RESYNC_AHEAD`), which is where an edit resumes copying; only then does it fall back to the index. Both cost
a constant number of operations per step, whatever the buffer's length.
"""

from __future__ import annotations

import numpy as np

SEPARATOR = -1
RESYNC_BACK = 8  # tokens before the place the copy was left where it may resume (the target rewrote a word)
RESYNC_AHEAD = 48  # ... and after it (the target dropped a line or two of the copied text)
RESYNC_SINGLE = 2  # a one-token tail is trusted this close after that place (a token inserted, changed or dropped)


class NgramIndex:
    """Per n-gram length: the last end position of each n-gram (a dict of ints, keyed by the n-gram's hash) and,
    per position, the previous end position of the same n-gram: occurrences are a linked list through a flat list.
    No per-n-gram container: the garbage collector has nothing to walk however long the buffer grows (lists per
    n-gram made multi-millisecond collection pauses). A lookup checks the tokens it matched, so a hash collision
    costs a probe, never a wrong continuation."""

    def __init__(self, sizes=tuple(range(1, 9)), max_positions: int = 16):
        self.sizes = tuple(sorted(set(int(n) for n in sizes)))
        self.max_positions = max_positions  # occurrences walked per lookup
        self.clear()

    def clear(self) -> None:
        self.tokens: list[int] = []
        self.last_separator = -1
        self.last: dict[int, dict[int, int]] = {n: {} for n in self.sizes}  # n -> hash -> end position
        self.prev: dict[int, list[int]] = {n: [-1] for n in self.sizes}  # n -> end position -> previous one

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, new: list[int]) -> None:
        """Append tokens (``-1`` separates sequences) and index the n-grams that end in them."""
        buf = self.tokens
        start = len(buf)
        buf.extend(new)
        for n in self.sizes:
            self.prev[n].extend([-1] * len(new))
        for i in range(start, len(buf)):
            if buf[i] == SEPARATOR:
                self.last_separator = i
                continue
            for n in self.sizes:
                j = i - n + 1
                if j <= self.last_separator:  # j < 0 too: the buffer starts after a virtual separator at -1
                    break
                key = hash(tuple(buf[j: i + 1]))
                last = self.last[n]
                self.prev[n][i + 1] = last.get(key, -1)
                last[key] = i + 1

    def follow(self, tokens: list[int]) -> None:
        """Keep the buffer equal to ``tokens``, a list that only grows (the engine's sequence)."""
        if len(tokens) > len(self.tokens):
            self.extend(tokens[len(self.tokens):])

    def occurrences(self, context: list[int], n: int, max_rows: int) -> list[int]:
        """Where the continuations of the (up to ``max_rows``) most recent occurrences of the tail ``n``-gram start."""
        buf, end = self.tokens, len(self.tokens)
        if n not in self.last or n > len(context):
            return []
        tail = context[len(context) - n:]
        p = self.last[n].get(hash(tuple(tail)), -1)
        starts: list[int] = []
        walked = 0
        while p >= 0 and len(starts) < max_rows and walked < self.max_positions:
            walked += 1
            if p < end and buf[p] != SEPARATOR and buf[p - n: p] == tail:
                starts.append(p)
            p = self.prev[n][p]
        return starts

    def find(self, context: list[int], max_rows: int, min_n: int = 1) -> tuple[int, list[int]]:
        """``(n, starts)``: the longest tail n-gram of ``context`` that occurred with at least one following token,
        and where the continuations of its (up to ``max_rows``) most recent occurrences start; ``(0, [])``: none."""
        for n in reversed(self.sizes):
            if min_n <= n <= len(context):
                starts = self.occurrences(context, n, max_rows)
                if starts:
                    return n, starts
        return 0, []

    def continuation(self, start: int, length: int) -> list[int]:
        """Up to ``length`` tokens from ``start``, stopping at the end of the sequence they belong to."""
        cont = self.tokens[start: start + length]
        return cont[: cont.index(SEPARATOR)] if SEPARATOR in cont else cont

    def rows(self, starts: list[int], length: int) -> np.ndarray:
        """The continuations at ``starts`` as rows of ``length`` tokens, ``-1`` padded."""
        rows = np.full((len(starts), length), SEPARATOR, dtype=np.int64)
        for r, p in enumerate(starts):
            cont = self.continuation(p, length)
            rows[r, : len(cont)] = cont
        return rows

    def lookup(self, context: list[int], length: int, max_rows: int, min_n: int = 1) -> tuple[int, np.ndarray]:
        """``(n, rows)``: :meth:`find`'s continuations as rows (``-1`` padded, most recent occurrence first);
        ``n = 0`` and no rows when nothing matched."""
        n, starts = self.find(context, max_rows, min_n)
        return n, self.rows(starts, length) if starts else np.empty((0, length), dtype=np.int64)

    def tail_match(self, context: list[int], at: int, longest: int) -> int:
        """How many tokens before buffer position ``at`` equal the tail of ``context`` (at most ``longest``)."""
        buf, m = self.tokens, 0
        while m < longest and m < len(context) and at - m - 1 >= 0 and buf[at - m - 1] == context[-m - 1] \
                and buf[at - m - 1] != SEPARATOR:
            m += 1
        return m


class CopyCursor:
    """The occurrence of an :class:`NgramIndex`'s buffer that a sequence is copying, followed from step to step.

    After each proposal it remembers the starts it proposed (best first). At the next one it checks them against
    the tokens the target wrote meanwhile: the first start whose buffer text equals them all is being copied, and
    copying goes on right after them (``pos``, with ``run`` tokens copied in a row as its evidence). When none
    does, the copy was left where the best start stopped agreeing (``anchor``); the next proposals look for the
    tail there (:meth:`resync`) before anything else."""

    def __init__(self, index: NgramIndex):
        self.index = index
        self.reset()

    def reset(self) -> None:
        self.starts: list[int] = []  # what the last proposal drew from, best first
        self.seen = 0  # length of the sequence at that proposal
        self.pos = -1  # where copying goes on (-1: not copying)
        self.run = 0  # tokens copied in a row at pos
        self.anchor = -1  # where the copy was left (-1: never copied)
        self.matched: list[int] = []  # per start of the last proposal: tail tokens it matched
        self.found: list[int] = []  # the index's occurrences at the last proposal

    def update(self, tokens: list[int]) -> None:
        """Follow the tokens written since the last proposal (each proposal calls it first)."""
        new = tokens[self.seen:] if 0 < self.seen <= len(tokens) else []
        self.seen = len(tokens)
        if not new or not self.starts:
            return
        buf, best, best_k = self.index.tokens, -1, -1
        for rank, p in enumerate(self.starts):
            k = 0
            while k < len(new) and p + k < len(buf) and buf[p + k] == new[k]:
                k += 1
            if k == len(new):
                self.run = (self.run if rank == 0 and p == self.pos else self.matched[rank]) + k
                self.pos = p + k
                return
            if k > best_k:
                best, best_k = p, k
        self.pos, self.run, self.anchor = -1, 0, best + best_k

    def resync(self, context: list[int], longest: int) -> tuple[int, int]:
        """``(start, matched)``: the position near the anchor after which the longest tail of ``context`` occurs
        -- the nearest such one; a tail of one token only just after the anchor (the target inserted, changed or
        dropped a token and went on copying); ``(-1, 0)`` when there is none."""
        buf = self.index.tokens
        lo, hi = max(self.anchor - RESYNC_BACK, 1), min(self.anchor + RESYNC_AHEAD, len(buf) - 1)
        best, best_m, last = -1, 0, context[-1]
        for q in range(lo, hi + 1):
            if buf[q - 1] != last or buf[q] == SEPARATOR:
                continue
            m = self.index.tail_match(context, q, longest)
            if m > best_m or (m == best_m and abs(q - self.anchor) < abs(best - self.anchor)):
                best, best_m = q, m
        near = 0 <= best - self.anchor <= RESYNC_SINGLE
        return (best, best_m) if best_m >= 2 or (best_m == 1 and near) else (-1, 0)

    def candidates(self, context: list[int], max_rows: int, longest: int) -> tuple[list[int], list[int], int, int]:
        """``(starts, matched, n, run)``, best first: the cursor's start (when copying, or found again near where
        the copy was left) and the index's most recent occurrences of the longest tail n-gram (``n`` tokens);
        ``matched[i]``: tail tokens that precede start ``i`` in the buffer; ``run``: the cursor's evidence
        (tokens copied in a row, or the resynchronised tail's length), 0 when there is no cursor."""
        self.update(context)
        n, found = self.index.find(context, max_rows, 1)
        self.found = found
        start, run = (self.pos, self.run) if 0 <= self.pos < len(self.index.tokens) else (-1, 0)
        if start >= 0 and self.index.tokens[start] == SEPARATOR:
            start, run = -1, 0
        if start < 0 and self.anchor >= 0:
            start, run = self.resync(context, longest)
        starts = ([start] if start >= 0 else []) + [p for p in found if p != start][: max_rows - (start >= 0)]
        self.matched = [run if i == 0 and start >= 0 else n for i in range(len(starts))]
        self.starts = starts
        return starts, self.matched, n, run


def evidence_score(matched: int) -> float:
    """How much a continuation after ``matched`` agreeing tokens is trusted before anything is verified (prompt
    lookup's rule of thumb, 0.4 for one token up to 0.9 from five on); callers calibrate it against what the
    target accepted."""
    return min(0.25 + 0.15 * matched, 0.9)


def best_chain(index: NgramIndex, cursor: CopyCursor, context: list[int], length: int, max_rows: int = 16,
               longest: int = 8) -> tuple[list[int], list[float]]:
    """The one chain to draft from ``index`` after ``context`` (up to ``length`` tokens) and a score per token
    (an estimate that it is accepted given the previous one is): the cursor's continuation when the sequence is
    copying (scored by how long the copy has held), else the most frequent path through the continuations of the
    most recent occurrences of the longest tail n-gram (scored by agreement among them times the n-gram's trust).
    For drafters that verify a chain per sequence (a vLLM proposer); ``index`` must already hold ``context``
    when it is the sequence's own buffer (:meth:`NgramIndex.follow`). Cost: O(max_rows x length)."""
    starts, _, n, run = cursor.candidates(context, max_rows, longest)
    if not starts:
        return [], []
    if run > 0:
        chain = index.continuation(starts[0], length)
        return chain, [evidence_score(run)] * len(chain)
    rows = [index.continuation(p, length) for p in starts]
    chain, scores, trust = [], [], evidence_score(n)
    while len(chain) < length:
        counts: dict[int, int] = {}
        for row in rows:
            if len(row) > len(chain):
                counts[row[len(chain)]] = counts.get(row[len(chain)], 0) + 1
        if not counts:
            break
        token = max(counts, key=lambda t: counts[t])  # ties: the most recent occurrence's token (dicts keep order)
        scores.append(trust * counts[token] / len(rows))
        chain.append(token)
        rows = [row for row in rows if len(row) >= len(chain) and row[len(chain) - 1] == token]
    return chain, scores
