"""The lean decoding forward (runtime/decoder.py) computes what transformers' module code computes, and the numba
``dot`` kernel gives a row the same numbers whatever the number of rows beside it."""

from __future__ import annotations

import random

import pytest
import torch

from specdec_cli.runtime import decoder, kernels
from specdec_cli.runtime import forward as engine
from specdec_cli.runtime.kvcache import GrowingCache
from specdec_cli.engine.loop import Drafter, generate

from conftest import CHAT_PROMPTS, tiny_gemma3, tiny_llama


def stock_forward(model, cache, tokens, parents=None):
    """The same forward through transformers' module code (the lean path switched off for this call)."""
    saved = decoder._DECODERS.get(model, False)
    decoder.disable(model)
    try:
        return cache.forward(model, tokens, parents)
    finally:
        if saved is False:
            decoder._DECODERS.pop(model, None)
        else:
            decoder._DECODERS[model] = saved


def lean_forward(model, cache, tokens, parents=None):
    out = decoder.run(cache, model, tokens, parents, None)
    assert out is not None, "the lean path did not take this forward"
    return out


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
@pytest.mark.parametrize("windowed", [False, True])
def test_lean_forward_equals_the_module_forward(make, windowed):
    """One row, a chain and a tree, after a prefix longer than the sliding window, in a cache whose sliding layers
    show their window only (windowed) or everything (then one row takes a mask too)."""
    model = make(vocab=16)
    assert decoder.decoder_for(model) is not None
    rng = random.Random(0)
    prefix = [rng.randrange(16) for _ in range(11)]
    steps = [([4], None), ([3, 5, 7], None), ([3, 5, 7, 5, 2, 9, 1], [-1, -1, 0, 0, 1, 3]), ([6], None)]
    caches = [engine.new_cache(model if windowed else None, capacity=1) for _ in range(2)]
    for cache in caches:
        stock_forward(model, cache, prefix)
    for tokens, parents in steps:
        tree = parents is not None
        want = stock_forward(model, caches[0], tokens, parents)
        got = lean_forward(model, caches[1], tokens, parents)
        assert got.shape == want.shape
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (tokens, parents)
        if tree:  # keep the path root -> node 0 -> node 2 in both
            for cache in caches:
                engine.keep(cache, cache.length - len(tokens), [0, 1, 3])
        for a, b in zip(caches[0].layers, caches[1].layers):
            assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_logits_to_keep_and_no_logits(make):
    model = make(vocab=16)
    cache = engine.new_cache(model)
    assert engine.forward_chain(model, cache, [1, 2, 3], keep=0).shape[0] == 0
    last = engine.forward_chain(model, cache, [4, 5], keep=1)
    assert last.shape[0] == 1
    assert torch.allclose(last[0], stock_forward(model, engine.new_cache(model), [1, 2, 3, 4, 5])[-1], atol=1e-5)


@pytest.mark.parametrize("length, causal_layers", [(3, 2), (10, 1)])  # window 4: within it / beyond it
def test_a_prefill_from_an_empty_cache_takes_sdpa_causal_rule(monkeypatch, length, causal_layers):
    """A prompt's prefill passes SDPA ``is_causal`` instead of a mask wherever the mask is the plain causal one
    (every layer within the sliding window, the full-attention layer beyond it); the cache it leaves is the
    module code's, and a prefill after a cached prefix keeps its mask."""
    model = tiny_gemma3(vocab=16, window=4)
    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kw):
        calls.append((kw.get("is_causal", False), kw.get("attn_mask") is None))
        return sdpa(*args, **kw)

    tokens = [random.Random(length).randrange(16) for _ in range(length)]
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    cache = engine.new_cache(model)
    engine.forward_chain(model, cache, tokens, keep=0)
    assert calls.count((True, True)) == causal_layers and len(calls) == 2
    calls.clear()
    engine.forward_chain(model, cache, [1, 2], keep=0)  # after a prefix: the tree mask, never the causal rule
    assert (True, True) not in calls
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    theirs = engine.new_cache(model)
    stock_forward(model, theirs, tokens + [1, 2])
    for a, b in zip(cache.layers, theirs.layers):
        assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)


def test_greedy_generation_is_the_same_with_and_without_the_lean_path():
    model = tiny_gemma3(vocab=16)
    prompt = [1, 5, 2, 7, 3, 3, 9]
    lean = generate(model, prompt, Drafter(), max_new_tokens=24).tokens
    decoder.disable(model)
    stock = generate(model, prompt, Drafter(), max_new_tokens=24).tokens
    assert lean == stock


def test_unknown_architectures_and_disabled_models_take_the_module_path():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_embd=16, n_layer=1, n_head=2)).eval()
    assert decoder.decoder_for(gpt2) is None
    cache = engine.new_cache(gpt2)
    assert decoder.run(cache, gpt2, [1, 2], None, None) is None
    assert engine.forward_chain(gpt2, cache, [1, 2]).shape == (2, 16)
    model = tiny_llama()
    decoder.disable(model)
    assert decoder.decoder_for(model) is None


@pytest.mark.parametrize("change", ["dynamic rope", "eager attention", "offloaded"])
def test_setups_the_lean_path_does_not_reproduce_take_the_module_path(change):
    model = tiny_llama()
    if change == "dynamic rope":
        model.config.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    elif change == "eager attention":
        model.config._attn_implementation = "eager"
    else:
        model.model.layers[0]._hf_hook = object()
    assert decoder.decoder_for(model) is None


def test_casting_the_model_rebuilds_the_handles():
    model = tiny_llama(vocab=16)
    before = decoder.decoder_for(model)
    model.to(torch.bfloat16)
    after = decoder.decoder_for(model)
    assert after is not before and after.layers[0].norms[0][0].dtype == torch.bfloat16


