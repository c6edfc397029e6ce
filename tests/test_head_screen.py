"""The greedy head's screen (runtime/head_screen): the tokens it returns are the argmax of the float32 logits, it
sends near-ties back to the float32 head, and a greedy batch that uses it is still its own ``ar`` output."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from specdec_cli.engine.batch import generate_batch
from specdec_cli.engine.loop import Drafter, generate
from specdec_cli.runtime import decoder, head_screen
from specdec_cli.runtime.head_screen import GreedyRows, HeadScreen

from conftest import tiny_gemma3, tiny_llama

pytestmark = pytest.mark.skipif(not head_screen.works(), reason="no oneDNN packed bfloat16 product here")


def peaked(seed: int, vocab: int = 4000, width: int = 64, rows: int = 64):
    """A head whose rows' norms vary 10x and hidden rows that make peaked logits, as a trained model's do."""
    gen = torch.Generator().manual_seed(seed)
    scales = torch.logspace(-1, 0, vocab)[torch.randperm(vocab, generator=gen)]
    weight = torch.randn(vocab, width, generator=gen) * scales[:, None]
    h = weight[torch.randint(0, vocab, (rows,), generator=gen)] * 4 + torch.randn(rows, width, generator=gen)
    return weight, h


def proven(screen: HeadScreen, h: torch.Tensor) -> torch.Tensor | None:
    """The screen's tokens for every row of ``h``, or None where the proof left any row to the float32 head."""
    ids, settled = screen.rows(h)
    return ids if bool(settled.all()) else None


@pytest.mark.parametrize("seed", range(6))
def test_screened_tokens_are_the_float32_argmax(seed):
    weight, h = peaked(seed)
    screen = HeadScreen(weight)
    settled = 0
    for start in range(0, len(h), 8):  # 8 rows at a time: a row that is not settled sends only its forward back
        rows = h[start:start + 8]
        tokens = proven(screen, rows)
        if tokens is not None:
            assert tokens.tolist() == F.linear(rows, weight).argmax(1).tolist()
            settled += 1
    assert settled >= 6 and screen.settled == settled


def test_a_near_tie_is_left_to_the_float32_head():
    weight, h = peaked(0, rows=4)
    tied = weight.clone()
    best = F.linear(h, weight).argmax(1)
    tied[0] = tied[best[0]]  # an exact tie: the float32 argmax takes the lower index
    assert proven(HeadScreen(tied), h) is None
    close = weight.clone()
    close[0] = close[best[0]] * (1 + 2.0 ** -22)  # apart by less than float32's rounding of a 64-term sum
    assert proven(HeadScreen(close), h) is None


