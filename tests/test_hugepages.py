"""Weights in 2 MB pages (runtime/hugepages.py): the same bits, tied weights still one tensor, nothing moved where
the system or the memory says no. And a CPU load's other memory: no GPU compiler mapped (io/models.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from specdec_cli.runtime import hugepages

from conftest import tiny_gemma3, tiny_llama


def test_pack_keeps_every_array_bit_for_bit(monkeypatch):
    monkeypatch.setattr(hugepages, "_room", lambda nbytes: True)
    monkeypatch.setattr(hugepages, "available", lambda: True)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((3, 5)).astype(np.float32), rng.integers(0, 256, 1000, dtype=np.uint8),
              rng.standard_normal(7).astype(np.float16), np.zeros((0, 4), np.float32)]
    packed = hugepages.pack(arrays)
    for a, b in zip(arrays, packed):
        assert b.dtype == a.dtype and b.shape == a.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))
        assert b.ctypes.data % hugepages.ALIGN == 0 and not np.shares_memory(a, b)


@pytest.mark.parametrize("make, dtype", [(tiny_llama, torch.float32), (tiny_gemma3, torch.bfloat16)])
def test_adopt_moves_the_weights_and_keeps_ties_and_outputs(make, dtype, monkeypatch):
    monkeypatch.setattr(hugepages, "_room", lambda nbytes: True)
    monkeypatch.setattr(hugepages, "available", lambda: True)
    model = make().to(dtype)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        before = model(ids).logits
    pointers = {p.data_ptr() for p in model.parameters()}
    assert hugepages.adopt(model) == sum(p.nbytes for p in model.parameters())
    assert hugepages.adopted(model)
    assert not pointers & {p.data_ptr() for p in model.parameters()}
    assert model.lm_head.weight is model.model.embed_tokens.weight and all(p.dtype == dtype for p in model.parameters())
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, before)


def test_nothing_moves_when_switched_off_or_short_of_memory(monkeypatch):
    model = tiny_llama()
    monkeypatch.setenv("SPECDEC_HUGEPAGES", "0")
    assert not hugepages.available() and hugepages.adopt(model) == 0 and not hugepages.adopted(model)
    monkeypatch.delenv("SPECDEC_HUGEPAGES")
    monkeypatch.setattr(hugepages, "available", lambda: True)
    monkeypatch.setattr(hugepages, "HEADROOM", 1 << 60)  # more than any machine has
    arrays = [np.ones(4, np.float32)]
    assert hugepages.adopt(model) == 0 and hugepages.pack(arrays)[0] is arrays[0]


@pytest.mark.skipif(not hugepages.available(), reason="no transparent huge pages here")
def test_the_arena_is_madvised_for_huge_pages():
    """The arena's mapping is eligible for transparent huge pages (``THPeligible``; whether the kernel found free
    2 MB pages for it depends on the machine's memory, so that is not asserted)."""
    room = hugepages.arena(8 << 20)
    room[:] = 1
    start, inside = room.ctypes.data, False
    for line in Path("/proc/self/smaps").read_text().split("\n"):
        head = line.split(" ")[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= start < hi
        elif inside and line.startswith("THPeligible:"):
            assert line.split()[1] == "1", line
            return
    pytest.skip("this kernel's smaps does not say THPeligible")


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a CUDA device Triton is wanted")
def test_a_cpu_load_leaves_the_gpu_compiler_unloaded_and_importable():
    """A CPU load of the shipped model (the GGUF's conversion included, when it runs first) does not map Triton (a
    GPU kernel compiler, 65-70 MiB of library), torch remembers it as absent, and a later ``import triton``
    (vLLM's) still works where it is installed."""
    import subprocess
    import sys

    code = ("import sys, importlib.util\n"
            "from specdec_cli.io import models\n"
            "loaded = models.load_model('smollm2-135m', 'float32', 'cpu')\n"
            "assert 'torch._dynamo' in sys.modules and 'triton' not in sys.modules, 'triton loaded'\n"
            "from torch.utils._triton import has_triton_package\n"
            "assert not has_triton_package()\n"
            "if importlib.util.find_spec('triton') is not None:\n"
            "    import triton\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
