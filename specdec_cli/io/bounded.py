"""Bounded reads: every read of a user's file or stream stops one byte past its limit, a chunk at a time (a pipe
that never ends, or ``/dev/zero``, costs the limit and no more; Ctrl-C is seen between chunks). Imports nothing
heavy: the command line reads its prompts with it before torch or numpy load."""

from __future__ import annotations

from pathlib import Path

CHUNK = 1 << 20  # read granularity: a MiB, so Ctrl-C is seen between chunks


def read_chunks(stream, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``stream``, read a chunk at a time (one more than ``limit``: too large)."""
    parts, size = [], 0
    while size <= limit:
        chunk = stream.read(min(CHUNK, limit + 1 - size))
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return parts[0][:0].join(parts) if parts else b""  # bytes, or text from a text-only stream


def read_bounded(path: str | Path, limit: int) -> bytes:
    """At most ``limit`` bytes of ``path``, read in chunks; ValueError when it holds more (OSError when it cannot
    be read). A device or a pipe that never ends costs ``limit`` bytes, not all of memory."""
    with open(path, "rb") as fh:
        data = read_chunks(fh, limit)
    if len(data) > limit:
        raise ValueError(f"larger than {limit:,} bytes")
    return data
