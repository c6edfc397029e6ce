"""``--memory DIR``: ``auto``'s memory of outputs kept in a folder across runs, safe to share between runs.

The folder holds ``memory.json`` (the manifest: format, tokenizer, the token file's name) and one token file
``tokens-PID-N.npy`` (int32 ids, sequences separated by ``-1``). Both are written in one rename each, the token
file first, so a reader sees the old memory or the new one, never a mix.

* **Shared by several runs**: a run that saves takes an exclusive ``flock`` on the folder, re-reads the memory the
  folder holds *now* and, when another run saved since this one loaded it, keeps that run's memory and appends its
  own new outputs (the oldest forgotten first beyond the size bound): no run's update is lost. Readers take a shared
  lock, so a writer never removes the token file a reader is about to open.
* **Hostile folders**: links are refused (``memory.json`` and the token file are the folder's own files, as in a
  datastore); a token file is read only after its header is checked, and only its newest entries that a memory of
  this size could hold (:func:`token_limit`), so a huge file costs no more memory than a full memory does.
* **Failures to write** (an unwritable folder, a full disk) are one :class:`SpecdecError` line, and the temporary
  and half-written files are removed.
"""

from __future__ import annotations

import fcntl
import io
import os
import stat
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from ..config import MAX_MEMORY_TOKENS
from ..errors import SpecdecError
from ..io.atomic import write_text
from ..io.jsonl import read_json
from .ngram_index import SEPARATOR

FORMAT = "specdec-memory"
VERSION = 1
MANIFEST = "memory.json"
MAX_MANIFEST_BYTES = 1 << 20  # a memory.json is a few hundred bytes
MAX_TOKENS_LIMIT = MAX_MEMORY_TOKENS  # the largest memory (--opt memory_tokens)
HEADER_BYTES = 4096  # the largest .npy header read (numpy writes 128 bytes)


def check_folder(folder) -> None:
    """Before any model loads: ``--memory`` is a folder this process can write (probed with an unnamed file that
    leaves nothing behind), or does not exist yet below one it can (it is created when the memory is saved); a
    memory in it passes :func:`precheck`."""
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise SpecdecError(f"--memory {folder}: not a directory")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SpecdecError(f"cannot write --memory {folder}: permission denied")
    if path.is_dir():
        try:
            with tempfile.TemporaryFile(dir=path):
                pass
        except OSError as err:
            raise SpecdecError(f"cannot write --memory {folder}: {err.strerror or err}") from None
        precheck(path)


def check_size(max_tokens) -> int:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise SpecdecError(f"memory size must be from 1 to {MAX_TOKENS_LIMIT:,} tokens, got {max_tokens}")
    return max_tokens


def token_limit(max_tokens: int) -> int:
    """Entries of a token file that a memory of ``max_tokens`` can hold: every sequence at least one token and its
    separator."""
    return 2 * max_tokens + 1


