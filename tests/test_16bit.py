"""16-bit weights (issue 35): the dot16 kernels widen and sum in one fixed order, a wide model's rows do not depend
on the rows beside them (so every method is lossless against ``ar`` at the same dtype), sampling keeps the
target's law, and the model is the float32 one with 16-bit weights."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from specdec_cli import api
from specdec_cli.runtime import decoder, kernels, kernels16
from specdec_cli.runtime import forward as engine
from specdec_cli.engine.loop import Drafter, generate
from specdec_cli.engine.sampling import SamplingConfig

from conftest import CHAT_PROMPTS, chisquare_pvalue, tiny_gemma3, tiny_llama

pytestmark = pytest.mark.skipif(not kernels16.FORMATS, reason="numba not installed")
DTYPES = [torch.bfloat16, torch.float16]
NEW_TOKENS = 24


def bits(w: torch.Tensor) -> np.ndarray:
    return w.view(torch.int16).numpy().view(np.uint16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k_dim", [64, 75, 576])  # a multiple of the lanes, leftovers, SmolLM2's width
def test_dot16_widens_exactly_and_gives_every_row_the_same_bits_whatever_the_block(dtype, k_dim):
    from specdec_cli.runtime import dot16

    torch.manual_seed(0)
    w = (torch.randn(37, k_dim) * 3).to(dtype)
    kernel = dot16.KERNELS[kernels16.FORMATS[dtype]]
    x = torch.randn(9, k_dim)
    alone = np.empty((9, 37), np.float32)
    for r in range(9):
        kernel(x[r: r + 1].numpy(), bits(w), alone[r: r + 1], 1)
    for n in (1, 2, 3, 4, 5, 9):
        for block in (1, 2, 4):
            y = np.empty((n, 37), np.float32)
            kernel(x[:n].numpy(), bits(w), y, block)
            assert np.array_equal(y, alone[:n]), (n, block)
    exact = (x.double() @ w.double().T).numpy()  # the widened weights exactly (fp16 subnormals included)
    assert np.allclose(alone, exact, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("k_dim", [8, 13, 576])  # one vector, leftovers, SmolLM2's width
@pytest.mark.parametrize("n_out", [4, 37])  # whole tiles of four outputs; leftover outputs
def test_float32_tiles_give_every_row_the_same_bits_whatever_the_rows_beside_it(k_dim, n_out):
    """The float32 ``dot`` strategy (runtime/tiles.py): a verified row's product is its one-row product, pairs or
    not, and it is the linear product."""
    from specdec_cli.runtime import tiles
    from specdec_cli.runtime.dot import dot_rows

    torch.manual_seed(0)
    w, x = torch.randn(n_out, k_dim), torch.randn(9, k_dim)
    alone = np.empty((9, n_out), np.float32)
    for r in range(9):
        dot_rows(x[r: r + 1].numpy(), w.numpy(), alone[r: r + 1])
    for n in (2, 3, 8, 9):
        for pair in (False, True):
            y = np.empty((n, n_out), np.float32)
            tiles.dot_tiled(x[:n].numpy(), w.numpy(), y, tiles.F32, pair)
            assert np.array_equal(y, alone[:n]), (n, pair)
    assert np.allclose(alone, (x.double() @ w.double().T).numpy(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("strategy", kernels16.ANY_ORDER_ONLY)
def test_a_16bit_prefill_takes_the_measured_strategy_and_a_verification_keeps_the_tiles(dtype, strategy,
                                                                                         monkeypatch):
    """Beyond 64 rows a forward whose rows no one compares (a prefill) takes :func:`kernels16.prefill_strategy`'s
    choice, whatever an older plan says (``d16x2`` at 256 rows here): ``widen`` (the weight widened for MKL) or
    ``native`` (the rows rounded for PyTorch's own 16-bit product: AMX-BF16 on this project's CPU). The same rows
    verified keep the register tiles: each row's bits are its one-row forward's."""
    monkeypatch.setitem(kernels16._PREFILL, kernels16.prefill_key(dtype), strategy)
    linear = torch.nn.Linear(64, 48, bias=False).to(dtype)
    fast = kernels.FastLinear(linear, {b: "d16x2" for b in kernels.BUCKETS})
    assert fast.wide == strategy
    x = torch.randn(100, 64)
    with kernels.active(), kernels16.any_order(True):
        prefill = fast(x)
    with kernels.active():
        verification = fast(x)
        alone = torch.cat([fast(x[i: i + 1]) for i in range(len(x))])
    assert torch.equal(verification, alone)
    widened = x @ linear.weight.float().T
    assert torch.allclose(verification, widened, atol=1e-4)
    if strategy == "widen":
        assert torch.allclose(prefill, widened, atol=1e-4)
    else:  # the rows rounded to 16 bits, the sums in float32, the result rounded once
        assert torch.allclose(prefill, x.to(dtype).float() @ linear.weight.float().T, rtol=1e-2, atol=1e-2)


def test_the_prefill_strategy_is_native_only_when_clearly_faster(monkeypatch):
    """``native`` replaces ``widen`` only when :data:`kernels16.NATIVE_GAIN` times faster (timed once per dtype,
    thread count and process): a CPU without a 16-bit matrix unit keeps ``widen``. The clock here is the fake products' cost."""
    clock, cost, calls = [0.0], {}, []

    def product(strategy, x2, weight, bits):
        calls.append(strategy)
        clock[0] += cost[strategy]

    monkeypatch.setattr(kernels16, "apply16", product)
    monkeypatch.setattr(kernels16.time, "perf_counter", lambda: clock[0])
    for widen, native, expected in ((4.0, 1.0, "native"), (1.4, 1.0, "widen"), (1.0, 3.0, "widen")):
        monkeypatch.setattr(kernels16, "_PREFILL", {})
        cost.update(widen=widen, native=native)
        assert kernels16.prefill_strategy(torch.bfloat16) == expected
        done = len(calls)
        assert kernels16.prefill_strategy(torch.bfloat16) == expected and len(calls) == done  # measured once
    threads, done = torch.get_num_threads(), len(calls)  # the last choice ("widen") stays with this thread count
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads + 1)  # another thread count: measured anew
    cost.update(widen=4.0, native=1.0)
    assert kernels16.prefill_strategy(torch.bfloat16) == "native" and len(calls) > done
    assert kernels16._PREFILL == {(torch.bfloat16, threads): "widen", (torch.bfloat16, threads + 1): "native"}


