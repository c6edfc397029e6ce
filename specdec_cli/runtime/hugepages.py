"""Weights in 2 MB pages: a model's large CPU tensors moved into anonymous memory that the kernel backs with
transparent huge pages (``madvise(MADV_HUGEPAGE)``, Linux).

Why (docs/profiling.md, "Weights in huge pages"): a decoding step streams every weight once, hundreds of megabytes
in 4 KB pages, so the step also walks a page table for every 4 KB it reads. llama.cpp reads its weights from a
mapped file, which this machine's page cache keeps in huge pages. Gemma-3's bfloat16 products at one row took 52.5
ms in 4 KB pages and 34 ms in 2 MB ones (one thread, Intel Xeon VM); the bits are the same, only where they live
changes.

Where the system offers no transparent huge pages (another OS, ``never`` in
``/sys/kernel/mm/transparent_hugepage/enabled``), or the copy would leave little memory, nothing moves.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from pathlib import Path

import numpy as np
import torch

PAGE = 2 << 20  # one huge page (x86-64, and arm64 with 4 KB base pages)
ALIGN = 64  # each tensor's offset in the arena: a cache line
HEADROOM = 1 << 30  # memory left available after the arena is made, or nothing moves (the old copies may be freed
# only at the end, when they share one mapped file)
MADV_HUGEPAGE, MADV_PAGEOUT = 14, 21  # <linux/mman.h> (MADV_PAGEOUT: Linux 5.4; older kernels refuse it, harmless)
CHUNK = 8 << 20  # bytes copied, then paged out, at a time
PAGE_4K = mmap.PAGESIZE  # the base page: the page-out covers whole base pages inside an array only
ATTR = "_specdec_hugepages"  # set on a model whose weights moved
SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def available() -> bool:
    """Whether this system backs madvised anonymous memory with transparent huge pages (``SPECDEC_HUGEPAGES=0``:
    never use them, for a measurement without)."""
    if not sys.platform.startswith("linux") or os.environ.get("SPECDEC_HUGEPAGES") == "0":
        return False
    try:
        return "[never]" not in SETTING.read_text()
    except OSError:
        return False


def _room(nbytes: int) -> bool:
    """Whether ``nbytes`` more leave :data:`HEADROOM` of the memory the kernel says is available."""
    try:
        line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return False
    return int(line.split()[1]) * 1024 >= nbytes + HEADROOM


_LIBC = None


def arena(nbytes: int) -> np.ndarray:
    """``nbytes`` of zeroed anonymous memory (``uint8``), 2 MB-aligned and madvised for huge pages before its first
    touch, so writing it faults in huge pages. Alive as long as any view of it."""
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
        _LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    size = -(-nbytes // PAGE) * PAGE
    mapping = mmap.mmap(-1, size + PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # a page more: to align
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    start = -(-addr // PAGE) * PAGE
    _LIBC.madvise(start, size, MADV_HUGEPAGE)  # a refusal leaves 4 KB pages: slower, the same bits
    return np.frombuffer(mapping, np.uint8, nbytes, start - addr)


def _bytes(t: torch.Tensor) -> np.ndarray:
    """A numpy view of ``t``'s bytes (any dtype, numpy's or not: bfloat16, float8)."""
    return t.reshape(-1).view(torch.uint8).numpy()


def usable(nbytes: int) -> bool:
    """Whether ``nbytes`` can move into huge pages here: the system offers them, and leaves :data:`HEADROOM`."""
    return available() and _room(nbytes)


def _offsets(sizes: list[int]) -> tuple[list[int], int]:
    """Each array's offset in an arena of them side by side (cache-line aligned), and the arena's size."""
    offsets, total = [], 0
    for n in sizes:
        offsets.append(total)
        total += -(-n // ALIGN) * ALIGN
    return offsets, total


def _place(room: np.ndarray, at: int, a: np.ndarray, files: list[tuple[int, int]]) -> np.ndarray:
    """``a`` copied into ``room`` at ``at``, :data:`CHUNK` bytes at a time, each chunk of ``a`` then paged out where
    a file backs it (so a 320 MB head never sits in memory twice)."""
    src = a.reshape(-1).view(np.uint8)
    for off in range(0, a.nbytes, CHUNK):
        room[at + off: at + min(off + CHUNK, a.nbytes)] = src[off: off + CHUNK]
        _page_out(src[off: off + CHUNK], files)
    return room[at: at + a.nbytes].view(a.dtype).reshape(a.shape)


def pack(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """``arrays`` (C-contiguous) copied side by side into one huge-page arena: the same dtypes, shapes and bits
    (``arrays`` themselves where they cannot move: :func:`usable`)."""
    offsets, total = _offsets([a.nbytes for a in arrays])
    if not arrays or not usable(total):
        return list(arrays)
    room, files = arena(total), _file_mappings()
    return [_place(room, at, a, files) for a, at in zip(arrays, offsets)]


def _file_mappings() -> list[tuple[int, int]]:
    """The address ranges of this process's file-backed mappings (a mapped checkpoint, a GGUF file)."""
    ranges = []
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            fields = line.split(None, 5)  # address, perms, offset, device, inode, path
            path = fields[5] if len(fields) == 6 else ""
            # a file on disk: not shared memory (/dev/shm, memfd, SysV), which a page-out would push to swap
            if path.startswith("/") and fields[4] != "0" and not path.startswith(("/dev/", "/memfd:", "/SYSV")) \
                    and not path.endswith("(deleted)"):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((lo, hi))
    except OSError:
        pass
    return ranges