def test_a_model_with_a_decoder_can_be_freed():
    import gc
    import weakref

    model = tiny_llama()
    assert decoder.decoder_for(model) is not None
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_other_cache_layers_take_the_module_path():
    from transformers.cache_utils import DynamicLayer

    model = tiny_llama()
    cache = GrowingCache(layer_class_to_replicate=DynamicLayer)
    assert decoder.run(cache, model, [1, 2], None, None) is None


def test_installing_kernels_rebuilds_the_handles(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    model = tiny_llama(vocab=16)
    before = decoder.decoder_for(model)
    kernels.install(model)
    after = decoder.decoder_for(model)
    assert after is not before
    assert isinstance(model.model.layers[0].self_attn.q_proj, kernels.FastLinear)
    assert after.layers[0].q.__self__ is model.model.layers[0].self_attn.q_proj


@pytest.mark.skipif("dot" not in kernels.STRATEGIES, reason="numba not installed")
def test_dot_kernel_gives_a_row_the_same_numbers_whatever_rows_are_beside_it():
    torch.manual_seed(0)
    linear = torch.nn.Linear(576, 192, bias=False)
    layer = kernels.FastLinear(linear, {b: "dot" for b in kernels.BUCKETS})
    x = torch.randn(1, 8, 576)
    with torch.inference_mode(), kernels.active():
        alone = torch.cat([layer(x[:, i: i + 1]) for i in range(8)], dim=1)
        together = layer(x)
    assert torch.equal(alone, together)
    assert torch.allclose(together, linear(x), rtol=1e-5, atol=1e-5)


def test_real_model_greedy_equals_transformers_generate(smollm2):
    """SmolLM2 through the lean path and the measured kernels gives transformers' own greedy output."""
    from specdec_cli import api

    for text in CHAT_PROMPTS[:2]:
        ids = api.encode_prompt(smollm2, text, max_new_tokens=32)
        ours = api.run(smollm2, ids, api.make_drafter("ar", smollm2), max_new_tokens=32).tokens
        with torch.inference_mode():
            out = smollm2.model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                                         attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        theirs = out[0, len(ids):].tolist()
        assert ours == theirs[: len(ours)], text


@pytest.mark.skipif("dot" not in kernels.STRATEGIES, reason="numba not installed")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("width", [1, 3])
def test_a_batchs_rows_attend_their_own_columns_as_sdpa_does(threads, width, monkeypatch):
    """runtime/attend.batch_rows: each row of a ragged batch over its own columns (a prefix, a sliding window, a
    tree's ancestors), the values SDPA gives over the padded batch up to rounding; wider rows are SDPA's."""
    from types import SimpleNamespace

    import torch.nn.functional as F

    from specdec_cli.runtime import attend
    from specdec_cli.runtime.batch_cache import BatchLayer

    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    torch.manual_seed(0)
    rows, heads, kv_heads, dim, capacity, end = 5, 6, 2, 16, 40, 33
    owner = SimpleNamespace(rows=rows, capacity=capacity, own_columns=True)
    layer = BatchLayer(owner)
    layer.allocate(kv_heads, dim, torch.float32, "cpu")
    layer._k.normal_(), layer._v.normal_()
    q = torch.randn(rows, heads, width, dim)
    spans = [(0, 7), (0, 30), (4, 12), (0, 1), (20, 30)]  # each row's prefix (or window) before its own positions
    mask = torch.full((rows, 1, width, end), float("-inf"))
    for r, (a, b) in enumerate(spans):
        mask[r, 0, :, a:b] = 0
        for i in range(width):  # a chain's positions see themselves and the ones before; every other skips one
            mask[r, 0, i, [b + j for j in range(i + 1) if r % 2 == 0 or j in (0, i)]] = 0
    got = attend.batch_rows(q, layer, mask, 0.25)
    want = F.scaled_dot_product_attention(q, layer._k[:, :, :end], layer._v[:, :, :end], attn_mask=mask, scale=0.25,
                                          enable_gqa=True).transpose(1, 2).reshape(rows, width, heads * dim)
    assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    holed = mask.clone()
    holed[1, 0, :, 10] = float("-inf")  # row 1 sees two spans: the boolean mask instead of a span
    want = F.scaled_dot_product_attention(q, layer._k[:, :, :end], layer._v[:, :, :end], attn_mask=holed, scale=0.25,
                                          enable_gqa=True).transpose(1, 2).reshape(rows, width, heads * dim)
    assert torch.allclose(attend.batch_rows(q, layer, holed, 0.25), want, rtol=1e-5, atol=1e-6)
    assert attend.batch_rows(torch.randn(rows, heads, attend.ROWS_MAX + 1, dim), layer, mask, 0.25) is None
    # what the kernel cannot read as float32 CPU buffers of this batch is left to SDPA
    assert attend.batch_rows(q.double(), layer, mask, 0.25) is None
    assert attend.batch_rows(q[:2], layer, mask[:2], 0.25) is None  # fewer query rows than the buffer's
    assert attend.batch_rows(q, SimpleNamespace(_k=layer._k, _v=layer._v), mask, 0.25) is None  # not a BatchLayer
    blind = mask.clone()
    blind[2, 0, -1] = float("-inf")  # a query position that sees nothing
    assert attend.batch_rows(q, layer, blind, 0.25) is None
    owner.own_columns = False  # a sampled batch's cache: SDPA's bits
    assert attend.batch_rows(q, layer, mask, 0.25) is None
    owner.own_columns = True
    monkeypatch.setattr(attend, "ROWS", False)
    assert attend.batch_rows(q, layer, mask, 0.25) is None