def test_attention_gives_a_row_what_it_gives_the_row_alone():
    from specdec_cli.runtime.attend import EVERY_COLUMN, attend

    torch.manual_seed(0)
    for hd, heads, kv_heads in ((8, 4, 2), (64, 9, 3), (80, 3, 3)):
        past, n = 20, 7
        q, k, v = torch.randn(n, heads, hd), torch.randn(kv_heads, 40, hd), torch.randn(kv_heads, 40, hd)
        seen = torch.tril(torch.ones(n, past + n, dtype=torch.bool), diagonal=past)
        together = torch.empty(n, heads, hd)
        attend(q.numpy(), k.numpy(), v.numpy(), 0, past + n, seen.numpy(), np.float32(hd ** -0.5), together.numpy())
        for r in range(n):
            alone = torch.empty(1, heads, hd)
            attend(q[r: r + 1].numpy(), k.numpy(), v.numpy(), 0, past + r + 1, EVERY_COLUMN, np.float32(hd ** -0.5),
                   alone.numpy())
            assert torch.equal(alone[0], together[r])
        sdpa = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None, :, : past + n], v[None, :, : past + n],
                                              attn_mask=seen, scale=hd ** -0.5, enable_gqa=True)
        assert torch.allclose(together, sdpa[0].transpose(0, 1), atol=1e-5)


