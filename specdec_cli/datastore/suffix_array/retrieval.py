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
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import SpecdecError
from ...runtime.machine import available_bytes
from .. import format as fmt
from . import search


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

        Sizes are always checked (cheap), and every value the compiled search indexes with (full passes over the
        memory maps: :func:`range_problem`); ``verify`` also recomputes every sha256 (reads all the data).
        """
        folder = Path(folder)
        manifest = fmt.read_manifest(folder)
        if fingerprint is not None:
            fmt.check_tokenizer(folder, manifest, fingerprint)
        fmt.check_files(folder, manifest, verify=verify)
        width, vocab = manifest["token_width"], manifest["vocab_size"]
        populate = fits_in_memory(sum(e["bytes"] for e in manifest["files"].values()))
        shards = []
        for entry in manifest["shards"]:
            data, sa = _load_npy(folder, entry["data"], populate), _load_npy(folder, entry["sa"], populate)
            keys = fmt.load_npy(folder, entry["keys"]) if entry.get("keys") else None
            stride = entry.get("key_stride", search.KEY_STRIDE)
            problem = range_problem(data, sa, width, vocab, entry)  # before anything reads data at sa's offsets
            if problem is None and keys is not None and (keys.dtype != np.uint8 or keys.ndim != 2):
                problem = entry["keys"], "not a 2-D uint8 array"
            if problem is None:
                shard = Shard(data, sa, keys, stride)
                problem = structure_problem(shard, width, entry)
            if problem:
                name, what = problem
                raise SpecdecError(f"datastore {folder} is corrupt ({name}: {what}); rebuild it, or check "
                                   f"it with `specdec build-datastore --verify --out {folder}`")
            shards.append(shard)
        store = cls(folder, manifest, shards)
        store.retrieve([0], 1, 1, 1)  # compiled code loaded (or compiled) now, not in the first decoding step
        return store

    def view(self) -> "SuffixArrayDatastore":
        """The store a drafter drafts from: this one (it holds no per-drafter state)."""
        return self

    @property
    def num_tokens(self) -> int:
        return int(self.manifest.get("num_tokens", sum(s.sa.size for s in self.shards)))

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


SAMPLE = 2048  # suffix-array entries checked for order when a shard is opened
CHUNK = 1 << 22  # entries per vectorised pass of the full checks (bounds their temporaries to a few tens of MB)


def range_problem(data: np.ndarray, sa: np.ndarray, width: int, vocab_size: int, entry: dict
                  ) -> tuple[str, str] | None:
    """Full checks of what the compiled search indexes with, whatever the files hold: ``(file, problem)`` or None.

    The data is a whole number of tokens ending with a separator, every token is below the vocabulary size (or a
    separator), and every suffix-array entry is a token-aligned offset inside the data. One vectorised pass over
    each memory map (min/max/alignment per chunk): about 0.15 s per 64 MB shard of 2-byte tokens. With these, no
    read of the search leaves its arrays and every drafted id is inside the vocabulary.
    """
    if data.ndim != 1 or data.dtype != np.uint8:
        return entry["data"], "not a 1-D uint8 array"
    if sa.ndim != 1 or sa.dtype != np.int32:
        return entry["sa"], "not a 1-D int32 array"
    if data.size < width or data.size % width:
        return entry["data"], f"{data.size} data bytes is not a whole number of {width}-byte tokens"
    separator = fmt.separator(width)
    if int(fmt.decode_tokens(np.asarray(data[-width:]), width)[0]) != separator:
        return entry["data"], "the data does not end with a document separator"
    if sa.size > data.size // width:
        return entry["sa"], "more suffix-array entries than tokens in the data"
    step = CHUNK * width
    for start in range(0, data.size, step):
        part = np.asarray(data[start:start + step])
        if width == 2:
            ids = part.view(">u2")
        else:  # 3 bytes: uint32 arithmetic on the byte columns (decode_tokens' int64 groups cost 4x the time)
            cols = part.reshape(-1, 3)
            ids = (cols[:, 0].astype(np.uint32) << 16) | (cols[:, 1].astype(np.uint32) << 8) | cols[:, 2]
        if ((ids >= vocab_size) & (ids != separator)).any():
            return entry["data"], "token ids outside the vocabulary"
    last = data.size - width  # the last token is a separator: no suffix starts there
    for start in range(0, sa.size, CHUNK):
        part = np.asarray(sa[start:start + CHUNK])
        if int(part.min()) < 0 or int(part.max()) >= last or (part % width).any():
            return entry["sa"], "suffix-array entries outside the data"
    return None


def structure_problem(shard: Shard, width: int, entry: dict | None = None) -> tuple[str, str] | None:
    """Sampled checks of one shard whose ranges :func:`range_problem` has checked: ``(file, problem)`` or None.

    The order of the suffix array (2,048 entries, whatever its size) and the top-level index (its shape, fully;
    its contents on 64 rows). Neither can make a read leave the arrays; an unsorted array or index only makes
    the search miss matches.
    """
    entry = entry or {"data": "data", "sa": "suffix array", "keys": "keys"}
    data, sa = shard.data, shard.sa
    if sa.size:
        picks = np.unique(np.linspace(0, sa.size - 1, min(SAMPLE, sa.size)).astype(np.int64))
        offsets = np.asarray(sa[picks], dtype=np.int64)
        at = offsets[:, None] + np.arange(8 * width)[None, :]
        windows = np.asarray(data)[np.minimum(at, data.size - 1)].astype(np.int16)
        windows[at >= data.size] = -1  # past the end sorts first, as a shorter suffix does
        keys = [tuple(row) for row in windows.tolist()]
        if any(a > b for a, b in zip(keys, keys[1:])):
            return entry["sa"], "the suffix array is not sorted"
    keys_name = entry.get("keys") or entry["sa"]
    stride = shard.key_stride
    if shard.keys.ndim != 2 or shard.keys.shape != (-(-sa.size // stride), search.KEY_BYTES):
        return keys_name, "the top-level index does not fit the suffix array"
    rows = np.unique(np.linspace(0, shard.keys.shape[0] - 1, min(64, shard.keys.shape[0])).astype(np.int64))
    if rows.size and not np.array_equal(shard.keys[rows], search.sample_keys(data, sa[rows * stride], 1)):
        return keys_name, "the top-level index does not match the suffix array"
    return None


def _load_npy(folder: Path, name: str, populate: bool = False) -> np.ndarray:
    """A read-only memory map of ``name``; ``populate``: with its page tables filled at once (``MAP_POPULATE``),
    so drafting never takes a page fault -- the first touch of each 4 kB page otherwise costs a few microseconds
    per random read and made up most of the 99th-percentile step (docs/benchmarks.md)."""
    if not (populate and hasattr(mmap, "MAP_POPULATE")):
        return fmt.load_npy(folder, name)
    try:
        with open(folder / name, "rb") as fh, warnings.catch_warnings():
            warnings.simplefilter("error")  # a header numpy only warns about is not one a build wrote
            major, minor = np.lib.format.read_magic(fh)
            read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(fh)
            if not fortran and int(np.prod(shape)) > 0:
                mapped = mmap.mmap(fh.fileno(), 0, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
                return np.frombuffer(mapped, dtype=dtype, count=int(np.prod(shape)), offset=fh.tell()).reshape(shape)
    except OSError as err:
        raise SpecdecError(f"datastore {folder}: cannot read {name} ({err.strerror or type(err).__name__})") from None
    except Exception:  # numpy's header parser raises ValueError, SyntaxError, ... and quotes the file's bytes
        raise SpecdecError(f"datastore {folder} is corrupt ({name}: not a readable NumPy array file); rebuild it"
                           ) from None
    return fmt.load_npy(folder, name)


def fits_in_memory(nbytes: int, share: float = 0.5) -> bool:
    """Whether ``nbytes`` is under ``share`` of the memory available now (False where that is unknown)."""
    return nbytes < share * available_bytes()
