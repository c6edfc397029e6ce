"""Writing atomically: a directory built in a temporary sibling and renamed into place (datastore builds, the
GGUF conversion cache), and a file written next to itself and renamed (manifests, the caches of measurements).

A directory's temporary sibling is ``.NAME.building-PID-*``; an interrupted writer leaves only that (nothing that
looks finished), and the next writer next to it removes the leftovers of writers whose process is gone, never a
live one's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

BUILDING = ".building-"


def new_build_dir(out: Path) -> Path:
    """An empty temporary sibling of ``out`` to build into (same file system, so the final rename is atomic),
    named after this process; leftovers of builds whose process is gone are removed first."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_builds(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}{BUILDING}{os.getpid()}-", dir=out.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; a datastore is ordinary shared data
    return tmp


def remove_stale_builds(out: Path) -> list[Path]:
    """Remove ``.NAME.building-PID-*`` / ``.NAME.old-PID`` folders of killed builds (their PID is not running);
    a live build's folder is left alone."""
    removed = []
    for path in out.parent.glob(f".{out.name}.*"):
        rest = path.name[len(out.name) + 2:]
        for prefix in (BUILDING[1:], "old-"):
            if rest.startswith(prefix) and path.is_dir():
                pid = rest[len(prefix):].split("-", 1)[0]
                if pid.isdigit() and not _alive(int(pid)):
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def replace_dir(tmp: Path, out: Path) -> None:
    """Move the finished ``tmp`` to ``out``; an old ``out`` is swapped out only now, then removed."""
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


def write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename (a reader sees the old file or the new one, never a part)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_cache(path: Path, text: str) -> None:
    """:func:`write_text` for caches: a cache that cannot be written costs time next run, never this one."""
    try:
        write_text(path, text)
    except OSError:
        pass