def _page_out(a: np.ndarray, files: list[tuple[int, int]]) -> None:
    """Ask the kernel to drop the pages of ``a``, once copied, from this process's memory where they belong to a
    mapped file (``MADV_PAGEOUT``: they come back from the file if read again; the contents never change). A
    checkpoint's mapping lives until its last tensor has moved, so without this loading would peak at the model's
    size twice. Anonymous memory is freed with its tensor instead (paging it out could write it to swap)."""
    lo, hi = -(-a.ctypes.data // PAGE_4K) * PAGE_4K, (a.ctypes.data + a.nbytes) // PAGE_4K * PAGE_4K
    if hi > lo and any(start <= lo and hi <= end for start, end in files):
        _LIBC.madvise(lo, hi - lo, MADV_PAGEOUT)


def adopt(model: torch.nn.Module) -> int:
    """Move all of ``model``'s CPU parameters, small ones too (none then keeps a mapped checkpoint alive), into one
    huge-page arena (``param.data`` replaced, so tied parameters stay one object). Call it before anything keeps a
    view of the weights (the kernels' packed copies, a draft made from the target). Returns the bytes moved: 0 where
    huge pages are unavailable or the copy would not leave :data:`HEADROOM` of memory."""
    params = [p for p in model.parameters() if p.device.type == "cpu" and p.data.is_contiguous()
              and not p.data.is_quantized and not p.data.is_conj() and not p.data.is_neg()]
    offsets, total = _offsets([p.data.nbytes for p in params])
    if not params or not usable(total):
        return 0
    room, files = arena(total), _file_mappings()
    _trim()  # first the loader's freed heap (SmolLM2 bf16: ~34 MiB), so the arena does not add to it at the peak
    with torch.no_grad():
        for p, at in zip(params, offsets):  # one at a time: an old tensor of its own is freed as soon as it moved
            t = p.data
            p.data = torch.from_numpy(_place(room, at, _bytes(t), files)).view(t.dtype).view(t.shape)
    _trim()
    setattr(model, ATTR, True)
    return sum(p.data.nbytes for p in params)


def _trim() -> None:
    """Hand freed heap memory back to the system (glibc's ``malloc_trim``: freed chunks inside the heap stay
    resident otherwise)."""
    trim = getattr(_LIBC, "malloc_trim", None)  # glibc only (arena() loaded the C library)
    if trim is not None:
        trim(0)


def forget(model: torch.nn.Module) -> None:
    """``model`` is a copy of an adopted one (a deep copy's tensors are fresh, in 4 KB pages): not adopted."""
    model.__dict__.pop(ATTR, None)


def adopted(model: torch.nn.Module) -> bool:
    """Whether :func:`adopt` moved ``model``'s weights (its forward-time profile names it: runtime/profile.py)."""
    return getattr(model, ATTR, False)
