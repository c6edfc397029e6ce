"""Drafts whose tokenizer is not the target's (drafting/token_bridge.py): the text carried across exactly, greedy
output identical to ``ar``, sampling distributed as ``p_target`` (chi-square with two tiny models whose
vocabularies differ), for sd, self-verify, hsddw (either level) and auto."""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

import pytest
import torch

from conftest import chain_logits, chisquare_pvalue, tiny_llama
from specdec_cli.config import SamplingConfig
from specdec_cli.drafting.draft_model import DraftModel, draft_model_for
from specdec_cli.drafting.token_bridge import ByteVocab, TokenBridge, whole_chars
from specdec_cli.engine.loop import Drafter, generate
from specdec_cli.engine.sampling import logits_to_probs
from specdec_cli.io.models import LoadedModel

TARGET_PIECES = ["a", "b", "c", "ab", "ca", "abc", "bc", "cc"]
TARGET_MERGES = [("a", "b"), ("c", "a"), ("ab", "c"), ("b", "c"), ("c", "c")]
DRAFT_PIECES = ["a", "b", "c", "ba", "ac"]
DRAFT_MERGES = [("b", "a"), ("a", "c")]


def char_tokenizer(pieces, merges):
    """A small BPE tokenizer over the letters a, b, c (no byte-level or SentencePiece decoder: ByteVocab's
    generic path)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=merges))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.fixture(scope="module")
def tiny_pair():
    target = LoadedModel(tiny_llama(vocab=len(TARGET_PIECES), seed=0), char_tokenizer(TARGET_PIECES, TARGET_MERGES),
                         "tiny-target", False)
    draft = LoadedModel(tiny_llama(vocab=len(DRAFT_PIECES), seed=3), char_tokenizer(DRAFT_PIECES, DRAFT_MERGES),
                        "tiny-draft", False)
    return target, draft


def test_whole_chars():
    assert whole_chars("aé".encode()) == 3 and whole_chars("aé".encode()[:2]) == 1
    assert whole_chars("😀".encode()[:3]) == 0 and whole_chars(b"") == 0


def test_tiny_tokenizers_differ_and_bridge(tiny_pair):
    target, draft = tiny_pair
    t, d = ByteVocab(target.tokenizer), ByteVocab(draft.tokenizer)
    assert t.bytes == [p.encode() for p in TARGET_PIECES] and d.bytes == [p.encode() for p in DRAFT_PIECES]
    bridge = TokenBridge(t, d)
    ids = t.encode("abcabacbcca")
    for n in range(1, len(ids) + 1):
        assert d.text(bridge.draft_context(ids[:n])) == t.text(ids[:n])
    assert bridge.draft_context(ids) == d.encode("abcabacbcca")


def bridged_sd(target, draft, window=3):
    from specdec_cli.methods.sd import SpeculativeSampling

    dm = draft_model_for(draft, target)
    assert dm.bridge is not None
    return SpeculativeSampling(dm, target.vocab_size, window)


def exact_two_token_distribution(model, prompt, cfg, vocab):
    p1 = logits_to_probs(chain_logits(model, prompt)[-1], cfg)
    table = torch.zeros(vocab, vocab)
    for a in range(vocab):
        table[a] = p1[a] * logits_to_probs(chain_logits(model, prompt + [a])[-1], cfg)
    return table.flatten()


def test_sampling_with_a_draft_of_another_tokenizer_is_exact(tiny_pair):
    """The first two sampled tokens follow the target's law (chi-square), and drafts were accepted on the way."""
    target, draft = tiny_pair
    cfg, vocab, prompt = SamplingConfig(temperature=1.0), target.vocab_size, [1, 4, 2]
    expected = exact_two_token_distribution(target.model, prompt, cfg, vocab)
    drafter = bridged_sd(target, draft)
    counts, accepted = torch.zeros(vocab * vocab), 0
    for seed in range(1500):
        res = generate(target.model, prompt, drafter, max_new_tokens=2, sampling=cfg, seed=seed)
        counts[res.tokens[0] * vocab + res.tokens[1]] += 1
        accepted += res.summary()["accepted"]
    assert accepted > 50
    assert chisquare_pvalue(counts, expected) > 1e-3


@pytest.mark.parametrize("method", ["sd", "self-verify", "hsddw-m1", "hsddw-m2", "auto"])
def test_greedy_identical_with_a_draft_of_another_tokenizer(tiny_pair, method):
    from specdec_cli.methods import MethodContext, build_drafter

    target, draft = tiny_pair
    same = LoadedModel(tiny_llama(vocab=len(TARGET_PIECES), seed=5), target.tokenizer, "tiny-same", False)
    drafts = {"hsddw-m1": [draft, same], "hsddw-m2": [draft, LoadedModel(tiny_llama(vocab=5, seed=4),
                                                                         draft.tokenizer, "tiny-m2", False)]}
    name = method.removesuffix("-m1").removesuffix("-m2")
    ctx = MethodContext(target, drafts.get(method, [draft]), None, None, {}, "paper")
    drafter = build_drafter(name, ctx)
    rng = random.Random(0)
    drafted = 0
    for _ in range(6):
        prompt = [rng.randrange(target.vocab_size) for _ in range(rng.randrange(2, 9))]
        ar = generate(target.model, prompt, Drafter(), max_new_tokens=16)
        res = generate(target.model, prompt, drafter, max_new_tokens=16)
        assert res.tokens == ar.tokens
        drafted += res.summary()["drafted"]
    assert drafted > 0


def test_same_tokenizer_drafts_keep_plain_ids(tiny_pair):
    target, _ = tiny_pair
    same = LoadedModel(tiny_llama(vocab=len(TARGET_PIECES), seed=5), target.tokenizer, "tiny-same", False)
    dm = draft_model_for(same, target)
    assert isinstance(dm, DraftModel) and dm.bridge is None


@pytest.mark.slow
def test_real_tokenizers_round_trip():
    """Gemma-3 (SentencePiece with byte fallback) and SmolLM2 (byte-level BPE), both ways, incrementally and with
    detours (auto grows chains from tree nodes), on code and on non-ASCII text."""
    from specdec_cli.io.models import load_tokenizer

    gemma, smol = ByteVocab(load_tokenizer("gemma3-270m")), ByteVocab(load_tokenizer("smollm2-135m"))
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = [root.joinpath("textwrap.py").read_text()[:1500], " é 😀 ünïcödé 中文字符 " * 10]
    rng = random.Random(0)
    for text in texts:
        for a, b in ((gemma, smol), (smol, gemma)):
            ids = a.encode(text)
            assert a.text(ids) == text.encode()
            bridge, n = TokenBridge(a, b), 0
            while n < len(ids):
                n += rng.randint(1, 5)
                bridge.draft_context(ids[:n] + [rng.randrange(1000, 5000)])  # a path not taken
                got = bridge.draft_context(ids[:n])
                assert b.text(got) == a.text(ids[:n])[: bridge.settled]
            assert bridge.draft_context(ids) == b.encode(text)
            cut = len(ids) // 2
            context = bridge.draft_context(ids[:cut])
            rest = text.encode()[len(b.text(context)):].decode("utf-8", errors="replace")
            proposed = bridge.to_target(b.encode(rest)[:12])
            assert proposed and proposed == ids[cut: cut + len(proposed)]
