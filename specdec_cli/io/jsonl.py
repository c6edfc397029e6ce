"""The one JSON-lines reader: prompt files, corpora, bench records -- every problem one clear line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Iterator

from ..errors import SpecdecError


def iter_jsonl(path: str | Path, what: str = "file", objects: bool = True) -> Iterator:
    """The values of a (optionally gzipped) JSON-lines file, blank lines skipped; with ``objects`` every value must
    be a JSON object. Missing, binary or malformed files are a :class:`SpecdecError` naming ``what``, the path
    and the line."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as err:
                    raise SpecdecError(f"{what} {path}: line {n} is not JSON ({err.msg})") from None
                if objects and not isinstance(value, dict):
                    raise SpecdecError(f"{what} {path}: line {n} is not a JSON object")
                yield value
    except OSError as err:
        raise SpecdecError(f"cannot read {what} {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise SpecdecError(f"{what} {path} is not a JSON-lines text file (not UTF-8)") from None

