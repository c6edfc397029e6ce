"""What this machine has now, read without torch: memory available to a new allocation."""

from __future__ import annotations

from pathlib import Path


def available_bytes() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` (Linux); 0 where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
