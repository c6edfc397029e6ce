"""REST retrieval over a suffix-array datastore: longest suffix match, continuations, frequency trie.

Algorithm 1 of REST (He et al. 2024): try the last ``n_max`` tokens of the context, then one fewer, ... and
stop at the first length with at least one exact match in the datastore. Every matching position is a
context whose continuation is a draft candidate; we take up to ``max_matches`` of them spread evenly over the
match range of the suffix array (REST's reference code takes the first 5000), cut each to ``cont_len`` tokens
(never across a document separator). Counting them in a frequency trie and keeping its ``top_c`` most frequent
nodes (Algorithm 2) is ``trees.count_trie`` / ``trees.top_by_count``.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SpecdecError
from ..machine import available_bytes
from . import format as fmt, search


@dataclass
class Shard:
    data: np.ndarray  # uint8 token bytes (memory-mapped)
    sa: np.ndarray  # int32 byte offsets of token-aligned, non-separator suffixes, sorted (memory-mapped)
    keys: np.ndarray | None = None  # top-level index: first bytes of every key_stride-th suffix (search.sample_keys)
    key_stride: int = search.KEY_STRIDE

    def __post_init__(self):
        self.data_u8, self.sa_i32 = search.as_arrays(self.data, self.sa)
        if self.keys is None:  # stores built before the index existed: sampled once, at load
            self.keys = search.sample_keys(self.data_u8, self.sa_i32, self.key_stride)
        self.keys = np.ascontiguousarray(self.keys, dtype=np.uint8)  # a few MB: held in memory, stays in cache


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
        self.arrays = search.shard_lists([s.data_u8 for s in shards], [s.sa_i32 for s in shards],
                                         [s.keys for s in shards], [s.key_stride for s in shards])

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
        populate = fits_in_memory(sum(int(e.get("bytes", 0)) for e in manifest["files"].values()))
        shards = [Shard(_load_npy(folder, s["data"], populate), _load_npy(folder, s["sa"], populate),
                        _load_npy(folder, s["keys"]) if s.get("keys") else None,
                        int(s.get("key_stride", search.KEY_STRIDE))) for s in manifest["shards"]]
        for entry, shard in zip(manifest["shards"], shards):
            problem = structure_problem(shard, int(manifest["token_width"]), int(manifest["vocab_size"]))
            if problem:
                raise SpecdecError(f"datastore {folder} is corrupt ({entry['data']}: {problem}); rebuild it, or check "
                                   f"it with `specdec build-datastore --verify --out {folder}`")
        store = cls(folder, manifest, shards)
        store.retrieve([0], 1, 1, 1)  # compiled code loaded (or compiled) now, not in the first decoding step
        return store

    @property
    def num_tokens(self) -> int:
        return int(self.manifest["num_tokens"])

    def encode(self, ids) -> bytes:
        return fmt.encode_tokens(list(ids), self.width).tobytes()

    def tail(self, context: list[int], n_max: int) -> np.ndarray:
        """The last ``n_max`` tokens of ``context`` as the searches take them (big-endian bytes)."""
        return np.frombuffer(self.encode(context[-n_max:]) if n_max > 0 and context else b"", dtype=np.uint8)

    def longest_match(self, context: list[int], n_max: int) -> tuple[int, list[tuple[int, int]]]:
        """Longest suffix of ``context`` (at most ``n_max`` tokens) found in the datastore, and its ranges."""
        n, found = search.longest_all(*self.arrays, self.tail(context, n_max), self.width, n_max)
        if n == 0:
            return 0, []
        return int(n), [(int(lo), int(hi)) if k == n else (0, 0) for k, lo, hi in found.tolist()]

    def retrieve(self, context: list[int], n_max: int = 16, cont_len: int = 10, max_matches: int = 5000) -> Retrieval:
        """Continuations (up to ``max_matches``, evenly spread over the match range) of the longest match."""
        n, total, rows = search.retrieve(*self.arrays, self.tail(context, n_max), self.width, n_max, max_matches,
                                         max(cont_len, 0), self.separator)
        if n == 0 or cont_len < 1:
            return Retrieval(int(n), int(total), np.empty((0, max(cont_len, 0)), dtype=np.int64))
        return Retrieval(int(n), int(total), rows)


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
    stride = shard.key_stride
    if stride < 1 or shard.keys.shape != (-(-sa.size // stride), search.KEY_BYTES):
        return "the top-level index does not fit the suffix array"
    rows = np.unique(np.linspace(0, shard.keys.shape[0] - 1, min(64, shard.keys.shape[0])).astype(np.int64))
    if rows.size and not np.array_equal(shard.keys[rows], search.sample_keys(data, sa[rows * stride], 1)):
        return "the top-level index does not match the suffix array"
    return None


def _load_npy(folder: Path, name: str, populate: bool = False) -> np.ndarray:
    """A read-only memory map of ``name``; ``populate``: with its page tables filled at once (``MAP_POPULATE``),
    so drafting never takes a page fault -- the first touch of each 4 kB page otherwise costs a few microseconds
    per random read and made up most of the 99th-percentile step (docs/benchmarks.md)."""
    try:
        if populate and hasattr(mmap, "MAP_POPULATE"):
            with open(folder / name, "rb") as fh:
                major, minor = np.lib.format.read_magic(fh)
                read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read_header(fh)
                if not fortran and int(np.prod(shape)) > 0:
                    mapped = mmap.mmap(fh.fileno(), 0, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
                    return np.frombuffer(mapped, dtype=dtype, count=int(np.prod(shape)), offset=fh.tell()).reshape(shape)
        return np.load(folder / name, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as err:
        raise SpecdecError(f"datastore {folder}: cannot read {name} ({err})") from None


def fits_in_memory(nbytes: int, share: float = 0.5) -> bool:
    """Whether ``nbytes`` is under ``share`` of the memory available now (False where that is unknown)."""
    return nbytes < share * available_bytes()
