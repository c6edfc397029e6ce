"""GGUF files, de-quantized once by transformers into a checkpoint cached under ``$SPECDEC_CACHE/converted``.

* **Complete, or converted again**: a conversion is written into a temporary sibling and renamed into place
  (:mod:`specdec_cli.io.atomic`), its marker ``specdec-converted.json`` last, listing every file with its size. A
  folder whose files do not match its marker (a truncated copy, a deleted file) is converted again before it is
  loaded, and one that transformers cannot load is converted again once (:func:`rebuild`); when even a fresh
  conversion does not load, the error names the folder.
* **16-bit targets read 16-bit files**: ``--dtype bfloat16|float16`` loads a copy of the conversion stored at that
  dtype (made once from the float32 one, in its own folder). Loading a float32 file at 16 bits maps all of it while
  casting, so the file's 4 bytes a weight showed in the peak memory (SmolLM2's load peaked at 1394 MB against
  658 MB from its bfloat16 copy, issue 35); rounding at conversion or at load gives the same bits. On the CPU only
  (``io.models.load_model``): a GPU's copy of the weights is not in this process's memory.
* **One conversion at a time**: a process converting holds an ``flock`` on ``.NAME.lock`` beside the folder; a second
  one waits for it, then loads the first one's result instead of converting again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import SpecdecError
from .aliases import cache_root
from .atomic import new_build_dir, replace_dir
from .jsonl import read_json

MARKER = "specdec-converted.json"
MAX_MARKER_BYTES = 1 << 20  # a marker lists a handful of files
STORED = ("bfloat16", "float16")  # the dtypes a conversion is also kept at (besides float32)


def cache_dir(gguf: Path, stored: str | None = None) -> Path:
    """The folder of ``gguf``'s conversion (float32; ``stored``: its copy at that 16-bit dtype)."""
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:16]
    return cache_root() / "converted" / (f"{gguf.stem}-{key}" + (f"-{stored}" if stored else ""))


def stored_of(out: Path) -> str | None:
    """The 16-bit dtype a conversion folder holds (None: float32), from its name."""
    return next((d for d in STORED if out.name.endswith(f"-{d}")), None)


def marker_id(out: Path) -> tuple[int, int] | None:
    """Which conversion ``out`` holds now (its marker's inode and time; None: none)."""
    try:
        st = (out / MARKER).stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def complete(out: Path) -> bool:
    """Whether ``out`` holds a finished conversion: its marker, and every file the marker lists at its size
    (markers written before sizes were listed are trusted; a load that fails converts them again)."""
    try:
        marker = read_json(out / MARKER, MAX_MARKER_BYTES)
    except (OSError, ValueError):
        return False
    files = marker.get("files") if isinstance(marker, dict) else None
    if not isinstance(marker, dict) or (files is not None and not isinstance(files, dict)):
        return False
    for name, size in (files or {}).items():
        path = out / str(name)
        if "/" in str(name) or path.is_symlink() or not path.is_file() or path.stat().st_size != size:
            return False
    return True


@contextmanager
def conversion_lock(out: Path) -> Iterator[None]:
    """Hold ``.NAME.lock`` beside ``out`` (waiting for a process that converts the same file)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out.parent / f".{out.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            say(f"waiting for another process converting the same GGUF file into {out}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # drops the lock


def convert(gguf: Path, progress: bool = True, stored: str | None = None) -> Path:
    """De-quantize a GGUF file to a transformers directory (cached; ``stored``: at that 16-bit dtype, from the
    float32 one); returns the directory."""
    out = cache_dir(gguf, stored)
    if complete(out):
        return out
    if stored:
        convert(gguf, progress)
    with conversion_lock(out):
        if complete(out):  # converted by the process we waited for
            return out
        _convert(gguf, out, progress)
    return out


def rebuild(gguf: Path, out: Path, seen: tuple[int, int] | None, why: str) -> Path:
    """Convert ``gguf`` again into ``out``, whose conversion ``seen`` (:func:`marker_id`) would not load -- unless
    another process has converted it again meanwhile."""
    with conversion_lock(out):
        if marker_id(out) == seen or not complete(out):
            say(f"the converted model in {out} cannot be loaded ({why}); converting {gguf.name} again")
            if stored_of(out):
                convert(gguf)  # the float32 conversion it is made from
            _convert(gguf, out, progress=True)
    return out


def source_gguf(source: str) -> Path | None:
    """The GGUF file a converted folder ``source`` was made from (None: ``source`` is no conversion of ours)."""
    folder = Path(source)
    if folder.parent != cache_root() / "converted":
        return None
    try:
        marker = read_json(folder / MARKER, MAX_MARKER_BYTES)
        gguf = Path(marker["gguf"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return gguf if gguf.is_file() and cache_dir(gguf, stored_of(folder)) == folder else None


def _convert(gguf: Path, out: Path, progress: bool) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    stored = stored_of(out)
    src, kw = (cache_dir(gguf), {}) if stored else (gguf.parent, dict(gguf_file=gguf.name))
    if progress:
        what = f"a {stored} copy of its conversion" if stored else "a transformers checkpoint"
        say(f"first use of {gguf.name}{f' at {stored}' if stored else ''}: de-quantizing it into {what} under "
            f"{out.parent} (once)")
    t0 = time.perf_counter()

    def read():
        tok = AutoTokenizer.from_pretrained(src, **kw)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, stored or "float32"), **kw,
                                                     **({} if stored else {"quantization_config":
                                                                           GgufConfig(dequantize=True)}))
        return tok, model

    try:
        try:
            tok, model = read()
        except Exception as err:  # noqa: BLE001 - a 16-bit copy: its float32 source may be damaged; remake it once
            if not stored:
                raise
            rebuild(gguf, src, marker_id(src), f"{type(err).__name__}: {str(err).splitlines()[0]}")
            tok, model = read()
    except Exception as err:  # noqa: BLE001
        what = f"the converted model {src}" if stored else f"GGUF file {gguf}"
        raise SpecdecError(f"could not read {what}: {type(err).__name__}: {str(err).splitlines()[0]}") from None
    tmp = new_build_dir(out)
    if progress:
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        say(f"writing the de-quantized model ({size / 1e9:.2f} GB) to the cache...")
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        files = {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file()}
        (tmp / MARKER).write_text(json.dumps({"gguf": str(gguf.resolve()), "files": files}))  # last: complete
        replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if progress:
        say(f"converted in {time.perf_counter() - t0:.0f} s; later runs load it from the cache")


def say(message: str) -> None:
    sys.stderr.write(f"specdec: {message}\n")
    sys.stderr.flush()
