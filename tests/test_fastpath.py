"""The static-cache path (``--compile static|on``; issue 13) on the CPU: same logits, same rollback, same outputs.

The compiled variant of the same path is checked where compiling pays for its minutes: on a GPU
(tests/test_gpu.py) and, on the CPU, once in the slow-marked test at the end.
"""

from __future__ import annotations

import os
import random
import shutil

import pytest
import torch

from specdec_cli.runtime import forward as engine
from specdec_cli.runtime.cache_mode import CacheMode
from specdec_cli.runtime import static_cache as fastpath
from specdec_cli.engine.loop import Drafter, Draft, generate

from conftest import assert_tree_rows_match_chains, chain_logits, record_static_caches, tiny_gemma3, tiny_llama


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
@pytest.mark.parametrize("prefix_len", [9, 300])  # 300: a chunked prefill, and far past the sliding window
def test_static_tree_forward_matches_chain_forward(make, prefix_len):
    model = make(vocab=16)
    rng = random.Random(prefix_len)
    prefix = [rng.randrange(16) for _ in range(prefix_len)]
    tokens, parents = [3, 5, 7, 5, 2, 9, 1], [-1, -1, 0, 0, 1, 3, 5]
    cache = engine.new_cache(model, prefix_len + 16, cache_mode=CacheMode.STATIC)
    assert isinstance(cache, fastpath.StaticCache)
    engine.forward_chain(model, cache, prefix[:-1], keep=0)
    assert engine.cache_len(cache) == prefix_len - 1
    tree = engine.forward_tree(model, cache, prefix[-1], tokens, parents)
    assert tree.shape[0] == 1 + len(tokens)  # the bucket's padding rows are not returned
    assert torch.allclose(tree[0], chain_logits(model, prefix)[-1], atol=1e-4)
    assert_tree_rows_match_chains(model, prefix, tokens, parents, tree, atol=1e-4)


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_static_cache_rollback(make):
    model = make(vocab=16)
    prefix = [1, 2, 3, 4, 5, 6, 7]
    cache = engine.new_cache(model, 64, cache_mode=CacheMode.STATIC)
    engine.forward_chain(model, cache, prefix[:-1])
    engine.forward_tree(model, cache, prefix[-1], [8, 9, 10, 11, 12], [-1, -1, 1, 2, 2])
    engine.keep(cache, len(prefix) - 1, [0, 2, 3, 5])  # root -> node 1 -> node 2 -> node 4
    assert engine.cache_len(cache) == len(prefix) + 3
    after = engine.forward_chain(model, cache, [13])[-1]
    assert torch.allclose(after, chain_logits(model, prefix + [9, 10, 12, 13])[-1], atol=1e-4)
    engine.crop(cache, 4)
    assert torch.allclose(engine.forward_chain(model, cache, [6])[-1], chain_logits(model, [1, 2, 3, 4, 6])[-1],
                          atol=1e-4)


class RandomTreeDrafter(Drafter):
    """Random trees of random sizes (1..90 nodes: every bucket, padding included) -- most nodes rejected."""

    name = "random-tree"

    def propose(self, tokens, max_tokens):
        rng = random.Random(len(tokens))
        n = min(rng.randrange(0, 91), max_tokens)
        parents = [rng.randrange(-1, i) for i in range(n)]
        return Draft([rng.randrange(16) for _ in range(n)], parents)


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_greedy_static_equals_eager(make):
    model = make(vocab=16)
    prompt = [random.Random(5).randrange(16) for _ in range(40)]
    want = generate(model, prompt, Drafter(), max_new_tokens=60).tokens
    for drafter in (Drafter(), RandomTreeDrafter()):
        got = generate(model, prompt, drafter, max_new_tokens=60, cache_mode=CacheMode.STATIC).tokens
        assert got == want
    # the same static cache is reused (and emptied) for the next generation
    assert generate(model, prompt[:20], Drafter(), max_new_tokens=30, cache_mode=CacheMode.STATIC).tokens == \
        generate(model, prompt[:20], Drafter(), max_new_tokens=30).tokens


def test_buckets():
    assert [fastpath.bucket(n) for n in (1, 2, 3, 5, 64, 65, 128)] == [1, 2, 4, 8, 64, 128, 128]
    with pytest.raises(ValueError):
        fastpath.bucket(129)


def test_sd_sampling_on_the_static_path_preserves_the_distribution():
    from test_engine import sd_two_token_pvalue

    assert sd_two_token_pvalue(tiny_llama(seed=0), tiny_llama(seed=1), n=600, cache_mode=CacheMode.STATIC) > 1e-3


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="inductor's CPU code needs a C++ compiler")
def test_compiled_path_on_cpu_equals_eager():
    """torch.compile on the CPU (inductor): one tiny model, a few buckets -- same tokens as the eager loop."""
    model = tiny_llama(vocab=16)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    want = generate(model, prompt, RandomTreeDrafter(), max_new_tokens=24).tokens
    got = generate(model, prompt, RandomTreeDrafter(), max_new_tokens=24, cache_mode=CacheMode.COMPILED).tokens
    assert got == want