@pytest.mark.parametrize("d", [64, 256])  # SmolLM2's heads, Gemma-3's
def test_attentions_value_sum_is_the_plain_loop_bit_for_bit(d):
    """attend's ``_weighted`` intrinsic: ``acc = acc + p[c] * v[cols[c]]`` from zero over the columns in order, each
    product rounded to float32 before the add -- the loop it replaced, in numpy's float32 arithmetic."""
    from numba import njit

    from specdec_cli.runtime import attend

    rng = np.random.default_rng(d)
    p = rng.random(37).astype(np.float32)
    v = rng.standard_normal((80, d)).astype(np.float32)
    cols = np.sort(rng.choice(80, 37, replace=False)).astype(np.int64)

    @njit
    def weighted(p, v, cols, out):
        for off in range(0, v.shape[1], attend.WEIGHTED):
            attend._weighted(p.ctypes.data, v.ctypes.data, cols.ctypes.data, p.shape[0], v.shape[1], off,
                             out.ctypes.data + off * 4)

    got = np.empty(d, np.float32)
    weighted(p, v, cols, got)
    want = np.zeros(d, np.float32)
    for c in range(p.shape[0]):
        want = want + p[c] * v[cols[c]]  # float32 throughout: the product rounded, then the sum
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def wide(make, dtype, monkeypatch, tmp_path, vocab: int = 16, **kw):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    model = make(vocab=vocab, **kw).to(dtype)
    kernels.install(model)
    assert decoder.decoder_for(model).wide
    return model


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_wide_models_rows_are_its_one_row_forwards_bit_for_bit(make, dtype, monkeypatch, tmp_path):
    """Chains, trees and a tree of more than 64 nodes (the kernels' plans switch only for prefills), after a
    prefix longer than Gemma's sliding window: each row's logits are those of feeding its path one token at a
    time."""
    model = wide(make, dtype, monkeypatch, tmp_path)
    rng = random.Random(0)
    prefix = [rng.randrange(16) for _ in range(11)]
    cache = engine.new_cache(model)
    engine.forward_chain(model, cache, prefix, keep=0)
    base = cache.length
    big = [rng.randrange(16) for _ in range(70)]
    cases = [([3, 5, 7, 5, 2], None), ([3, 5, 9, 7, 5, 2], [-1, 0, 0, 2, 3]), (big, None)]
    for tokens, parents in cases:
        got = engine.forward_tree(model, cache, tokens[0], tokens[1:], parents or list(range(-1, len(tokens) - 2)))
        engine.crop(cache, base)
        for i in range(len(tokens)):
            path, node = [], i - 1
            while node >= 0:
                path.insert(0, tokens[node + 1])
                node = (parents or list(range(-1, len(tokens) - 2)))[node]
            for t in [tokens[0], *path][:-1]:
                engine.forward_chain(model, cache, [t])
            one = engine.forward_chain(model, cache, [([tokens[0], *path])[-1]])
            engine.crop(cache, base)
            assert torch.equal(one[0], got[i]), (len(tokens), i)


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_wide_model_is_the_float32_model_with_16bit_weights(make, dtype, monkeypatch, tmp_path):
    """Logits close to the float32 model's with the same (rounded) weights, through a prefill longer than 64 rows
    (the tensor path, its products widened: ``native`` rounds the prompt's rows, below) and then decoding steps
    (the compiled path), with float32 keys and values cached."""
    monkeypatch.setitem(kernels16._PREFILL, kernels16.prefill_key(dtype), "widen")
    model = wide(make, dtype, monkeypatch, tmp_path)
    reference = make(vocab=16)
    reference.load_state_dict({k: v.float() for k, v in model.state_dict().items()}, strict=False)
    tokens = [random.Random(1).randrange(16) for _ in range(90)]
    cache = engine.new_cache(model)
    engine.forward_chain(model, cache, tokens[:80], keep=0)
    steps = torch.cat([engine.forward_chain(model, cache, [t]) for t in tokens[80:]])
    want = engine.forward_chain(reference, engine.new_cache(reference), tokens)[80:]
    assert cache.layers[0].keys.dtype == torch.float32
    assert torch.allclose(steps, want, atol=1e-4)