def flipped_pair(seed: int = 0):
    """A head of two rows and a hidden row where bfloat16 orders the two logits the other way round from float32:
    ``(weight [2, 64], h [1, 64])``, row 0 the float32 argmax."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(10_000):
        h = torch.randn(1, 64, generator=gen)
        w = torch.randn(64, generator=gen)
        weight = torch.stack([w + torch.randn(64, generator=gen) * 2.0 ** -9, w])
        exact = F.linear(h, weight)[0]
        rough = F.linear(h.bfloat16(), weight.bfloat16()).float()[0]
        if exact[0] > exact[1] and rough[0] < rough[1]:
            return weight, h
    raise AssertionError("no flipped pair found")


def test_a_bound_that_is_too_tight_is_caught(monkeypatch):
    """The error bound is what makes the screen exact: where bfloat16 orders two tokens the other way round, the
    screen settles on float32's token or on none. With the bound planted away, its self-check (the token that set
    the bound must pass it) still refuses the wrong token; without that check too, it picks it (planted in
    head_screen.py, this test fails)."""
    weight, h = flipped_pair()
    got = proven(HeadScreen(weight), h)
    assert got is None or got.tolist() == [0]
    broken = HeadScreen(weight)
    broken.w_max = broken.dw_max = broken.g = 0.0  # a planted bug: the screen's values taken as exact
    monkeypatch.setattr(head_screen, "ROUND16", 0.0)
    got = proven(broken, h)
    assert got is None or got.tolist() == [0]


def test_a_row_the_screen_cannot_settle_goes_back_to_the_float32_head(monkeypatch):
    """More candidates than TOP (a flat row), a non-finite value, or values past the flush premise: no token."""
    weight, h = peaked(2, rows=2)
    screen = HeadScreen(weight)
    assert proven(screen, torch.zeros_like(h)) is None  # every logit 0: all 4000 tokens tie
    assert proven(screen, torch.full_like(h, float("nan"))) is None
    assert proven(screen, h * 2.0 ** 30) is None  # past LARGEST
    monkeypatch.setattr(head_screen, "TOP", 2)
    flat = weight[:3].repeat(10, 1) + torch.randn(30, weight.shape[1]) * 1e-3  # near-duplicates of three rows
    assert proven(HeadScreen(flat), flat[:1] * 3) is None


def test_negative_logits_are_screened_exactly():
    """Every logit below zero: the cut takes its other branch (``s + R |s|`` inverted for ``s < 0``)."""
    weight, h = peaked(3, vocab=500, rows=16)
    shift = float(F.linear(h, weight).max()) + 1.0
    h2 = torch.cat([h, torch.ones(len(h), 1)], 1)  # one more input, always 1 ...
    w2 = torch.cat([weight, torch.full((len(weight), 1), -shift)], 1)  # ... times -shift: every logit below 0
    full = F.linear(h2, w2)
    assert (full < 0).all()
    screen = HeadScreen(w2)
    for row in range(len(h2)):
        got = proven(screen, h2[row:row + 1])
        assert got is None or got.tolist() == [int(full[row].argmax())]
    assert screen.settled >= len(h2) // 2


def test_the_screens_sums_stay_inside_their_bound_at_a_wide_row():
    """At n = 2048 the bfloat16 product's error, checked in float64, stays within its rounding and float32 terms
    (a kernel that rounded its partial sums to bfloat16 would not)."""
    gen = torch.Generator().manual_seed(4)
    n = 2048
    weight = torch.randn(256, n, generator=gen)
    h = torch.randn(8, n, generator=gen)
    screen = HeadScreen(weight)
    h16 = h.bfloat16()
    got = torch.ops.mkldnn._linear_pointwise(h16, screen.packed, None, "none", [], "").double()
    exact = h16.double() @ weight.bfloat16().double().T
    room = head_screen.ROUND16 * got.abs() + 2 * screen.g * (h16.double().norm(dim=1, keepdim=True)
                                                               * weight.bfloat16().double().norm(dim=1))
    assert ((got - exact).abs() <= room).all()


def test_the_screen_is_only_used_where_its_proof_holds(monkeypatch):
    monkeypatch.setattr(head_screen, "ENABLED", True)
    weight = torch.randn(32, 8)
    assert head_screen.usable(weight, None)
    assert not head_screen.usable(weight, 30.0)  # tanh soft-capping may round two logits to one value
    assert not head_screen.usable(weight.bfloat16(), None)  # a 16-bit head is its own product
    monkeypatch.setattr(head_screen, "ENABLED", False)
    assert not head_screen.usable(weight, None)


def test_rows_are_settled_one_by_one():
    """A row the proof cannot settle (a tie, zeros, NaN, past LARGEST) is marked so; the others keep their tokens,
    which are the float32 argmax."""
    weight, h = peaked(3, rows=6)
    tied = weight.clone()
    best = F.linear(h, weight).argmax(1)
    tied[0] = tied[best[1]]  # row 1 ties exactly; the other rows are clear
    h = h.clone()
    h[3], h[4], h[5] = 0.0, float("nan"), h[5] * 2.0 ** 30
    screen = HeadScreen(tied)
    ids, settled = screen.rows(h)
    assert settled.tolist() == [True, False, True, False, False, False]
    expected = F.linear(h, tied).argmax(1)
    assert ids[settled].tolist() == expected[settled].tolist()
    assert screen.unsettled == 1 and screen.rows_unsettled == 4 and proven(screen, h) is None


def test_unsettled_rows_are_computed_once_when_read():
    """GreedyRows resolves its unsettled rows (all at once) only when a reader reaches one, through any split part."""
    calls = []

    def resolve(rows):
        calls.append(rows.tolist())
        return torch.tensor([70, 71])

    rows = GreedyRows(torch.tensor([3, 1, 4, 1, 5]), (torch.tensor([False, True, False, False, True]), resolve))
    first, second = rows.split([2, 3])
    assert first[0].argmax() == 3 and second[1].argmax() == 1 and not calls  # settled rows: nothing computed
    assert second[2].argmax() == 71 and first[1].argmax() == 70
    assert calls == [[False, True, False, False, True]] and len(second) == 3
    with pytest.raises(IndexError):
        first[2]


def test_greedy_rows_read_as_logits_do():
    rows = GreedyRows(torch.tensor([3, 1, 4, 1, 5]))
    parts = rows.float().split([2, 3])
    assert [len(p) for p in parts] == [2, 3] and parts[1][0].argmax() == 4


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_a_greedy_batch_with_a_screened_head_is_its_own_ar_output(make, monkeypatch):
    monkeypatch.setattr(head_screen, "ENABLED", True)
    model = make(vocab=64)
    with torch.no_grad():  # peaked logits, as a trained model's, so that the screen settles most forwards
        model.lm_head.weight.mul_(4.0)
    rng = random.Random(5)
    prompts = [[rng.randrange(64) for _ in range(n)] for n in (3, 9, 1, 6, 12)]
    expected = [generate(model, p, Drafter(), max_new_tokens=16, seed=3).tokens for p in prompts]
    results = generate_batch(model, prompts, [Drafter() for _ in range(3)], max_new_tokens=16, seed=3)
    assert [r.tokens for r in results] == expected
    screen = decoder.decoder_for(model).head_screen
    assert screen is not None and screen.settled > 0


class Chain(Drafter):
    """A draft chain of the last three tokens repeated (a function of the tokens so far): sometimes accepted."""

    name = "chain"

    def propose(self, tokens, room):
        from specdec_cli.engine.loop import Draft

        chain = (tokens[-3:] * 3)[: min(room, 6)]
        return Draft(chain, list(range(-1, len(chain) - 1)), scores=[0.5] * len(chain))


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_one_greedy_sequence_with_a_screened_head_is_the_float32_heads_output(make, monkeypatch):
    """One sequence (the single loop's cache) reads the screened head too, when greedy: the same tokens and counts
    as with the float32 head, and the screen settled its forwards."""
    model = make(vocab=64)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    rng = random.Random(6)
    prompts = [[rng.randrange(64) for _ in range(n)] for n in (2, 7, 11)]
    runs = {}
    for enabled in (False, True):
        monkeypatch.setattr(head_screen, "ENABLED", enabled)
        decoder._DECODERS.pop(model, None)  # a fresh decoder: its screen made again under this setting
        runs[enabled] = [generate(model, p, drafter(), max_new_tokens=16, seed=3) for p in prompts
                         for drafter in (Drafter, Chain)]
    assert [r.tokens for r in runs[True]] == [r.tokens for r in runs[False]]
    assert [len(r.steps) for r in runs[True]] == [len(r.steps) for r in runs[False]]
    screen = decoder.decoder_for(model).head_screen
    assert screen is not None and screen.settled > 0


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_rows_the_screen_leaves_are_the_float32_heads(make, monkeypatch):
    """Every other row of every screened forward marked unsettled (its id garbage): the tokens read from those rows
    come from the float32 head, so one sequence and a batch are still the float32 head's outputs."""
    model = make(vocab=64)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    real = HeadScreen._tokens

    def every_other(self, h):
        ids, ok = real(self, h)
        ok, ids = ok.clone(), ids.clone()
        ok[1::2] = False
        ids[~ok] = 63  # wrong unless the float32 head replaces it
        return ids, ok

    rng = random.Random(7)
    prompts = [[rng.randrange(64) for _ in range(n)] for n in (2, 7, 11)]
    runs = {}
    for enabled in (False, True):
        monkeypatch.setattr(head_screen, "ENABLED", enabled)
        monkeypatch.setattr(HeadScreen, "_tokens", every_other)
        decoder._DECODERS.pop(model, None)
        one = [generate(model, p, drafter(), max_new_tokens=16, seed=3) for p in prompts for drafter in (Drafter, Chain)]
        batch = generate_batch(model, prompts, [Chain() for _ in range(2)], max_new_tokens=16, seed=3)
        runs[enabled] = [r.tokens for r in one + batch], [len(r.steps) for r in one]
    assert runs[True] == runs[False]
    screen = decoder.decoder_for(model).head_screen
    assert screen is not None and screen.rows_unsettled > 0


def test_a_greedy_profile_times_the_screened_head(monkeypatch, tmp_path):
    """A greedy run's profile is its own (``|greedy``) only where the head is screened, and it is timed on forwards
    the screen settles (the repeated block), as a real run's are."""
    from specdec_cli.runtime import profile

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    model = tiny_llama(vocab=64)
    monkeypatch.setattr(head_screen, "ENABLED", False)
    decoder._DECODERS.pop(model, None)
    plain = profile.profile_for(model)
    assert profile.profile_for(model, greedy=True).key == plain.key  # no screen: the same curve
    monkeypatch.setattr(head_screen, "ENABLED", True)
    decoder._DECODERS.pop(model, None)
    greedy = profile.profile_for(model, greedy=True)
    assert greedy.key != plain.key and greedy.info["greedy"]
    settled, unsettled = greedy.info["screen_settled"]
    assert settled > unsettled
    assert profile.profile_for(model, greedy=True).measured_s == greedy.measured_s  # cached