@pytest.mark.parametrize("copy_of_target", [False, True])
def test_draft_models_follow_the_target_onto_the_static_path(copy_of_target):
    """sd's draft model runs on its own static cache when the target does (taking the target's keys/values when
    it is a copy of it); outputs equal the eager loop's."""
    from specdec_cli.methods.sd import SpeculativeSampling
    from specdec_cli.io.models import LoadedModel

    target = tiny_llama(vocab=16, seed=0)
    draft_model = tiny_llama(vocab=16, seed=0 if copy_of_target else 1)  # a copy: same weights, another object
    loaded = LoadedModel(draft_model, None, "tiny-draft", False, info={"copy_of_target": copy_of_target})
    prompt = [random.Random(9).randrange(16) for _ in range(30)]
    want = generate(target, prompt, Drafter(), max_new_tokens=40).tokens
    drafter = SpeculativeSampling(loaded, 16, 4)
    got = generate(target, prompt, drafter, max_new_tokens=40, cache_mode=CacheMode.STATIC)
    assert got.tokens == want
    assert isinstance(drafter.dm.cache, fastpath.StaticCache) and drafter.dm.cache is not fastpath.cache_for(target, 1)
    if copy_of_target:  # identical weights: every drafted token is accepted
        assert got.summary()["accepted"] == got.summary()["drafted"] > 0


def test_compile_resolves_to_one_cache_mode_and_profile_keys_stay(monkeypatch):
    """``--compile`` becomes one CacheMode; a resolved mode passes through; the profile cache key of each mode is
    the one it had as a string for eager (nothing added); a static one names its mode and its warm-up."""
    from specdec_cli.runtime import profile
    from specdec_cli.runtime.cache_mode import resolve

    model = tiny_llama(vocab=16)
    modes = [resolve(c, model) for c in ("auto", "on", "off", "static")]
    assert modes == [CacheMode.EAGER, CacheMode.COMPILED, CacheMode.EAGER, CacheMode.STATIC]
    assert resolve(CacheMode.STATIC, model) is CacheMode.STATIC
    keys = []
    monkeypatch.setattr(profile, "load", lambda key: keys.append(key) or profile.Profile.flat())
    for mode in CacheMode:
        profile.profile_for(model, cache_mode=mode)
    assert keys == [profile.model_key(model, extra) for extra in ("", "|fast=static|warm=all", "|fast=compiled|warm=all")]
    assert engine.new_cache(model, 8, CacheMode.STATIC).mode is CacheMode.STATIC
    assert engine.new_cache(model, 8).mode is CacheMode.EAGER


@pytest.mark.parametrize("mode", list(CacheMode))
def test_profile_times_a_static_bucket_only_once_it_is_warm(monkeypatch, mode):
    """On a static path the first calls of a bucket compile it and (CUDA graphs) warm up and record it: measured
    on an H200, a profile timed before that read 23-26 ms for 1-2 tokens against 9 ms warm, and the budget never
    drafted on the compiled path. Every size is called WARM_CALLS times (compiled) or once (static) before the
    first timed call; the eager path keeps its one warm-up call."""
    from specdec_cli.runtime import forward, profile

    calls = []
    monkeypatch.setattr(forward, "new_cache", lambda *a, **k: None)
    monkeypatch.setattr(forward, "forward_chain", lambda *a, **k: None)
    monkeypatch.setattr(forward, "crop", lambda *a, **k: None)
    monkeypatch.setattr(forward, "forward_tree", lambda model, cache, root, draft, parents: calls.append(1 + len(draft)))
    points = (1, 2, 3, 4, 6, 8)
    profile.measure(tiny_llama(vocab=16), points=points, context=4, cache_mode=mode)
    twice = [n for n in points if n <= profile.TWICE]
    timed = len(points) + len(twice)  # the round-robin: every size, then the cheap ones again
    warm = calls[:-timed]
    assert calls[-timed:] == list(points) + twice
    if mode.static:
        per_size = profile.WARM_CALLS if mode.compiled else 1
        assert sorted(warm) == sorted(list(points) * per_size)
    else:
        assert warm == [4]


