"""The one JSON reader: whole JSON files (manifests, caches, checkpoints, ``--memory``) and JSON-lines files (prompt
files, corpora, bench records) -- every read bounded in size and nesting depth, every problem one clear line.

``json.loads`` recurses once per nesting level, so ``[`` repeated 100,000 times is a ``RecursionError``, not a
``ValueError``; and a path may name ``/dev/zero`` or a pipe that never ends. :func:`loads` refuses text nested
deeper than :data:`MAX_DEPTH` before parsing it, :func:`read_json` reads at most ``limit`` bytes, in chunks (so
Ctrl-C stops it), and :func:`iter_jsonl` at most :data:`MAX_LINE_BYTES` per line.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import SpecdecError
from .bounded import read_bounded

MAX_DEPTH = 100  # far deeper than anything specdec writes (about 10 levels), far below Python's recursion limit
MAX_JSON_BYTES = 64 << 20  # the largest JSON file read whole: manifests and caches are kilobytes, checkpoints MBs
MAX_LINE_BYTES = 64 << 20  # the longest JSON line: a bench record with every token of every generation fits
MAX_JSONL_BYTES = 1 << 30  # a JSON-lines file read whole (bench records, prompts): far beyond any real one
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # a JSON string (brackets inside it do not nest)
_STEP = np.zeros(256, np.int8)  # per byte: +1 opens a level, -1 closes one
_STEP[list(b"[{")], _STEP[list(b"]}")] = 1, -1


def nesting(data: bytes) -> int:
    """The deepest nesting of brackets in JSON text (vectorised; strings are skipped only when the quick count,
    which includes their brackets, is already too deep)."""

    def deepest(raw: bytes) -> int:
        return int(np.cumsum(_STEP[np.frombuffer(raw, np.uint8)], dtype=np.int32).max(initial=0))

    depth = deepest(data)
    return depth if depth <= MAX_DEPTH else deepest(_STRING.sub(b'""', data))


def loads(text: str | bytes):
    """``json.loads`` for data from disk (maybe hostile): ValueError for text that is not JSON, not UTF-8, or nested
    deeper than :data:`MAX_DEPTH` -- never a RecursionError."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    if nesting(data) > MAX_DEPTH:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(data)
    except RecursionError:  # a guard behind the guard: the scan above should have caught it
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels") from None


def read_json(path: str | Path, limit: int = MAX_JSON_BYTES):
    """The JSON value in ``path``: OSError when it cannot be read, ValueError when it is larger than ``limit``, not
    UTF-8 JSON, or nested too deep (a UnicodeDecodeError is a ValueError)."""
    return loads(read_bounded(path, limit))


def iter_jsonl(path: str | Path, what: str = "file", objects: bool = True, limit: int | None = None) -> Iterator:
    """The values of a (optionally gzipped) JSON-lines file, blank lines skipped; with ``objects`` every value must
    be a JSON object. Missing, binary or malformed files, lines longer than :data:`MAX_LINE_BYTES`, values nested
    too deep and (given ``limit``: for files read whole into memory) more than ``limit`` bytes in all are a
    :class:`SpecdecError` naming ``what``, the path and the line."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            n = total = 0
            while line := fh.readline(MAX_LINE_BYTES + 1):
                n, total = n + 1, total + len(line)
                if len(line) > MAX_LINE_BYTES:
                    raise SpecdecError(f"{what} {path}: line {n} is longer than {MAX_LINE_BYTES:,} bytes")
                if limit is not None and total > limit:
                    raise SpecdecError(f"{what} {path} is larger than {limit:,} bytes")
                if not line.strip():
                    continue
                value = _line_value(line, what, path, n)
                if objects and not isinstance(value, dict):
                    raise SpecdecError(f"{what} {path}: line {n} is not a JSON object")
                yield value
    except (OSError, EOFError) as err:  # EOFError, gzip.BadGzipFile (an OSError): a damaged .gz
        raise SpecdecError(f"cannot read {what} {path}: {getattr(err, 'strerror', None) or err}") from None


def _line_value(line: bytes, what: str, path: Path, n: int):
    try:
        return loads(line)
    except UnicodeDecodeError:
        raise SpecdecError(f"{what} {path} is not a JSON-lines text file (not UTF-8)") from None
    except json.JSONDecodeError as err:
        raise SpecdecError(f"{what} {path}: line {n} is not JSON ({err.msg})") from None
    except ValueError as err:
        raise SpecdecError(f"{what} {path}: line {n}: {err}") from None
