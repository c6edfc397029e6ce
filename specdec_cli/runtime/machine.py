"""Facts about this machine, read in one place: the CPU's name, memory available and used, torch's threads.

Everything here but :func:`set_threads` works without torch.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux reports them (``/proc/cpuinfo``; empty elsewhere), read once."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            text = f.read(1 << 16)  # bounded: the first CPU's entry is well within 64 KiB
    except OSError:
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def available_bytes() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` (Linux); 0 where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux/macOS ``ru_maxrss``)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def set_threads(threads: int | None) -> None:
    """``torch.set_num_threads`` (before loading: kernel plans and forward-time profiles are per thread count);
    ``threads`` was checked where it entered (``config.RunSettings``)."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def openmp_waits() -> str:
    """How OpenMP's workers wait between parallel regions, as the environment said when specdec was imported (what
    libgomp read at torch's import; a vLLM engine's start gives its processes the user's environment back later):
    a product's time at several threads depends on it (``specdec_cli/__init__.py``)."""
    from .. import OPENMP_ENV

    return "omp {}/{}".format(*OPENMP_ENV)


def setup_key() -> str:
    """This CPU, torch and its threads, OpenMP's waits, and whether weights move into huge pages: what a cached
    measurement (kernel plans, forward-time profiles) holds for."""
    import torch

    from .hugepages import available

    return (f"{cpu_name()}|{os.cpu_count()}|torch {torch.__version__}|threads {torch.get_num_threads()}|"
            f"{openmp_waits()}|hugepages {available()}")