def test_bench_warms_every_compiled_bucket_before_timing(monkeypatch):
    """Measured on an H200: with the profile read from disk, compiled `auto`'s first HumanEval prompt took 13.5 s
    (buckets compiling inside the timed run) against 0.3-0.4 s for the next ones. bench's warm-up now calls every
    bucket WARM_CALLS times on a compiled path: the target's in the very cache its generations get (at the capacity
    the longest conversation needs), each draft model's in a temporary cache. Once per cache; nothing on the eager
    and static-eager paths, nor for runs without specdec's engine (vLLM alone: no model here)."""
    from types import SimpleNamespace

    from specdec_cli.bench import runners

    calls = []
    monkeypatch.setattr(fastpath.StaticCache, "forward_tree",
                        lambda self, root, draft, parents: calls.append((self, 1 + len(draft), len(parents))))
    target, draft = SimpleNamespace(model=tiny_llama(vocab=16)), SimpleNamespace(model=tiny_llama(vocab=16, seed=1))
    prompt = SimpleNamespace(turns=["question", "follow-up"], raw=True)
    monkeypatch.setattr(runners, "encode_turn", lambda target, p, turn, answers, n: [1] * (1500 + turn))
    ran = []
    engine_run = lambda ids, n: ran.append(n)
    engine_run.drafter = None  # a specdec runner (runners.specdec_runner)
    for compile in ("off", "static"):
        runners.warm_up(target, [prompt], {"ar": engine_run}, 64, compile, [draft])
        assert calls == []
    runners.warm_up(SimpleNamespace(), [prompt], {"vllm": lambda ids, n: ran.append(n)}, 64, "on", [draft])
    assert calls == []
    runners.warm_up(target, [prompt], {"ar": engine_run}, 64, "on", [draft])
    per_model = sorted(list(fastpath.BUCKETS) * fastpath.WARM_CALLS)
    needed = 1501 + 2 * 64 + 8  # the last turn's question and history, an answer per turn, CACHE_SLACK
    kept = fastpath.cache_for(target.model, needed, CacheMode.COMPILED)
    assert kept.warmed and kept.capacity == 4096  # past 2,048 rows: the larger cache, the one the run will get
    assert sorted(size for c, size, _ in calls if c is kept) == per_model
    assert sorted(size for c, size, _ in calls if c.model is draft.model) == per_model
    assert (id(draft.model), "warm-up") not in fastpath._POOL  # graphs compiled; its temporary buffers dropped
    assert all(size == parents + 1 for _, size, parents in calls)  # a chain: the root and size - 1 draft nodes
    runners.warm_up(target, [prompt], {"ar": engine_run}, 64, "on", [])
    assert len(calls) == 2 * len(per_model) and ran == [8] * 5  # warmed once per cache; the warm-up runs go on


def test_a_warmed_compiled_cache_is_the_one_generations_get(monkeypatch):
    """Unmocked, on the CPU's compiled path (inductor): warm two buckets, then decode; the generation runs in the
    warmed cache and gives the eager loop's tokens."""
    model = tiny_llama(vocab=16)
    assert fastpath.warm(model, CacheMode.COMPILED, 64, sizes=(1, 2)) > 0
    warmed = fastpath.cache_for(model, 64, CacheMode.COMPILED)
    assert warmed.warmed and warmed.length == 0 and fastpath.warm(model, CacheMode.COMPILED, 64) == 0.0
    made = record_static_caches(monkeypatch)
    prompt = [1, 2, 3, 4, 5]
    expected = generate(model, prompt, Drafter(), max_new_tokens=8).tokens
    assert generate(model, prompt, Drafter(), max_new_tokens=8, cache_mode=CacheMode.COMPILED).tokens == expected
    assert made and made[0] is warmed


def test_a_draft_model_warms_its_own_compiled_cache_when_it_follows_the_target(monkeypatch):
    """On an H200, compiled `auto` with a bf16: draft spent 4.0 s in the 4 draft steps of its second prompt, where
    it first called larger buckets of its own cache (bench had compiled them in a temporary one). A draft model now
    calls, in its own cache, the buckets bench compiled for its model when it first follows the target onto the
    compiled path (bench's untimed warm-up generation); the generations after that decode in that very cache.
    Nothing where none were compiled (`specdec generate`: they compile on first use), nor on eager paths."""
    from types import SimpleNamespace

    from specdec_cli.drafting.draft_model import DraftModel

    calls = []
    monkeypatch.setattr(fastpath.StaticCache, "forward_tree",
                        lambda self, root, draft, parents: calls.append((self, 1 + len(draft))))
    target, model = tiny_llama(vocab=16), tiny_llama(vocab=16, seed=1)
    dm = DraftModel(SimpleNamespace(model=model, info={}), 16)
    for mode in (CacheMode.EAGER, CacheMode.STATIC, CacheMode.COMPILED):
        dm.use_target_cache(engine.new_cache(target, 64, mode))
        assert calls == []  # nothing compiled for this model yet
    fastpath.warm(model, CacheMode.COMPILED, 64, slot="warm-up", keep=False, sizes=(1, 4))  # bench's warm-up
    calls.clear()
    dm = DraftModel(SimpleNamespace(model=model, info={}), 16)
    dm.use_target_cache(engine.new_cache(target, 64, CacheMode.COMPILED))
    own = {c for c, _ in calls}
    assert len(own) == 1 and sorted(size for _, size in calls) == [1] * fastpath.WARM_CALLS + [4] * fastpath.WARM_CALLS
    dm.prefill([1, 2, 3])
    assert dm.cache is next(iter(own)) and dm.cache.model is model and dm.cache.warmed
    dm.use_target_cache(engine.new_cache(target, 64, CacheMode.COMPILED))  # the next generation: warmed once
    assert len(calls) == 2 * fastpath.WARM_CALLS
