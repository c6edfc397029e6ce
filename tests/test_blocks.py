"""GGUF weights read as stored (``--kernels blocks``, issue 35): the tiles de-quantize ``Q4_1``/``Q8_0`` blocks in
registers to the very float32 weights gguf's reference gives, so a product read from the blocks has the bits of the
``dot`` strategy on the de-quantized weights; SmolLM2's shipped file attaches to every linear layer, and greedy
decoding is the float32 path's."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from specdec_cli.runtime import blocks, decoder, kernels, tiles
from specdec_cli.runtime import forward as engine
from specdec_cli.runtime.dot import dot_rows_threads

from conftest import CHAT_PROMPTS, tiny_gemma3, tiny_llama

pytestmark = pytest.mark.skipif("dot" not in kernels.STRATEGIES, reason="numba not installed")
QUANT = {tiles.Q4_1: "Q4_1", tiles.Q8_0: "Q8_0", tiles.Q5_0: "Q5_0", tiles.Q4_K: "Q4_K", tiles.Q6_K: "Q6_K"}
HALVES = {tiles.Q4_1: slice(0, 4), tiles.Q8_0: slice(0, 2), tiles.Q5_0: slice(0, 2), tiles.Q4_K: slice(0, 4),
          tiles.Q6_K: slice(208, 210)}  # the float16 scales (and minima) of each stored block


def random_blocks(fmt: int, n_out: int, k_dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Blocks of ``fmt`` with random quants and float16 scales (and minima), and gguf's float32 de-quantization."""
    from gguf import GGMLQuantizationType, quants

    rng = np.random.default_rng(seed)
    size, at = int(tiles.BLOCK_BYTES[fmt]), HALVES[fmt]
    raw = rng.integers(0, 256, (n_out, k_dim // int(tiles.STORED[fmt]), size), dtype=np.uint8)
    scales = rng.normal(0, 0.02, (n_out, raw.shape[1], (at.stop - at.start) // 2)).astype(np.float16)
    raw[..., at] = scales.view(np.uint8).reshape(raw[..., at].shape)
    raw = np.ascontiguousarray(raw.reshape(n_out, -1))
    return raw, quants.dequantize(raw, getattr(GGMLQuantizationType, QUANT[fmt])).astype(np.float32)


@pytest.mark.parametrize("fmt", list(QUANT))
@pytest.mark.parametrize("shape", [(37, 32), (1536, 576), (5, 96)])  # leftover outputs; SmolLM2's; one tile
def test_blocks_give_the_bits_of_dot_on_the_dequantized_weights_for_every_row_and_thread(fmt, shape):
    n_out, k_dim = shape[0], shape[1] * (8 if tiles.STORED[fmt] > 32 else 1)  # k-quants: super-blocks of 256
    raw, weights = random_blocks(fmt, n_out, k_dim)
    x = np.random.default_rng(1).normal(size=(13, k_dim)).astype(np.float32)
    for n in (1, 2, 3, 4, 5, 8, 9, 13):  # every tile height (AVX-512: 8 and 4 rows too) and their mixes
        for threads in (1, 2):
            from_blocks, from_floats = np.empty((n, n_out), np.float32), np.empty((n, n_out), np.float32)
            dot_rows_threads(x[:n], raw, from_blocks, threads, fmt)
            dot_rows_threads(x[:n], weights, from_floats, 1)
            assert np.array_equal(from_blocks, from_floats), (n, threads)
    bound = 1e-5 * (np.abs(x) @ np.abs(weights).T)  # float32 summation error over K products, scaled
    assert np.all(np.abs(from_blocks - (x.astype(np.float64) @ weights.T.astype(np.float64))) <= bound + 1e-6)


@pytest.mark.parametrize("fmt", list(QUANT))
def test_the_numpy_fallback_dequantizes_as_gguf_does(fmt, monkeypatch):
    """Without numba the tiles module's plain path (its fallback, on ggml_blocks.dequantize) gives gguf's weights,
    bit for bit."""
    k_dim = 2 * int(tiles.STORED[fmt])
    raw, weights = random_blocks(fmt, 6, k_dim)
    x = np.random.default_rng(2).normal(size=(3, k_dim)).astype(np.float32)
    src = tiles.__file__
    namespace = {"__name__": "tiles_fallback"}
    code = open(src, encoding="utf-8").read().replace("from .jit import COMPILED, njit", "COMPILED = False\nnjit = None")
    code = code.replace("from .ggml_blocks import", "from specdec_cli.runtime.ggml_blocks import")
    exec(compile(code, src, "exec"), namespace)  # noqa: S102 - the module's own source, numba switched off
    y = np.empty((3, 6), np.float32)
    namespace["dot_tiled_span"](x, raw, y, fmt, True, 0, 6)
    assert np.allclose(y, x @ weights.T, rtol=1e-5, atol=1e-5)
    from specdec_cli.runtime.ggml_blocks import dequantize

    assert np.array_equal(dequantize(raw, fmt).view(np.uint32), weights.view(np.uint32))


@pytest.mark.slow
def test_smollm2_reads_its_shipped_blocks_with_the_float32_models_greedy_output(smollm2):
    """Every linear layer of SmolLM2's shipped file (Q4_1, and the tied head's Q8_0) attaches bit for bit, and greedy
    decoding through the blocks gives the float32 path's tokens, for ``ar`` and ``auto`` (measured, not guaranteed:
    the float32 plan may sum some row counts in MKL's order; the blocks give the ``dot`` strategy's bits)."""
    from specdec_cli import api

    target, _ = api.load("smollm2-135m", kernel_mode="blocks")
    summary = target.info["blocks"]
    assert summary["layers"] == 211 and summary["formats"] == {"Q4_1": 210, "Q8_0": 1} and not summary["mismatched"]
    assert summary["block_bytes"] < 0.2 * summary["float32_bytes"]
    layers = [m for m in target.model.modules() if isinstance(m, kernels.FastLinear)]
    assert all("blocks" in m._packed and m.table[1] == "blocks" for m in layers)
    from specdec_cli.runtime import profile  # the budget prices the blocks' steps with their own forward times

    assert profile.model_key(target.model) != profile.model_key(smollm2.model)
    settings = api.RunSettings(max_new_tokens=24)
    for prompt in CHAT_PROMPTS[:2]:
        ids = api.encode_prompt(target, prompt)
        plain = api.run(smollm2, ids, api.make_drafter("ar", smollm2, [], settings), settings).tokens
        for method in ("ar", "auto"):
            drafter = api.make_drafter(method, target, [], settings)
            assert api.run(target, ids, drafter, settings).tokens == plain, method


@pytest.mark.slow
def test_gemma3_reads_every_layer_of_its_shipped_file_including_the_k_quants():
    """Gemma-3's shipped Q4_K_M file: its k-quant layers (``attn_output`` and ``ffn_down``, whose 1024 and 2048
    inputs hold whole 256-weight super-blocks) attach bit for bit beside the ``Q5_0``/``Q8_0`` ones, and greedy
    ``ar`` through the blocks gives the float32 path's tokens."""
    from specdec_cli import api

    target, _ = api.load("gemma3-270m", kernel_mode="blocks")
    summary = target.info["blocks"]
    assert summary["formats"] == {"Q4_K": 27, "Q6_K": 9, "Q5_0": 81, "Q8_0": 10} and not summary["mismatched"]
    plain, _ = api.load("gemma3-270m")
    settings = api.RunSettings(max_new_tokens=24)
    ids = api.encode_prompt(target, "def add(a, b):", raw=True)
    expected = api.run(plain, ids, api.make_drafter("ar", plain, [], settings), settings).tokens
    assert api.run(target, ids, api.make_drafter("ar", target, [], settings), settings).tokens == expected


@pytest.mark.parametrize("args, says", [
    (["--kernels", "blocks", "--dtype", "bfloat16"], "leave --dtype at float32"),
    (["--kernels", "blockz"], "--kernels must be"),
])
def test_cli_rejects_blocks_it_cannot_read_in_one_line(args, says):
    done = subprocess.run([sys.executable, "-m", "specdec_cli.cli", "generate", "--model", "smollm2-135m", *args,
                           "hello"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_blocks_need_a_model_converted_from_gguf(tmp_path):
    from conftest import tiny_llama
    from specdec_cli import api
    from specdec_cli.errors import SpecdecError

    model = tiny_llama(vocab=16)
    model.save_pretrained(tmp_path / "tiny")
    with pytest.raises(SpecdecError, match="was not converted from one"):
        api.attach_blocks(api.LoadedModel(model, None, str(tmp_path / "tiny"), False, {"source": str(tmp_path)}))
    assert blocks.adopt(torch.nn.Linear(4, 4), ["nt"] * 3) == ({}, ["nt"] * 3)


def test_numba_cache_follows_every_compiling_module(monkeypatch, tmp_path):
    """The compiled cache's folder is named by the text of every module that compiles or writes inlined IR: a
    change to the tiles alone (which dot, dot16, attend and fused inline), or to the blocks' IR alone, moves every
    function to a fresh cache; the user's NUMBA_CACHE_DIR wins."""
    from pathlib import Path

    from specdec_cli.runtime import jit

    monkeypatch.setattr(jit, "USER_CACHE", False)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    before = jit.cache_dir()
    assert before.parent == tmp_path / "numba" and len(before.name) == 16
    read = Path.read_bytes
    for edited in ("tiles.py", "ggml_blocks.py"):
        monkeypatch.setattr(Path, "read_bytes", lambda p, e=edited: read(p) + (b"# edited" if p.name == e else b""))
        assert jit.cache_dir() not in (before, None), edited
    monkeypatch.setattr(jit, "USER_CACHE", True)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    assert jit.cache_dir() is None


@pytest.mark.parametrize("threads", [1, 2])
def test_blocks_layer_takes_bias_3d_and_strided_inputs(threads):
    """A layer with blocks as the engine calls it (``FastLinear`` inside ``kernels.active``): a bias, a 3-D input
    that is not contiguous, torch's threads; the bits of ``dot`` on the de-quantized weights plus the bias."""
    raw, weights = random_blocks(tiles.Q5_0, 10, 64)
    plain_layer = torch.nn.Linear(64, 10)
    with torch.no_grad():
        plain_layer.weight.copy_(torch.from_numpy(weights))
    setattr(plain_layer, blocks.ATTR, (tiles.Q5_0, raw))
    layer = kernels.FastLinear(plain_layer, {})
    x = torch.randn(2, 64, 3).transpose(1, 2)  # [2, 3, 64], strided
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode(), kernels.active():
            y = layer(x)
    finally:
        torch.set_num_threads(before)
    plain = np.empty((6, 10), np.float32)
    dot_rows_threads(np.ascontiguousarray(x.reshape(6, 64).numpy()), weights, plain, 1)
    bias = plain_layer.bias.detach()
    assert y.shape == (2, 3, 10) and torch.equal(y, (torch.from_numpy(plain) + bias).view(2, 3, 10))


def with_blocks(make, monkeypatch, tmp_path):
    """A tiny model whose linear layers read random GGUF blocks (their de-quantized weights copied into the
    float32 ones), formats mixed per layer, one layer left on its float32 weight; kernels installed."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    model = make(vocab=16)
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    formats = [tiles.Q4_1, tiles.Q8_0, tiles.Q5_0]
    for i, linear in enumerate(linears[1:]):  # the first keeps its float32 weight (tiles format F32)
        raw, weights = random_blocks(formats[i % 3], linear.out_features, linear.in_features, seed=i)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(weights))
        setattr(linear, blocks.ATTR, (formats[i % 3], raw))
    kernels.install(model)
    assert decoder.decoder_for(model).fused is not None
    return model


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_a_blocks_models_rows_are_its_one_row_forwards_bit_for_bit(make, monkeypatch, tmp_path):
    """The compiled layers a blocks model's compared forwards run (runtime/fused.py): after a prefix longer than
    Gemma's sliding window, each row of a chain or a tree has the logits of feeding its path one token at a time,
    and those are close to the float32 tensor path's (the norms and activation round in their own fixed order)."""
    from specdec_cli.runtime import fused

    model = with_blocks(make, monkeypatch, tmp_path)
    calls, real = [], fused.Fused.forward
    monkeypatch.setattr(fused.Fused, "forward", lambda self, *a: calls.append(1) or real(self, *a))
    rng = np.random.default_rng(0)
    prefix = [int(t) for t in rng.integers(0, 16, 11)]
    cache = engine.new_cache(model)
    engine.forward_chain(model, cache, prefix, keep=0)
    base = cache.length
    big = [int(t) for t in rng.integers(0, 16, 70)]  # more than 64 rows: still the compiled layers
    for tokens, parents in [([3, 5, 7, 5, 2], None), ([3, 5, 9, 7, 5, 2], [-1, 0, 0, 2, 3]), (big, None)]:
        parents = parents or list(range(-1, len(tokens) - 2))
        got = engine.forward_tree(model, cache, tokens[0], tokens[1:], parents)
        engine.crop(cache, base)
        for i in range(len(tokens)):
            path, node = [], i - 1
            while node >= 0:
                path.insert(0, tokens[node + 1])
                node = parents[node]
            for t in [tokens[0], *path][:-1]:
                engine.forward_chain(model, cache, [t])
            one = engine.forward_chain(model, cache, [[tokens[0], *path][-1]])
            engine.crop(cache, base)
            assert torch.equal(one[0], got[i]), (len(tokens), i)
    rows = engine.forward_chain(model, cache, [3, 5, 7])
    assert calls, "the compared forwards ran the compiled layers"
    decoder.disable(model)  # the same weights through transformers' module code
    want = engine.forward_chain(model, engine.new_cache(model), prefix + [3, 5, 7])
    assert torch.allclose(rows, want[-3:], atol=1e-4)
