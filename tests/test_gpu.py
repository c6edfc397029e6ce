"""The same correctness checks on a CUDA GPU (skipped where there is none, as in CI).

Run on a GPU machine with ``pytest tests/test_gpu.py``: tree/chain equivalence and cache rollback on the device,
greedy losslessness of every method on SmolLM2 loaded with ``device_map="auto"``, and an end-to-end chi-square
test of ``sd`` sampling with models on the GPU.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
import torch

from specdec_cli import api
from specdec_cli.runtime import forward as engine
from specdec_cli.runtime.cache_mode import CacheMode

from conftest import (CHAT_PROMPTS, assert_tree_rows_match_chains, chain_logits, record_static_caches, tiny_gemma3,
                      tiny_llama)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA = torch.device("cuda")
NEW_TOKENS = 48
CODE_PROMPT = 'import argparse\n\n\ndef main():\n    parser = argparse.ArgumentParser(description="Copy files.")\n'


def on_gpu(model):
    return model.to(CUDA)


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_tree_forward_matches_chain_forward_on_gpu(make):
    model = on_gpu(make(vocab=16))
    prefix = [1, 7, 3, 9, 4, 12, 5, 2, 8]  # longer than tiny_gemma3's sliding window
    tokens, parents = [3, 5, 7, 5, 2, 9, 1], [-1, -1, 0, 0, 1, 3, 5]
    cache = engine.new_cache()
    engine.forward_chain(model, cache, prefix[:-1])
    tree = engine.forward_tree(model, cache, prefix[-1], tokens, parents)
    assert tree.device.type == "cuda"
    assert_tree_rows_match_chains(model, prefix, tokens, parents, tree, atol=1e-4)


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_cache_rollback_on_gpu(make):
    model = on_gpu(make(vocab=16))
    prefix = [1, 2, 3, 4, 5, 6, 7]
    cache = engine.new_cache()
    engine.forward_chain(model, cache, prefix[:-1])
    engine.forward_tree(model, cache, prefix[-1], [8, 9, 10, 11, 12], [-1, -1, 1, 2, 2])
    engine.keep(cache, len(prefix) - 1, [0, 2, 3, 5])
    after = engine.forward_chain(model, cache, [13])[-1]
    assert torch.allclose(after, chain_logits(model, prefix + [9, 10, 12, 13])[-1], atol=1e-4)
    engine.crop(cache, 4)
    after = engine.forward_chain(model, cache, [11])[-1]
    assert torch.allclose(after, chain_logits(model, prefix[:4] + [11])[-1], atol=1e-4)


def test_sd_sampling_preserves_target_distribution_on_gpu():
    from test_engine import sd_two_token_pvalue

    assert sd_two_token_pvalue(on_gpu(tiny_llama(seed=0)), on_gpu(tiny_llama(seed=1))) > 1e-3


# ------------------------------------------------------------------------------------- SmolLM2 on the GPU


@pytest.fixture(scope="module")
def gpu_smollm2():
    target = api.load_model("smollm2-135m", dtype="float32", device="auto")  # device_map="auto"
    assert next(target.model.parameters()).device.type == "cuda"
    return target


@pytest.fixture(scope="module")
def gpu_cases(gpu_smollm2):
    texts = [(t, False) for t in CHAT_PROMPTS[:2]] + [(CODE_PROMPT, True)]
    cases = []
    for text, raw in texts:
        ids = api.encode_prompt(gpu_smollm2, text, raw=raw, max_new_tokens=NEW_TOKENS)
        ar = api.run(gpu_smollm2, ids, api.make_drafter("ar", gpu_smollm2), max_new_tokens=NEW_TOKENS).tokens
        cases.append((ids, ar))
    return cases


@pytest.fixture(scope="module")
def gpu_stores(gpu_smollm2, tmp_path_factory):
    from specdec_cli.datastore import build_suffix_array_datastore
    from specdec_cli.datastore import build_trigram_datastore

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:40]
    tok = gpu_smollm2.tokenizer
    docs = [tok(f.read_text(errors="ignore"), add_special_tokens=False)["input_ids"] for f in files]
    root = tmp_path_factory.mktemp("gpu-stores")
    build_suffix_array_datastore(iter(docs), root / "sa", fingerprint=gpu_smollm2.fingerprint,
                                 vocab_size=len(tok), progress=False)
    build_trigram_datastore(iter(docs), root / "tri", fingerprint=gpu_smollm2.fingerprint,
                            vocab_size=gpu_smollm2.vocab_size, progress=False)
    return {"rest": str(root / "sa"), "aded": str(root / "tri")}


@pytest.mark.parametrize("method", ["sd", "self-verify", "hsddw", "pld", "ngram-trie", "rest", "aded"])
def test_every_method_greedy_matches_ar_on_gpu(gpu_smollm2, gpu_cases, gpu_stores, method):
    drafts = []
    if method in ("sd", "self-verify", "hsddw"):
        drafts = [api.load_draft("bf16:", gpu_smollm2)]
    if method == "hsddw":
        drafts.append(api.load_draft("smollm2-135m", gpu_smollm2, dtype="float32", device="auto"))
    drafter = api.make_drafter(method, gpu_smollm2, drafts, datastore=gpu_stores.get(method))
    for ids, expected in gpu_cases:
        result = api.run(gpu_smollm2, ids, drafter, max_new_tokens=NEW_TOKENS)
        assert result.tokens == expected, method
        assert result.summary()["accepted"] <= result.summary()["drafted"]


# ------------------------------------------------------------------------------------- the compiled fast path


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_compiled_tree_forward_and_rollback_on_gpu(make):
    model = on_gpu(make(vocab=16))
    prefix = [1, 7, 3, 9, 4, 12, 5, 2, 8]
    tokens, parents = [3, 5, 7, 5, 2, 9, 1], [-1, -1, 0, 0, 1, 3, 5]
    cache = engine.new_cache(model, 64, cache_mode=CacheMode.COMPILED)
    engine.forward_chain(model, cache, prefix[:-1], keep=0)
    tree = engine.forward_tree(model, cache, prefix[-1], tokens, parents)
    assert_tree_rows_match_chains(model, prefix, tokens, parents, tree, atol=1e-3)
    engine.keep(cache, len(prefix) - 1, [0, 1, 3])  # root -> node 0 -> node 2
    after = engine.forward_tree(model, cache, 13, [], [])[-1]
    assert torch.allclose(after, chain_logits(model, prefix + [3, 7, 13])[-1], atol=1e-3)


def test_sd_sampling_on_the_compiled_path_on_gpu():
    from test_engine import sd_two_token_pvalue

    assert sd_two_token_pvalue(on_gpu(tiny_llama(seed=0)), on_gpu(tiny_llama(seed=1)), n=800,
                               cache_mode=CacheMode.COMPILED) > 1e-3


def test_compiled_ar_equals_eager_ar_on_gpu(gpu_smollm2, gpu_cases):
    """gpu_cases' ar runs with --compile auto (compiled on CUDA); the eager loop gives the same tokens."""
    drafter = api.make_drafter("ar", gpu_smollm2, compile="off")
    for ids, expected in gpu_cases:
        assert api.run(gpu_smollm2, ids, drafter, max_new_tokens=NEW_TOKENS, compile="off").tokens == expected


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_batched_decoding_matches_ar_on_gpu(make):
    """The batched cache's per-row writes, ragged masks and row removal on the device."""
    from specdec_cli.engine.batch import generate_batch
    from specdec_cli.engine.loop import Drafter, generate

    model = on_gpu(make(vocab=16))
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [12], [3, 1, 4, 1, 5]]
    expected = [generate(model, p, Drafter(), max_new_tokens=12).tokens for p in prompts]
    results = generate_batch(model, prompts, [Drafter() for _ in range(3)], max_new_tokens=12)
    assert [r.tokens for r in results] == expected


