"""``rest``: Retrieval-Based Speculative Decoding (He et al. 2024), drafts from a suffix-array datastore.

Each step retrieves continuations of the longest matching suffix of the sequence (``n_max`` tokens down to 1),
builds a frequency trie of their prefixes and proposes its ``top_c`` most frequent nodes as a token tree. The
engine verifies the tree exactly (greedy: the argmax path; sampling: the target's own draw at each node), so the
output is the target's. Options (``n_max``, ``cont_len``, ``top_c``, ``max_matches``, ``verify``, ``memory``:
drafts also from this drafter's earlier verified outputs, ``specdec_cli.drafting.output_memory``; ``context``: also from the
request's own prompt and output, on by default and off with ``--budget paper``) and their defaults are
declared once, in the registry ``specdec_cli.methods.METHODS`` (``specdec methods`` lists them).
"""

from __future__ import annotations

import time

import numpy as np

from ..drafting.count_trie import count_trie, top_by_count
from ..drafting.prompt_lookup import FirstOccurrenceIndex
from ..datastore import SuffixArrayDatastore
from ..engine.loop import Draft, Drafter
from ..errors import SpecdecError
from ..drafting.output_memory import OutputMemory

CONTEXT_NGRAM, CONTEXT_MIN_NGRAM = 3, 1  # prompt lookup's settings (transformers' prompt_lookup defaults)
CONTEXT_SHARE = 3  # the context's continuation counts 3x all datastore rows: 3/4 of the root's weight


class RestDrafter(Drafter):
    name = "rest"

    def __init__(self, store: SuffixArrayDatastore, n_max: int = 16, cont_len: int = 10, top_c: int = 64,
                 max_matches: int = 5000, memory: OutputMemory | None = None, memory_weight: int = 8,
                 context: bool = False):
        for key, value in (("n_max", n_max), ("cont_len", cont_len), ("top_c", top_c), ("max_matches", max_matches)):
            if value < 1:
                raise SpecdecError(f"--opt {key} must be >= 1, got {value}")
        self.store = store
        self.n_max, self.cont_len, self.top_c, self.max_matches = n_max, cont_len, top_c, max_matches
        self.memory, self.memory_weight = memory, memory_weight
        self.context = context
        self.index: FirstOccurrenceIndex | None = None
        self.context_hits = 0
        self.sequence: list[int] | None = None  # the current generation's tokens (for the memory)
        self.retrieval_s: list[float] = []
        self.match_lengths: list[int] = []
        self.draft_sizes: list[int] = []
        self.memory_hits = 0

    def start(self, prompt, cfg, generator) -> None:
        super().start(prompt, cfg, generator)
        if self.memory is not None and self.sequence:  # the previous generation, now complete, joins the memory
            self.memory.add(self.sequence)
        self.sequence = None
        self.retrieval_s, self.match_lengths, self.draft_sizes = [], [], []
        self.memory_hits = self.context_hits = 0
        if self.context:
            self.index = FirstOccurrenceIndex(CONTEXT_NGRAM)
            self.index.prepare(list(prompt))

    def accept(self, tokens: list[int], outcome) -> None:
        self.sequence = tokens

    def state(self) -> dict | None:
        """The memory of earlier outputs (``--opt memory=1``), and the last generation that joins it next."""
        if self.memory is None:
            return None
        return {"memory": self.memory.state(), "sequence": list(self.sequence) if self.sequence else None}

    def load_state(self, state: dict | None) -> None:
        if self.memory is None or state is None:
            return
        from ..drafting.output_memory import token_list

        self.memory.load_state(state["memory"])
        self.sequence = token_list(state["sequence"]) if state["sequence"] is not None else None

    def propose(self, tokens: list[int], max_tokens: int) -> Draft:
        if max_tokens <= 0:
            return Draft()
        t0 = time.perf_counter()
        draft = self.draft_for(tokens, max_tokens)
        self.retrieval_s.append(time.perf_counter() - t0)
        self.draft_sizes.append(len(draft))
        return draft

    def draft_for(self, tokens: list[int], max_tokens: int) -> Draft:
        """Retrieve, count, keep the ``top_c`` most frequent nodes; each node's score is its frequency ratio.
        The tree's depth is capped by the remaining token budget."""
        length = min(self.cont_len, max_tokens)
        found = self.store.retrieve(tokens, self.n_max, length, self.max_matches)
        self.match_lengths.append(found.match_length)
        rows = [found.continuations.reshape(-1, length)]
        weights = [np.ones(rows[0].shape[0], dtype=np.int64)]
        if self.memory is not None:
            size, remembered = self.memory.continuations(tokens, length)
            if remembered.size:  # the target's own earlier words outweigh the corpus's
                self.memory_hits += 1
                rows.append(remembered)
                weights.append(np.full(remembered.shape[0], self.memory_weight, dtype=np.int64))
        if self.index is not None:
            context = self._context_row(tokens, length)
            if context is not None:
                rows.append(context)
                weights.append(np.array([CONTEXT_SHARE * max(rows[0].shape[0], 1)], dtype=np.int64))
        trie = count_trie(np.concatenate(rows), np.concatenate(weights))
        return top_by_count(trie, self.top_c).to_draft()

    def _context_row(self, tokens: list[int], length: int) -> np.ndarray | None:
        """The continuation of the tail's earlier occurrence in this very sequence (prompt + output so far), as
        one row. It counts ``CONTEXT_SHARE`` times as much as all the datastore's rows together (3/4 of the root's
        weight: measured on HumanEval, SmolLM2: 1.26x ``ar`` at an equal share, 1.41x at 3x), so it is the first
        branch and the datastore's continuations fill the rest of the tree. Scores stay frequency ratios; the
        budget calibrates them against what the target accepts."""
        found, size = self.index.lookup(tokens, length, CONTEXT_MIN_NGRAM)
        if not found:
            return None
        self.context_hits += 1
        row = np.full((1, length), -1, dtype=np.int64)
        row[0, : len(found)] = found
        return row

    def stats(self) -> dict:
        if not self.retrieval_s:
            return {}
        ms = np.array(self.retrieval_s) * 1000
        lengths = np.array(self.match_lengths)
        return {
            "retrieval_ms_median": float(np.median(ms)),
            "retrieval_ms_p99": float(np.percentile(ms, 99)),
            "retrieval_ms_total": float(ms.sum()),
            "match_length_mean": float(lengths.mean()),
            "match_length_hist": {int(k): int(v) for k, v in zip(*np.unique(lengths, return_counts=True))},
            "no_match_steps": int((lengths == 0).sum()),
            "draft_tokens_mean": float(np.mean(self.draft_sizes)),
            "memory_hits": self.memory_hits,
            "context_hits": self.context_hits,
            "datastore_tokens": self.store.num_tokens,
        }


def build(ctx) -> Drafter:
    _, store = ctx.store(ctx.datastore)
    # REST samples up to 5,000 matches (the --budget paper default); with the budget choosing a few nodes, 1,000
    # give the same top counts at a fifth of the cost (docs/rest.md)
    memory = OutputMemory(sizes=(4, 8, 12)) if ctx.opt("memory") else None  # matches of 4+ tokens, as before
    return RestDrafter(store, n_max=ctx.opt("n_max"), cont_len=ctx.opt("cont_len"), top_c=ctx.opt("top_c"),
                       max_matches=ctx.opt("max_matches"), memory=memory, memory_weight=ctx.opt("memory_weight"),
                       context=bool(ctx.opt("context")))