def test_kernels_exact_widens_every_prefill(monkeypatch, tmp_path):
    """``--kernels exact`` (``kernels16.widen_prefills``): a 16-bit model whose prefills would take ``native`` widens
    them instead, so its prompt's keys and values are the float32 model's with 16-bit weights."""
    monkeypatch.setitem(kernels16._PREFILL, kernels16.prefill_key(torch.bfloat16), "native")
    model = wide(tiny_llama, torch.bfloat16, monkeypatch, tmp_path)
    fast = [m for m in model.modules() if isinstance(m, kernels.FastLinear)]
    assert fast and all(m.wide == "native" for m in fast)
    kernels16.widen_prefills(model)
    assert all(m.wide == "widen" for m in fast)


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_a_native_prefill_keeps_every_draft_equal_to_ar(make, monkeypatch, tmp_path):
    """A prompt of more than 64 rows prefilled by the 16-bit product (``native``: its rows rounded to bfloat16):
    the prefill is the model's, taken alike whatever drafts follow, so random draft trees still give ``ar``'s
    tokens, and the decoding steps' logits stay near the float32 model's."""
    from test_batch import RandomTrees

    monkeypatch.setitem(kernels16._PREFILL, kernels16.prefill_key(torch.bfloat16), "native")
    taken = []
    monkeypatch.setattr(kernels, "apply16", lambda s, *a: taken.append(s) or kernels16.apply16(s, *a))
    model = wide(make, torch.bfloat16, monkeypatch, tmp_path)
    prompt = [random.Random(2).randrange(16) for _ in range(90)]
    expected = generate(model, prompt, Drafter(), max_new_tokens=NEW_TOKENS).tokens
    assert "native" in taken
    got = generate(model, prompt, RandomTrees(), max_new_tokens=NEW_TOKENS)
    assert got.tokens == expected and any(s.drafted for s in got.steps)
    reference = make(vocab=16)
    reference.load_state_dict({k: v.float() for k, v in model.state_dict().items()}, strict=False)
    cache = engine.new_cache(model)
    engine.forward_chain(model, cache, prompt[:80], keep=0)
    steps = torch.cat([engine.forward_chain(model, cache, [t]) for t in prompt[80:]])
    want = engine.forward_chain(reference, engine.new_cache(reference), prompt)[80:]
    assert torch.allclose(steps, want, atol=5e-2)


def test_only_a_prefill_from_an_empty_cache_takes_the_any_order_product(monkeypatch, tmp_path):
    """Tokens fed without logits after a prefix (``keep=0`` on a non-empty cache, 80 rows) keep the row-invariant
    tiles: their keys and values are those of the same tokens decoded one by one, bit for bit. Only the prompt's
    prefill, from an empty cache, takes ``native``."""
    monkeypatch.setitem(kernels16._PREFILL, kernels16.prefill_key(torch.bfloat16), "native")
    taken = []
    monkeypatch.setattr(kernels, "apply16", lambda s, *a: taken.append((s, kernels16._ANY_ORDER[0]))
                        or kernels16.apply16(s, *a))
    model = wide(tiny_llama, torch.bfloat16, monkeypatch, tmp_path)
    rng = random.Random(3)
    prompt, more = [rng.randrange(16) for _ in range(70)], [rng.randrange(16) for _ in range(80)]
    fed, stepped = engine.new_cache(model), engine.new_cache(model)
    for cache in (fed, stepped):
        engine.forward_chain(model, cache, prompt, keep=0)
    assert ("native", True) in taken
    taken.clear()
    engine.forward_chain(model, fed, more, keep=0)
    assert not any(allowed for _, allowed in taken)  # (the compiled layers serve it: no FastLinear call at all)
    for t in more:
        engine.forward_chain(model, stepped, [t], keep=1)
    probe = [rng.randrange(16) for _ in range(3)]
    assert torch.equal(engine.forward_chain(model, fed, probe), engine.forward_chain(model, stepped, probe))