@pytest.mark.parametrize("method", ["auto", "pld"])
def test_batched_methods_match_ar_on_smollm2_gpu(gpu_smollm2, gpu_cases, method):
    drafters = api.make_drafters(method, gpu_smollm2, [], api.RunSettings(max_new_tokens=NEW_TOKENS), batch_size=2)
    results = api.run_batch(gpu_smollm2, [ids for ids, _ in gpu_cases], drafters, max_new_tokens=NEW_TOKENS)
    assert [r.tokens for r in results] == [ar for _, ar in gpu_cases]


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_lean_forward_equals_the_module_forward_on_gpu(make):
    """runtime/decoder.py on the device: the same logits as transformers' module code (issue 25)."""
    from specdec_cli.runtime import decoder

    model = on_gpu(make(vocab=16))
    prefix, tokens, parents = [1, 7, 3, 9, 4, 12, 5, 2, 8], [3, 5, 7, 5, 2, 9, 1], [-1, -1, 0, 0, 1, 3]
    lean_cache = engine.new_cache(model)
    engine.forward_chain(model, lean_cache, prefix)
    lean = [engine.forward_chain(model, lean_cache, [6]), engine.forward_tree(model, lean_cache, 4, tokens[1:], parents)]
    decoder.disable(model)
    stock_cache = engine.new_cache(model)
    engine.forward_chain(model, stock_cache, prefix)
    stock = [engine.forward_chain(model, stock_cache, [6]), engine.forward_tree(model, stock_cache, 4, tokens[1:], parents)]
    for a, b in zip(lean, stock):
        assert torch.allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_a_batch_of_one_takes_the_compiled_path_on_gpu(make, monkeypatch):
    """Issue 34: a one-row batch decodes in the single loop's compiled static cache (one CUDA graph per bucket),
    through the same forward_rows/keep_paths calls; random trees of 0-6 nodes (buckets 1-8) give ar's tokens."""
    from test_batch import RandomTrees
    from specdec_cli.engine.batch import generate_batch
    from specdec_cli.engine.loop import Drafter, generate

    model = on_gpu(make(vocab=16))
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [3, 1, 4, 1, 5]]
    expected = [generate(model, p, Drafter(), max_new_tokens=16).tokens for p in prompts]
    made = record_static_caches(monkeypatch)
    drafter = RandomTrees()
    drafter.cache_mode = CacheMode.COMPILED
    results = generate_batch(model, prompts, [drafter], max_new_tokens=16)
    assert [r.tokens for r in results] == expected
    assert any(s.drafted for r in results for s in r.steps)
    assert made and all(c.mode is CacheMode.COMPILED for c in made)


def test_a_batch_of_one_on_smollm2_gpu_is_compiled_and_lossless(gpu_smollm2, gpu_cases):
    """`generate --batch-size 1` on CUDA: compile auto resolves to the compiled path in the batch loop too."""
    drafters = api.make_drafters("auto", gpu_smollm2, [], api.RunSettings(max_new_tokens=NEW_TOKENS), batch_size=1)
    results = api.run_batch(gpu_smollm2, [ids for ids, _ in gpu_cases], drafters, max_new_tokens=NEW_TOKENS)
    assert [r.tokens for r in results] == [ar for _, ar in gpu_cases]
