"""Memory across requests: the target's verified outputs, kept for later drafts (SuffixDecoding's global tree;
llama.cpp's dynamic n-gram cache).

Repeated and agentic workloads ask similar things again: what the target wrote for one request is the best draft
for the next similar one. An :class:`OutputMemory` keeps finished generations (the prompt's tail and the output)
in one :class:`~specdec_cli.drafting.ngram_index.NgramIndex`, bounded in tokens: when a new generation does not
fit, the oldest ones are forgotten first. It lives as long as its drafter (every prompt of a ``--batch-file`` or a
``bench`` run shares it) and is kept across processes only when asked (``--memory DIR``: :meth:`save` /
:meth:`load`), so benchmark runs stay reproducible by default. Drafts only: verification is unchanged, so a
memory, even a hostile file, can cost speed but never change the output.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import numpy as np

from ..errors import SpecdecError
from . import memory_folder
from .memory_folder import check_folder, check_size  # noqa: F401 - check_folder: the commands' pre-check
from .ngram_index import SEPARATOR, NgramIndex

SIZES = (2, 4, 8, 12)  # n-gram lengths indexed (fewer than the context's: a memory holds far more tokens)
MAX_TOKENS = 262_144  # default bound; about 4 index entries and 200 bytes per token
PROMPT_TAIL = 32  # prompt tokens remembered before each output (what the output continues)


class OutputMemory:
    def __init__(self, max_tokens: int = MAX_TOKENS, sizes=SIZES):
        self.max_tokens, self.sizes = check_size(max_tokens), sizes
        self.sequences: list[list[int]] = []
        self.index = NgramIndex(sizes, max_positions=32)
        self.added = self.forgotten = 0
        self.base: str | None = None  # the token file of --memory this memory was read from (None: none)
        self.vocab_size: int | None = None  # the model's, when read from a folder

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.sequences)

    def add(self, tokens: list[int]) -> None:
        """Remember one finished sequence; the oldest are forgotten first when it would not fit."""
        tokens = [int(t) for t in tokens[-self.max_tokens:]]
        if not tokens:
            return
        self.sequences.append(tokens)
        self.added += 1
        total = self.num_tokens
        if total <= self.max_tokens:
            self.index.extend(tokens + [SEPARATOR])
            return
        while total > self.max_tokens * 3 // 4 and len(self.sequences) > 1:  # forget a quarter at once: the
            total -= len(self.sequences.pop(0))  # index is rebuilt only once per quarter of its size
            self.forgotten += 1
        self._reindex()

    def remember(self, prompt: list[int], output: list[int]) -> None:
        self.add(list(prompt[-PROMPT_TAIL:]) + list(output))

    def _reindex(self) -> None:
        self.index.clear()
        self.index.extend([t for seq in self.sequences for t in (*seq, SEPARATOR)])  # one pass: as one by one

    def continuations(self, context: list[int], length: int, max_rows: int = 32) -> tuple[int, np.ndarray]:
        """``(matched n-gram length, rows of up to length tokens, -1 padded)`` after the longest remembered tail."""
        return self.index.lookup(context, length, max_rows)

    # -- checkpoints (bench --resume) --------------------------------------------------------------------------

    def state(self) -> dict:
        return {"sequences": [list(seq) for seq in self.sequences], "added": self.added, "forgotten": self.forgotten}

    def load_state(self, state: dict) -> None:
        """Continue from :meth:`state`'s answer: the same sequences, indexed as adding them one by one had (the
        index is a pure function of them)."""
        from ..io.state import count

        sequences = [token_list(seq) for seq in state["sequences"]]
        if sum(len(seq) for seq in sequences) > self.max_tokens:
            raise ValueError("more tokens than the memory holds")
        self.sequences = sequences
        self.added, self.forgotten = count(state["added"]), count(state["forgotten"])
        self._reindex()

    # -- kept across processes ----------------------------------------------------------------------------------

    def save(self, folder, fingerprint: str) -> None:
        """Write the memory to ``folder`` (:func:`memory_folder.save`: under the folder's lock, merged with what
        another run saved there since this memory was read); a failure is one SpecdecError line."""
        fresh = min(self.added, len(self.sequences))  # this run's outputs: the newest sequences
        self.sequences, self.base = memory_folder.save(folder, fingerprint, self.vocab_size, self.sequences, fresh,
                                                       self.base, self.max_tokens)
        self.added = 0  # saved: a later save adds only what comes after
        self._reindex()

    @classmethod
    def load(cls, folder, fingerprint: str, vocab_size: int, max_tokens: int = MAX_TOKENS) -> "OutputMemory":
        """The memory kept in ``folder``; an empty one when the folder has none yet. A file of another tokenizer,
        one that is not a memory, or a link is one clear error; at most ``max_tokens`` (the newest) are read."""
        memory = cls(max_tokens)
        folder = Path(folder)
        check_folder_exists(folder)
        with memory_folder.locked(folder, exclusive=False) if folder.is_dir() else nullcontext():
            memory.sequences, memory.base = memory_folder.read(folder, fingerprint, vocab_size, memory.max_tokens)
        memory.vocab_size = vocab_size
        memory._reindex()
        return memory


def check_folder_exists(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise SpecdecError(f"--memory {folder}: not a directory")


def token_list(value) -> list[int]:
    """Token ids from JSON data (ValueError for anything else)."""
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                              for t in value):
        raise ValueError("not a list of token ids")
    return list(value)
