"""REST retrieval over a suffix-array datastore: longest suffix match, continuations, frequency trie.

Algorithm 1 of REST (He et al. 2024): try the last ``n_max`` tokens of the context, then one fewer, ... and
stop at the first length with at least one exact match in the datastore. Every matching position is a
context whose continuation is a draft candidate; we take up to ``max_matches`` of them spread evenly over the
match range of the suffix array (REST's reference code takes the first 5000), cut each to ``cont_len`` tokens
(never across a document separator). Counting them in a frequency trie and keeping its ``top_c`` most frequent
nodes (Algorithm 2) is ``trees.count_trie`` / ``trees.top_by_count``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SpecdecError
from . import format as fmt, search


@dataclass
class Shard:
    data: np.ndarray  # uint8 token bytes (memory-mapped)
    sa: np.ndarray  # int32 byte offsets of token-aligned, non-separator suffixes, sorted (memory-mapped)

    def __post_init__(self):
        self.data_u8, self.sa_i32 = search.as_arrays(self.data, self.sa)

    def match_range(self, query: bytes) -> tuple[int, int]:
        """[lo, hi) of suffix-array entries whose suffix starts with ``query`` (token-aligned bytes)."""
        lo, hi = search.match_range(self.data_u8, self.sa_i32, np.frombuffer(query, dtype=np.uint8))
        return int(lo), int(hi)

    def longest_match(self, context: np.ndarray, width: int, n_max: int) -> tuple[int, int, int]:
        k, lo, hi = search.longest_match(self.data_u8, self.sa_i32, context, width, n_max)
        return int(k), int(lo), int(hi)


@dataclass
class Retrieval:
    match_length: int  # tokens of the context that matched (0: no match at any length)
    match_count: int  # matching positions in the datastore (all shards)
    continuations: np.ndarray  # [k, cont_len] token ids, -1 after the end of a continuation


class SuffixArrayDatastore:
    """A loaded (memory-mapped) suffix-array datastore."""

    def __init__(self, folder: Path, manifest: dict, shards: list[Shard]):
        self.folder, self.manifest, self.shards = folder, manifest, shards
        self.width = int(manifest["token_width"])
        self.separator = fmt.separator(self.width)

    @classmethod
    def load(cls, folder: str | Path, fingerprint: str | None = None, verify: bool = False) -> "SuffixArrayDatastore":
        """Open ``folder``; refuse a missing/corrupt/truncated datastore or one built with another tokenizer.

        Sizes are always checked (cheap); ``verify`` also recomputes every sha256 (reads all the data).
        """
        folder = Path(folder)
        manifest = fmt.read_manifest(folder)
        if fingerprint is not None:
            fmt.check_tokenizer(folder, manifest, fingerprint)
        fmt.check_files(folder, manifest, verify=verify)
        shards = [Shard(_load_npy(folder, s["data"]), _load_npy(folder, s["sa"])) for s in manifest["shards"]]
        for entry, shard in zip(manifest["shards"], shards):
            problem = structure_problem(shard, int(manifest["token_width"]), int(manifest["vocab_size"]))
            if problem:
                raise SpecdecError(f"datastore {folder} is corrupt ({entry['data']}: {problem}); rebuild it, or check "
                                   f"it with `specdec build-datastore --verify --out {folder}`")
        return cls(folder, manifest, shards)

    @property
    def num_tokens(self) -> int:
        return int(self.manifest["num_tokens"])

    def encode(self, ids) -> bytes:
        return fmt.encode_tokens(list(ids), self.width).tobytes()

    def longest_match(self, context: list[int], n_max: int) -> tuple[int, list[tuple[int, int]]]:
        """Longest suffix of ``context`` (at most ``n_max`` tokens) found in the datastore, and its ranges."""
        tail = self.encode(context[-n_max:]) if n_max > 0 and context else b""
        found = [shard.longest_match(np.frombuffer(tail, dtype=np.uint8), self.width, n_max) for shard in self.shards]
        n = max((k for k, _, _ in found), default=0)
        if n == 0:
            return 0, []
        return n, [(lo, hi) if k == n else (0, 0) for k, lo, hi in found]

    def retrieve(self, context: list[int], n_max: int = 16, cont_len: int = 10, max_matches: int = 5000) -> Retrieval:
        """Continuations (up to ``max_matches``, evenly spread over the match range) of the longest match."""
        n, ranges = self.longest_match(context, n_max)
        total = sum(hi - lo for lo, hi in ranges)
        if n == 0 or cont_len < 1:
            return Retrieval(n, total, np.empty((0, max(cont_len, 0)), dtype=np.int64))
        rows = [self._continuations(shard, picks, n, cont_len)
                for shard, picks in zip(self.shards, _spread(ranges, max_matches)) if picks.size]
        return Retrieval(n, total, np.concatenate(rows))

    def _continuations(self, shard: Shard, picks: np.ndarray, n: int, cont_len: int) -> np.ndarray:
        """The ``cont_len`` tokens after each picked match, -1 from the first separator on."""
        w = self.width
        starts = np.asarray(shard.sa[picks], dtype=np.int64) + n * w
        offsets = starts[:, None] + np.arange(cont_len * w, dtype=np.int64)[None, :]
        np.minimum(offsets, shard.data.size - 1, out=offsets)  # the data ends with a separator: reads stay inside
        tokens = fmt.decode_tokens(np.asarray(shard.data)[offsets], w)
        live = np.cumprod(tokens != self.separator, axis=1).astype(bool)
        return np.where(live, tokens, -1)


SAMPLE = 2048  # suffix-array entries and tokens checked when a shard is opened


def structure_problem(shard: Shard, width: int, vocab_size: int) -> str | None:
    """Cheap checks of one shard (a few thousand reads, whatever its size): what is wrong, or None.

    Catches the corruption that keeps file sizes (and so passes the size check): the data must end with a
    separator and hold token ids below the vocabulary size; suffix-array entries must be token-aligned offsets
    inside the data, in sorted order.
    """
    data, sa = shard.data, shard.sa
    if data.ndim != 1 or sa.ndim != 1 or data.dtype != np.uint8 or sa.dtype != np.int32:
        return "unexpected array shapes or types"
    if data.size < width or data.size % width:
        return f"{data.size} data bytes is not a whole number of {width}-byte tokens"
    separator = fmt.separator(width)
    if int(fmt.decode_tokens(np.asarray(data[-width:]), width)[0]) != separator:
        return "the data does not end with a document separator"
    tokens = data.size // width
    at = np.unique(np.linspace(0, tokens - 1, min(SAMPLE, tokens)).astype(np.int64)) * width
    ids = fmt.decode_tokens(np.asarray(data)[at[:, None] + np.arange(width)[None, :]], width).reshape(-1)
    if ((ids >= vocab_size) & (ids != separator)).any():
        return "token ids outside the vocabulary"
    if sa.size:
        picks = np.unique(np.linspace(0, sa.size - 1, min(SAMPLE, sa.size)).astype(np.int64))
        offsets = np.asarray(sa[picks], dtype=np.int64)
        if (offsets < 0).any() or (offsets > data.size - width).any() or (offsets % width).any():
            return "suffix-array entries outside the data"
        at = offsets[:, None] + np.arange(8 * width)[None, :]
        windows = np.asarray(data)[np.minimum(at, data.size - 1)].astype(np.int16)
        windows[at >= data.size] = -1  # past the end sorts first, as a shorter suffix does
        keys = [tuple(row) for row in windows.tolist()]
        if any(a > b for a, b in zip(keys, keys[1:])):
            return "the suffix array is not sorted"
    return None


def _spread(ranges: list[tuple[int, int]], limit: int) -> list[np.ndarray]:
    """Suffix-array indices per shard: all matches, or ``limit`` of them evenly spaced over all shards' ranges."""
    counts = np.array([hi - lo for lo, hi in ranges], dtype=np.int64)
    total = int(counts.sum())
    picks = np.arange(total, dtype=np.int64) if total <= limit else (np.arange(limit, dtype=np.int64) * total) // limit
    bounds = np.concatenate([[0], np.cumsum(counts)])
    out = []
    for (lo, _), a, b in zip(ranges, bounds[:-1], bounds[1:]):
        mine = picks[(picks >= a) & (picks < b)]
        out.append(mine - a + lo)
    return out


def _load_npy(folder: Path, name: str) -> np.ndarray:
    from ..errors import SpecdecError

    try:
        return np.load(folder / name, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as err:
        raise SpecdecError(f"datastore {folder}: cannot read {name} ({err})") from None
