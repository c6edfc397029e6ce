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

import json
import os
from pathlib import Path

import numpy as np

from ..io.atomic import write_text
from ..errors import SpecdecError
from .ngram_index import SEPARATOR, NgramIndex

SIZES = (2, 4, 8, 12)  # n-gram lengths indexed (fewer than the context's: a memory holds far more tokens)
MAX_TOKENS = 262_144  # default bound; about 4 index entries and 200 bytes per token
PROMPT_TAIL = 32  # prompt tokens remembered before each output (what the output continues)
FORMAT = "specdec-memory"
VERSION = 1


def check_folder(folder) -> None:
    """Before any model loads: ``--memory`` must be a folder, or not exist yet (it is created at the end)."""
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise SpecdecError(f"--memory {folder}: not a directory")


class OutputMemory:
    def __init__(self, max_tokens: int = MAX_TOKENS, sizes=SIZES):
        if max_tokens < 1:
            raise SpecdecError(f"memory size must be >= 1 token, got {max_tokens}")
        self.max_tokens, self.sizes = int(max_tokens), sizes
        self.sequences: list[list[int]] = []
        self.index = NgramIndex(sizes, max_positions=32)
        self.added = self.forgotten = 0

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
        for seq in self.sequences:
            self.index.extend(seq + [SEPARATOR])

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
        """Write the memory to ``folder`` (created if needed): the token file first, then the manifest that names
        it, each in one rename, so a reader sees the old memory or the new one, never a mix."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        flat = np.array([t for seq in self.sequences for t in seq + [SEPARATOR]], dtype=np.int32)
        name = f"tokens-{os.getpid()}-{self.added}.npy"
        tmp = folder / f".{name}.tmp"
        with open(tmp, "wb") as f:
            np.save(f, flat)
        os.replace(tmp, folder / name)
        old = _manifest_file(folder)
        write_text(folder / "memory.json", json.dumps({
            "format": FORMAT, "version": VERSION, "tokenizer_fingerprint": fingerprint, "file": name,
            "tokens": int(flat.size), "sequences": len(self.sequences), "max_tokens": self.max_tokens}, indent=1))
        if old and old != name:
            (folder / old).unlink(missing_ok=True)

    @classmethod
    def load(cls, folder, fingerprint: str, vocab_size: int, max_tokens: int = MAX_TOKENS) -> "OutputMemory":
        """The memory kept in ``folder``; an empty one when the folder has none yet. A file of another tokenizer,
        or one that is not a memory, is one clear error."""
        memory = cls(max_tokens)
        folder = Path(folder)
        check_folder(folder)
        manifest_path = folder / "memory.json"
        if not manifest_path.is_file():
            return memory
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            raise SpecdecError(f"--memory {folder}: corrupt memory.json") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
            raise SpecdecError(f"--memory {folder}: memory.json is not a specdec memory (version {VERSION})")
        if manifest.get("tokenizer_fingerprint") != fingerprint:
            raise SpecdecError(f"--memory {folder} was written with another tokenizer; use another folder for "
                               "this model")
        name = manifest.get("file")
        path = folder / str(name)
        if not isinstance(name, str) or "/" in name or name.startswith(".") or not path.is_file():
            raise SpecdecError(f"--memory {folder}: memory.json names no token file of the folder")
        try:
            flat = np.load(path, allow_pickle=False, mmap_mode=None)
        except (OSError, ValueError, EOFError):
            raise SpecdecError(f"--memory {folder}: corrupt token file {name}") from None
        if flat.ndim != 1 or flat.dtype.kind not in "iu" or (flat.size and (flat.min() < SEPARATOR or
                                                                              flat.max() >= vocab_size)):
            raise SpecdecError(f"--memory {folder}: {name} holds no valid token ids for this model")
        seq: list[int] = []
        for t in flat.tolist():
            if t == SEPARATOR:
                memory.add(seq)
                seq = []
            else:
                seq.append(t)
        memory.add(seq)
        memory.added = 0
        return memory


def token_list(value) -> list[int]:
    """Token ids from JSON data (ValueError for anything else)."""
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                              for t in value):
        raise ValueError("not a list of token ids")
    return list(value)


def _manifest_file(folder: Path) -> str | None:
    try:
        return json.loads((folder / "memory.json").read_text()).get("file")
    except (OSError, ValueError, AttributeError):
        return None
