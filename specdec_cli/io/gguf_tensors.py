"""The tensors of a GGUF file, without its metadata values: each tensor's name, gguf type and bytes (a read-only
view of the file). ``--kernels blocks`` needs nothing else.

Why not ``gguf.GGUFReader``: it parses every metadata value first, a tokenizer's vocabulary included; Gemma-3's
262,144 tokens took ~7 s of its ~9 s attach on the Intel Xeon VM. Here the values are skipped by their lengths.

The layout (GGUF v2 and v3, little-endian): ``GGUF``, version (u32), tensor count (u64), metadata count (u64);
each metadata entry a key (u64 length + bytes), a value type (u32) and a value (an array: element type u32, count
u64, elements); each tensor a name, dimension count (u32), dimensions (u64, innermost first), type (u32) and
offset (u64) into the data, which starts at the next multiple of ``general.alignment`` (32 by default). Every
length and count is checked against the bytes left, so a damaged file gives a ValueError, never a huge loop.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"GGUF"
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes (gguf's spec)
STRING, ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32  # gguf's GGUF_DEFAULT_ALIGNMENT
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS


@dataclass
class Tensor:
    name: str
    type_name: str  # gguf's GGMLQuantizationType name: "Q4_1", "Q4_K", "F32", ...
    data: np.ndarray  # uint8 [rows, bytes per row] for a 2-D tensor (rows: its outer dimension); read-only


class _Cursor:
    """Bounded little-endian reads from the file's mapping."""

    def __init__(self, buf: np.ndarray):
        self.buf, self.at = buf, 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.at + n > len(self.buf):
            raise ValueError(f"truncated at byte {self.at} (wanted {n} more)")
        out = memoryview(self.buf[self.at: self.at + n])
        self.at += n
        return out

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> bytes:
        return bytes(self.take(self.u64()))

    def skip_value(self, kind: int) -> None:
        if kind in FIXED:
            self.take(FIXED[kind])
        elif kind == STRING:
            self.take(self.u64())
        elif kind == ARRAY:
            elem, count = self.u32(), self.u64()
            if elem in FIXED:
                self.take(FIXED[elem] * count)
                return
            if count > (len(self.buf) - self.at) // 8:  # every element holds at least a u64 length
                raise ValueError(f"an array of {count:,} elements overruns the file")
            for _ in range(count):
                self.skip_value(elem)
        else:
            raise ValueError(f"unknown metadata value type {kind}")


def tensors(path: str | Path) -> list[Tensor]:
    """Every tensor of the GGUF file ``path`` (v2/v3), its bytes a read-only mapping of the file. Raises ValueError
    (or OSError) for a file that is not one, or is damaged."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    buf = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(buf)
    if bytes(cur.take(4)) != MAGIC:
        raise ValueError("not a GGUF file")
    version = cur.u32()
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (2 and 3 are read)")
    n_tensors, n_kv = cur.u64(), cur.u64()
    alignment = DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key, kind = cur.string(), cur.u32()
        if key == b"general.alignment" and kind == 4:
            alignment = cur.u32()
        else:
            cur.skip_value(kind)
    if n_tensors > (len(buf) - cur.at) // 24:  # a tensor's entry is at least 24 bytes
        raise ValueError(f"{n_tensors:,} tensors overrun the file")
    infos = []
    for _ in range(n_tensors):
        name, n_dims = cur.string().decode("utf-8", "replace"), cur.u32()
        if not 1 <= n_dims <= MAX_DIMS:
            raise ValueError(f"tensor {name!r}: {n_dims} dimensions")
        dims = [cur.u64() for _ in range(n_dims)]
        infos.append((name, dims, GGMLQuantizationType(cur.u32()), cur.u64()))
    if not alignment or alignment & (alignment - 1):
        raise ValueError(f"alignment {alignment}")
    start = -(-cur.at // alignment) * alignment
    out = []
    for name, dims, kind, offset in infos:
        block, size = GGML_QUANT_SIZES[kind]
        count = int(np.prod(dims, dtype=np.int64))
        if dims[0] % block:
            raise ValueError(f"tensor {name!r}: rows of {dims[0]} weights in blocks of {block}")
        nbytes = count // block * size
        if start + offset + nbytes > len(buf):
            raise ValueError(f"tensor {name!r} overruns the file")
        data = buf[start + offset: start + offset + nbytes]
        rows = count // dims[0]
        out.append(Tensor(name, kind.name, data.reshape(rows, -1) if len(dims) > 1 else data))
    return out
