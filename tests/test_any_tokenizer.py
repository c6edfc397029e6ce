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


def loaded(pieces, merges, seed, name):
    model = tiny_llama(vocab=len(pieces), seed=seed)
    model.generation_config.eos_token_id = None  # Llama's default (2) is a letter of these tokenizers
    return LoadedModel(model, char_tokenizer(pieces, merges), name, False)


@pytest.fixture(scope="module")
def tiny_pair():
    """A target with the coarser tokenizer (a draft token rarely covers several target tokens)."""
    return loaded(TARGET_PIECES, TARGET_MERGES, 0, "tiny-target"), loaded(DRAFT_PIECES, DRAFT_MERGES, 3, "tiny-draft")


@pytest.fixture(scope="module")
def finer_target():
    """The pair the other way round: one draft token often becomes several target tokens."""
    return loaded(DRAFT_PIECES, DRAFT_MERGES, 0, "tiny-target"), loaded(TARGET_PIECES, TARGET_MERGES, 3, "tiny-draft")


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


@pytest.mark.parametrize("budget", ["paper", 4, "auto"])
@pytest.mark.parametrize("method", ["sd", "self-verify", "hsddw-m1", "hsddw-m2", "auto"])
@pytest.mark.parametrize("pair", ["tiny_pair", "finer_target"])
def test_greedy_identical_with_a_draft_of_another_tokenizer(request, pair, method, budget):
    from specdec_cli.engine.budget import Budget
    from specdec_cli.methods import MethodContext, build_drafter
    from specdec_cli.runtime.profile import Profile

    target, draft = request.getfixturevalue(pair)
    same = LoadedModel(tiny_llama(vocab=target.vocab_size, seed=5), target.tokenizer, "tiny-same", False)
    m2 = LoadedModel(tiny_llama(vocab=draft.vocab_size, seed=4), draft.tokenizer, "tiny-m2", False)
    drafts = {"hsddw-m1": [draft, same], "hsddw-m2": [draft, m2]}
    name = method.removesuffix("-m1").removesuffix("-m2")
    options = {"tau0": "0"} if name in ("self-verify", "hsddw") else {}  # the paper's cold start: tau learnt
    ctx = MethodContext(target, drafts.get(method, [draft]), None, None, options, budget)
    drafter = build_drafter(name, ctx)
    if budget != "paper":
        drafter.budget = Budget(budget, Profile([1, 64], [0.01, 0.012]), gate=drafter.gated_by_budget)
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
            assert bridge.draft_context(ids) == bridge.lead + b.encode(text)  # Gemma's <bos> leads its context
            assert bridge.lead == ([2] if b is gemma else [])
            cut = len(ids) // 2
            context = bridge.draft_context(ids[:cut])
            rest = text.encode()[len(b.text(context)):].decode("utf-8", errors="replace")
            continuation = b.encode(rest)[:12]
            proposed, cover = bridge.to_target(continuation)
            assert proposed and proposed == ids[cut: cut + len(proposed)]
            assert len(cover) == len(proposed) and cover == sorted(cover) and cover[-1] < len(continuation)


@pytest.mark.slow
def test_real_tokenizers_odd_text():
    """Invalid UTF-8 from byte-fallback tokens, special-token markup as text, and a draft that reaches its end of
    text: the bridge neither crashes nor drops text."""
    from specdec_cli.io.models import load_tokenizer

    gemma_tok = load_tokenizer("gemma3-270m")
    gemma, smol = ByteVocab(gemma_tok), ByteVocab(load_tokenizer("smollm2-135m"))
    bad = gemma_tok.convert_tokens_to_ids("<0xFF>")
    ids = gemma.encode("ab") + [bad] * 4 + gemma.encode("cd ef") + [gemma_tok.convert_tokens_to_ids("<0x80>")] + \
        gemma.encode("gh")
    bridge = TokenBridge(gemma, smol)
    for n in range(1, len(ids) + 1):
        context = bridge.draft_context(ids[:n])
    assert smol.text(context).endswith(b"cd ef\xef\xbf\xbdgh")  # each invalid byte one U+FFFD, nothing lost
    assert smol.encode("<|im_end|>") != [smol.tokenizer.convert_tokens_to_ids("<|im_end|>")]  # markup stays text
    bridge = TokenBridge(smol, gemma)
    bridge.draft_context(smol.encode("x = 1"))
    assert bridge.to_target(gemma.encode(" + 2"), final=True)[0] == smol.encode(" + 2")