@contextmanager
def locked(folder: Path, exclusive: bool) -> Iterator[None]:
    """An ``flock`` on the folder itself (no lock file is left in it); a folder that cannot be opened for
    reading is read unlocked (a reader), or is the writer's error."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        if exclusive:
            raise
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # drops the lock


def read(folder, fingerprint: str, vocab_size: int | None, max_tokens: int) -> tuple[list[list[int]], str | None]:
    """``(sequences, token file name)`` of the memory in ``folder`` (oldest first, at most ``max_tokens`` tokens:
    the newest kept); ``([], None)`` when it holds none yet. Every problem is one clear error."""
    folder = Path(folder)
    manifest = _manifest(folder)
    if manifest is None:
        return [], None
    if manifest.get("tokenizer_fingerprint") != fingerprint:
        raise SpecdecError(f"--memory {folder} was written with another tokenizer; use another folder for this model")
    name = manifest["file"]
    with _token_file(folder, name) as (fh, dtype, count):
        take = min(count, token_limit(max_tokens))  # the newest entries a memory of this size holds
        fh.seek((count - take) * dtype.itemsize, os.SEEK_CUR)
        flat = np.fromfile(fh, dtype=dtype, count=take).astype(np.int64)
    if flat.size != take:
        raise SpecdecError(f"--memory {folder}: corrupt token file {name}")
    if flat.size and (flat.min() < SEPARATOR or (vocab_size is not None and flat.max() >= vocab_size)):
        raise SpecdecError(f"--memory {folder}: {name} holds no valid token ids for this model")
    return newest(split(flat), max_tokens), name


def precheck(folder) -> None:
    """Before any model loads: the memory in ``folder`` (if any) is one -- a manifest of ours, naming a plain token
    file of the folder with a valid header, no larger than the largest memory could write. Its tokens, tokenizer
    and vocabulary are checked when it is read."""
    folder = Path(folder)
    manifest = _manifest(folder)
    if manifest is not None:
        with _token_file(folder, manifest["file"]):
            pass


def _manifest(folder: Path) -> dict | None:
    """The checked ``memory.json`` of ``folder`` (None: there is none)."""
    path = folder / MANIFEST
    if path.is_symlink():
        raise SpecdecError(f"--memory {folder}: {MANIFEST} is a link; refusing to read it (a memory's files are its "
                           "own)")
    if not path.exists():
        return None
    try:
        manifest = read_json(path, MAX_MANIFEST_BYTES)
    except (OSError, ValueError):
        raise SpecdecError(f"--memory {folder}: corrupt {MANIFEST}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise SpecdecError(f"--memory {folder}: {MANIFEST} is not a specdec memory (version {VERSION})")
    name = manifest.get("file")
    if not isinstance(name, str) or "/" in name or "\0" in name or name.startswith(".") or Path(name).name != name:
        raise SpecdecError(f"--memory {folder}: {MANIFEST} names no token file of the folder")
    return manifest


@contextmanager
def _token_file(folder: Path, name: str):
    """``(file, dtype, entries)`` of the token file ``name``, positioned after its header: a plain file of the
    folder (never a link, a FIFO or a device), with a valid 1-D integer header, of the size the header says, and no
    more entries than the largest memory writes."""
    path = folder / name
    if path.is_symlink():
        raise SpecdecError(f"--memory {folder}: {name} is a link; refusing to read it (a memory's files are its own)")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a FIFO does not block
    except FileNotFoundError:
        raise SpecdecError(f"--memory {folder}: {MANIFEST} names no token file of the folder") from None
    except OSError as err:
        raise SpecdecError(f"--memory {folder}: cannot read {name} ({err.strerror or err})") from None
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno())
        if not stat.S_ISREG(size.st_mode):
            raise SpecdecError(f"--memory {folder}: {name} is not a plain file; refusing to read it")
        dtype, count = _header(fh, size.st_size)
        if dtype is None:
            raise SpecdecError(f"--memory {folder}: corrupt token file {name}")
        if count > token_limit(MAX_TOKENS_LIMIT):
            raise SpecdecError(f"--memory {folder}: {name} holds {count:,} entries, more than the largest memory "
                               f"({MAX_TOKENS_LIMIT:,} tokens) writes; not a specdec memory")
        yield fh, dtype, count


def _header(fh, size: int):
    """``(dtype, entries)`` from a .npy header of a 1-D integer array that fills the rest of the file exactly;
    ``(None, 0)`` for anything else."""
    try:
        version = np.lib.format.read_magic(fh)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = reader(fh, max_header_size=HEADER_BYTES)
    except Exception:  # numpy's header parser raises ValueError, SyntaxError, ... and quotes the bytes
        return None, 0
    if len(shape) != 1 or dtype.kind not in "iu" or dtype.itemsize > 8 or fh.tell() + shape[0] * dtype.itemsize != size:
        return None, 0
    return dtype, shape[0]


def split(flat: np.ndarray) -> list[list[int]]:
    """The non-empty sequences of a separated token array (one pass in NumPy, one slice per sequence)."""
    cuts = np.flatnonzero(flat == SEPARATOR)
    starts, ends = np.concatenate([[0], cuts + 1]), np.concatenate([cuts, [flat.size]])
    tokens = flat.tolist()
    return [tokens[s:e] for s, e in zip(starts.tolist(), ends.tolist()) if e > s]


def newest(sequences: list[list[int]], max_tokens: int) -> list[list[int]]:
    """The newest sequences that fit in ``max_tokens`` tokens (the last one alone cut to its tail)."""
    kept, total = [], 0
    for seq in reversed(sequences):
        if total + len(seq) > max_tokens:
            if not kept:
                kept.append(seq[-max_tokens:])
            break
        kept.append(seq)
        total += len(seq)
    return kept[::-1]


def save(folder, fingerprint: str, vocab_size: int | None, sequences: list[list[int]], fresh: int,
         base: str | None, max_tokens: int) -> tuple[list[list[int]], str]:
    """Write the memory to ``folder`` (created if needed) under the folder's lock, merged with what another run
    saved there since this one read it (``base``: the token file it read, None if none). ``fresh``: how many of the
    last ``sequences`` this run added. Returns ``(sequences written, token file name)``; a failure is one
    :class:`SpecdecError` line and leaves the folder as it was."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with locked(folder, exclusive=True):
            on_disk, current = read(folder, fingerprint, vocab_size, max_tokens)
            if current != base:  # another run saved since we read: keep its memory, add this run's outputs
                sequences = newest(on_disk + sequences[len(sequences) - fresh:], max_tokens)
            name = _write(folder, fingerprint, sequences, max_tokens)
            if current and current != name:
                (folder / current).unlink(missing_ok=True)
    except OSError as err:
        raise SpecdecError(f"cannot save --memory {folder}: {err.strerror or err}") from None
    return sequences, name


def _write(folder: Path, fingerprint: str, sequences: list[list[int]], max_tokens: int) -> str:
    """The token file, then the manifest naming it; on any failure both new files are removed."""
    flat = np.array([t for seq in sequences for t in (*seq, SEPARATOR)], dtype=np.int32)
    name = f"tokens-{os.getpid()}-{time.time_ns()}.npy"  # unique: a second save of this process never collides
    tmp, final = folder / f".{name}.tmp", folder / name
    done = False
    data = io.BytesIO()
    np.save(data, flat)  # in memory first: numpy's own file writes report a short write without its errno
    try:
        with open(tmp, "wb") as fh:
            fh.write(data.getbuffer())
        os.replace(tmp, final)
        write_text(folder / MANIFEST, json_text(fingerprint, name, flat.size, len(sequences), max_tokens))
        done = True
    finally:
        tmp.unlink(missing_ok=True)
        if not done:
            final.unlink(missing_ok=True)
    return name


def json_text(fingerprint: str, name: str, tokens: int, sequences: int, max_tokens: int) -> str:
    import json

    return json.dumps({"format": FORMAT, "version": VERSION, "tokenizer_fingerprint": fingerprint, "file": name,
                       "tokens": int(tokens), "sequences": sequences, "max_tokens": max_tokens}, indent=1)