def test_kernels_torch_keeps_a_16bit_model_as_transformers_runs_it(monkeypatch, tmp_path):
    model = tiny_llama(vocab=16).to(torch.bfloat16)
    assert not decoder.decoder_for(model).wide  # plain bf16 nn.Linear layers: bf16 activations, the old path
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    kernels.install(model)
    plans = kernels.load_plans()[kernels.machine_key()]
    assert any(key.endswith(":bf16") for key in plans)  # plans keyed by dtype
    assert all(s in kernels16.STRATEGIES16 for key, plan in plans.items() if key.endswith(":bf16")
               for s in plan.values())


# --- sampling: the target's law at 16 bits --------------------------------------------------------------------------


def two_token_pvalue(target, drafter, cfg: SamplingConfig, n: int) -> float:
    from test_engine import exact_two_token_distribution

    prompt = [1, 4, 2]
    expected = exact_two_token_distribution(target, prompt, cfg)
    counts = torch.zeros(64)
    for seed in range(n):
        out = generate(target, prompt, drafter, max_new_tokens=3, sampling=cfg, seed=seed).tokens
        counts[out[0] * 8 + out[1]] += 1
    return chisquare_pvalue(counts, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sd_sampling_keeps_the_16bit_targets_law(dtype, monkeypatch, tmp_path):
    from test_engine import RandomChainDrafter

    target = wide(tiny_llama, dtype, monkeypatch, tmp_path, vocab=8, seed=0)
    assert two_token_pvalue(target, RandomChainDrafter(tiny_llama(seed=1), k=3), SamplingConfig(1.0), 800) > 1e-3


def test_tree_sampling_keeps_the_16bit_targets_law(monkeypatch, tmp_path):
    from test_budget import TopTreeDrafter

    target = wide(tiny_llama, torch.bfloat16, monkeypatch, tmp_path, vocab=8, seed=0)
    cfg = SamplingConfig(temperature=0.7, top_k=3)
    assert two_token_pvalue(target, TopTreeDrafter(tiny_llama(seed=0)), cfg, 800) > 1e-3


# --- every method lossless against ar at 16 bits, on SmolLM2 ----------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_bf16():
    target = api.load_model("smollm2-135m", dtype="bfloat16", device="cpu")
    kernels.install(target.model)
    assert decoder.decoder_for(target.model).wide
    for m in target.model.modules():  # the prefill this CPU may choose (AMX-BF16's), whatever this one measured
        if isinstance(m, kernels.FastLinear):
            m.wide = "native"
    return target


# a prompt of more than kernels16.INVARIANT_ROWS tokens: its prefill takes "native", the rows rounded to bfloat16
LONG_CODE = Path(textwrap.__file__).read_text(encoding="utf-8")[:900]


@pytest.fixture(scope="module")
def bf16_cases(smollm2_bf16):
    texts = [(CHAT_PROMPTS[0], False), ('import argparse\n\n\ndef main():\n    parser = argparse.ArgumentParser(', True),
             (LONG_CODE, True)]
    cases = []
    for text, raw in texts:
        ids = api.encode_prompt(smollm2_bf16, text, raw=raw, max_new_tokens=NEW_TOKENS)
        assert text is not LONG_CODE or len(ids) > kernels16.INVARIANT_ROWS
        cases.append((ids, api.run(smollm2_bf16, ids, api.make_drafter("ar", smollm2_bf16),
                                   max_new_tokens=NEW_TOKENS).tokens))
    return cases


@pytest.fixture(scope="module")
def bf16_stores(smollm2_bf16, tmp_path_factory):
    from specdec_cli.datastore import build_suffix_array_datastore, build_trigram_datastore
    from specdec_cli.io.corpora import stdlib_files, tokenize_documents

    wanted = [f for f in stdlib_files() if str(f).endswith("/argparse.py")]
    docs = list(tokenize_documents(smollm2_bf16.tokenizer, [f.read_text(encoding="utf-8") for f in wanted],
                                   max_tokens=None))
    root = tmp_path_factory.mktemp("bf16-stores")
    build_suffix_array_datastore(iter(docs), root / "sa", fingerprint=smollm2_bf16.fingerprint,
                                 vocab_size=len(smollm2_bf16.tokenizer), progress=False)
    build_trigram_datastore(iter(docs), root / "tri", fingerprint=smollm2_bf16.fingerprint,
                            vocab_size=len(smollm2_bf16.tokenizer), progress=False)
    return {"rest": str(root / "sa"), "aded": str(root / "tri"), "auto": [str(root / "sa"), str(root / "tri")]}


@pytest.mark.slow
@pytest.mark.parametrize("method,budget", [("auto", "auto"), ("auto", "paper"), ("sd", "paper"), ("self-verify", "auto"),
                                           ("hsddw", "paper"), ("pld", "paper"), ("ngram-trie", "paper"),
                                           ("rest", "paper"), ("aded", "paper")])
def test_every_method_greedy_matches_ar_at_bfloat16(smollm2_bf16, bf16_cases, bf16_stores, method, budget):
    drafts = []
    if method in ("auto", "sd", "self-verify", "hsddw"):
        drafts = [api.load_draft("int8:", smollm2_bf16)]
    if method == "hsddw":  # M1 the int8 copy, M2 a bf16 copy (transformers' bf16 activations: another model)
        drafts.append(api.load_draft("bf16:", smollm2_bf16))
    drafter = api.make_drafter(method, smollm2_bf16, drafts, datastore=bf16_stores.get(method), budget=budget)
    for ids, expected in bf16_cases:
        result = api.run(smollm2_bf16, ids, drafter, max_new_tokens=NEW_TOKENS)
        assert result.tokens == expected, method
        s = result.summary()
        assert s["accepted"] <= s["drafted"]


@pytest.mark.slow
def test_auto_greedy_matches_ar_at_float16():
    target = api.load_model("smollm2-135m", dtype="float16", device="cpu")
    kernels.install(target.model)
    assert decoder.decoder_for(target.model).wide
    drafter = api.make_drafter("auto", target, [api.load_draft("int8:", target)])
    for text in CHAT_PROMPTS[:2]:
        ids = api.encode_prompt(target, text, max_new_tokens=NEW_TOKENS)
        expected = api.run(target, ids, api.make_drafter("ar", target), max_new_tokens=NEW_TOKENS).tokens
        assert api.run(target, ids, drafter, max_new_tokens=NEW_TOKENS).tokens == expected


def test_a_16bit_target_loads_its_own_16bit_copy_of_the_conversion(smollm2):
    """``--dtype bfloat16`` reads a bfloat16 file (made once from the float32 conversion), not the float32 one cast
    while loading (whose mapped pages doubled the peak memory): the same weights, and a folder source_gguf knows."""
    from specdec_cli.io import gguf
    from specdec_cli.io.models import load_model

    target = load_model("smollm2-135m", dtype="bfloat16", device="cpu")
    folder = Path(target.info["source"])
    assert folder.name.endswith("-bfloat16") and gguf.stored_of(folder) == "bfloat16" and gguf.complete(folder)
    assert gguf.cache_dir(gguf.source_gguf(str(folder)), "bfloat16") == folder
    for (name, mine), (_, theirs) in zip(target.model.state_dict().items(), smollm2.model.state_dict().items()):
        assert mine.dtype == torch.bfloat16 and torch.equal(mine, theirs.to(torch.bfloat16)), name


def test_bench_records_name_the_prefill_strategy_measured(monkeypatch):
    """A bench record's machine says which 16-bit prefill this process measured (the outputs depend on it)."""
    from specdec_cli.bench.records import machine_info

    monkeypatch.setattr(kernels16, "_PREFILL", {kernels16.prefill_key(torch.bfloat16): "native",
                                                  (torch.float16, 10 ** 6): "widen"})  # another thread count
    assert machine_info()["prefill16"] == {"bfloat16": "native"}
