"""Batched decoding (engine.batch, runtime.batch_cache): the batched forward computes each row's own logits; every
sequence of a batch is its own ``ar`` output (greedy), every method works batched, and sampled sequences do not
depend on their neighbours."""

from __future__ import annotations

import random

import pytest
import torch

from specdec_cli import api
from specdec_cli.engine.batch import generate_batch
from specdec_cli.engine.times import BatchShare
from specdec_cli.engine.drafters import Drafters
from specdec_cli.engine.loop import Draft, Drafter, generate
from specdec_cli.engine.sampling import SamplingConfig
from specdec_cli.runtime import forward
from specdec_cli.runtime.batch_cache import BatchCache
from specdec_cli.runtime import static_cache
from specdec_cli.runtime.cache import KVCache
from specdec_cli.runtime.cache_mode import CacheMode
from specdec_cli.runtime.masks import batch_mask, tree_mask
from specdec_cli.runtime.positions import ancestor_matrix, depths

from conftest import CHAT_PROMPTS, record_static_caches, tiny_gemma3, tiny_llama

VOCAB = 16


def random_tree(rng: random.Random, n: int) -> tuple[list[int], list[int]]:
    return [rng.randrange(VOCAB) for _ in range(n)], [rng.randrange(-1, i) for i in range(n)]


def path_to(parents: list[int], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


class RandomTrees(Drafter):
    """Random draft trees (a function of the tokens so far): mostly rejected, sometimes partly accepted."""

    name = "random"

    def propose(self, tokens, room):
        rng = random.Random(hash(tuple(tokens)))
        tokens, parents = random_tree(rng, min(room, rng.randrange(0, 7)))
        return Draft(tokens, parents, scores=[0.5] * len(tokens))


def ragged_batch(model, rng: random.Random):
    """Four random sequences of 3, 9, 1 and 6 tokens (ragged; one with no prefix to prefill), each prefilled alone
    and loaded into its row of one batch cache of 16 rows' capacity (less than the steps need: it must grow):
    ``(sequences, batch cache, one-sequence caches)``."""
    seqs = [[rng.randrange(VOCAB) for _ in range(n)] for n in (3, 9, 1, 6)]
    cache, singles = BatchCache(model, len(seqs), 16), []
    for row, seq in enumerate(seqs):
        single = forward.new_cache(model, 64)
        if len(seq) > 1:
            forward.forward_chain(model, single, seq[:-1], keep=0)
        cache.load_row(row, single, len(seq) - 1)
        singles.append(single)
    return seqs, cache, singles


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_batched_forward_gives_each_row_its_own_tree_logits(make):
    """Ragged rows (different lengths and draft trees, sliding windows on Gemma3) against one-sequence forwards,
    over several steps of random path acceptance."""
    model = make(vocab=VOCAB)
    rng = random.Random(0)
    seqs, cache, singles = ragged_batch(model, rng)
    for _ in range(4):
        trees = [random_tree(rng, rng.randrange(0, 6)) for _ in seqs]
        logits = cache.forward_rows(model, [([s[-1], *t], p) for s, (t, p) in zip(seqs, trees)])
        keep = []
        for row, (seq, (tokens, parents)) in enumerate(zip(seqs, trees)):
            expected = forward.forward_tree(model, singles[row], seq[-1], tokens, parents)
            torch.testing.assert_close(logits[row], expected, atol=1e-4, rtol=1e-4)
            path = path_to(parents, rng.randrange(len(parents))) if parents else []
            keep.append([0] + [i + 1 for i in path])
            forward.keep(singles[row], len(seq) - 1, keep[-1])
            seq += [tokens[i] for i in path] + [rng.randrange(VOCAB)]
        cache.keep_paths(keep)
        assert cache.lengths == [len(s) - 1 for s in seqs]
    order = cache.drop_rows([0, 2])  # finished rows leave; the last live row moves into the first hole
    assert order == [3, 1] and cache.lengths == [len(seqs[3]) - 1, len(seqs[1]) - 1]
    logits = cache.forward_rows(model, [([seqs[3][-1]], []), ([seqs[1][-1]], [])])
    for row, old in enumerate(order):
        torch.testing.assert_close(logits[row], forward.forward_tree(model, singles[old], seqs[old][-1], [], []),
                                   atol=1e-4, rtol=1e-4)


def batched_steps(model, steps: int = 4, seed: int = 1) -> list[torch.Tensor]:
    """Logits of a few batched steps over ragged rows with random trees and random accepted paths, and at the end
    every layer's keys and values of every row."""
    rng = random.Random(seed)
    seqs, cache, _ = ragged_batch(model, rng)
    out = []
    for _ in range(steps):
        trees = [random_tree(rng, rng.randrange(0, 6)) for _ in seqs]
        out += cache.forward_rows(model, [([s[-1], *t], p) for s, (t, p) in zip(seqs, trees)])
        keep = []
        for seq, (tokens, parents) in zip(seqs, trees):
            path = path_to(parents, rng.randrange(len(parents))) if parents else []
            keep.append([0] + [i + 1 for i in path])
            seq += [tokens[i] for i in path] + [rng.randrange(VOCAB)]
        cache.keep_paths(keep)
    for layer in cache.layers:
        out += [layer._k[b, :, :n] for b, n in enumerate(cache.lengths)]
        out += [layer._v[b, :, :n] for b, n in enumerate(cache.lengths)]
    return out


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_batched_lean_forward_is_the_module_code(make, monkeypatch):
    """A batch's forward runs the lean path (runtime.decoder.run_rows: one call of each module for all rows, no
    transformers machinery) and gives the module code's logits, keys and values: ragged rows, trees, rollback,
    Gemma-3's sliding windows. Bit for bit with SDPA's attention; with each row attending its own columns
    (runtime.attend.batch_rows, the default where numba compiles) the same up to attention's rounding."""
    from specdec_cli.runtime import attend, decoder
    from specdec_cli.runtime.jit import COMPILED

    model = make(vocab=VOCAB)
    lean_calls, own_columns = [], []
    real_run_rows, real_rows = decoder.run_rows, attend.batch_rows
    monkeypatch.setattr(decoder, "run_rows", lambda *a: lean_calls.append(real_run_rows(*a)) or lean_calls[-1])
    monkeypatch.setattr(attend, "batch_rows", lambda *a: own_columns.append(real_rows(*a)) or own_columns[-1])
    monkeypatch.setattr(attend, "ROWS", False)
    lean = batched_steps(model)
    assert lean_calls and all(logits is not None for logits in lean_calls)  # the lean path ran every step
    monkeypatch.setattr(attend, "ROWS", True)
    own = batched_steps(model)
    decoder.disable(model)  # transformers' module code from here on
    module = batched_steps(model)
    assert len(lean) == len(own) == len(module)
    for a, b, c in zip(lean, own, module):  # the same operations on the same inputs: the same bits
        assert torch.equal(a, c)
        assert torch.allclose(b, c, rtol=1e-5, atol=1e-5)
    assert not COMPILED or any(r is not None for r in own_columns)  # it ran, where numba compiles


def test_batch_mask_is_the_one_sequence_tree_mask_row_by_row():
    rng = random.Random(3)
    width, starts, window = 5, [4, 0, 9], 3
    ancs, q_pos = [], []
    for start in starts:
        parents = random_tree(rng, width - 1)[1]
        ancs.append(ancestor_matrix(parents))
        q_pos.append(start + torch.tensor([0] + depths(parents)))
    end = max(starts) + width
    mask = batch_mask(torch.tensor(starts), torch.stack(ancs), torch.stack(q_pos), end, window, torch.float32)
    for row, start in enumerate(starts):
        own = tree_mask(torch.arange(start + width), start, ancs[row], q_pos[row], window, torch.float32)
        assert torch.equal(mask[row, 0, :, : start + width], own[0, 0])
        assert (mask[row, 0, :, start + width:] < 0).all()  # another row's tail: never seen


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_every_sequence_of_a_batch_is_its_own_ar_output(make, temperature):
    """Greedy: identical to ar. Sampled: identical to ar with the same seed -- draws are keyed by position, so
    neither the drafts, the neighbours nor the batch size change a sequence."""
    model = make(vocab=VOCAB)
    rng = random.Random(1)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (3, 9, 1, 6, 12, 2, 5)]
    sampling = SamplingConfig(temperature)
    expected = [generate(model, p, Drafter(), max_new_tokens=20, sampling=sampling, seed=3, stop_ids={15}).tokens
                for p in prompts]
    for size in (1, 3, 7):
        for make_drafter in (Drafter, RandomTrees):
            results = generate_batch(model, prompts, [make_drafter() for _ in range(size)], max_new_tokens=20,
                                     sampling=sampling, seed=3, stop_ids={15})
            assert [r.tokens for r in results] == expected


@pytest.mark.parametrize("case", ["greedy", "sampled", "greedy, a draft copying the target"])
def test_only_greedy_rows_attend_their_own_columns(case, monkeypatch):
    """A sampled batch attends with SDPA's bits, the module code's: a draw near a tie never moves with attention's
    rounding, so its counts match at B = 1 and 4 (scripts/counts.sh, --batch-size 1,4). So does a batch
    whose draft model copies the target's keys and values (an entropy window cut from the draft's logits would
    move too). Other greedy rows take runtime/attend.batch_rows where numba compiles (their outputs are ar's)."""
    from specdec_cli.io.models import LoadedModel
    from specdec_cli.methods.sd import SpeculativeSampling
    from specdec_cli.runtime import attend
    from specdec_cli.runtime.jit import COMPILED

    model = tiny_llama(vocab=VOCAB, seed=0)
    rng = random.Random(2)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (3, 9, 6)]
    seen, own, real = [], [], attend.batch_rows
    monkeypatch.setattr(attend, "batch_rows", lambda *a: own.append(a[1].owner.own_columns) or seen.append(real(*a))
                        or seen[-1])
    if case.endswith("target"):
        copy = LoadedModel(tiny_llama(vocab=VOCAB, seed=0), None, "tiny-copy", False, info={"copy_of_target": True})
        drafters = [SpeculativeSampling(copy, VOCAB, 3) for _ in range(3)]
    else:
        drafters = [RandomTrees() for _ in range(3)]
    results = generate_batch(model, prompts, drafters, max_new_tokens=12,
                             sampling=SamplingConfig(0.9 if case == "sampled" else 0.0), seed=3)
    assert seen and len(results) == 3  # batched forwards asked
    if case == "greedy":
        assert all(own) and (not COMPILED or any(r is not None for r in seen))
    else:
        assert not any(own) and all(r is None for r in seen)


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_a_batch_of_one_takes_the_drafters_static_path(make, monkeypatch):
    """One cache interface (issue 34): a one-row batch decodes in the single loop's cache of the drafters' engine
    path -- the static cache here -- through the same forward_rows/keep_paths calls; outputs stay ar's."""
    model = make(vocab=VOCAB)
    rng = random.Random(4)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (7, 3, 11)]
    expected = [generate(model, p, Drafter(), max_new_tokens=16).tokens for p in prompts]
    made = record_static_caches(monkeypatch)
    drafter = RandomTrees()
    drafter.cache_mode = CacheMode.STATIC
    for _ in range(2):  # the static cache is kept for reuse: the second batch (and the single loop) get it again
        results = generate_batch(model, prompts, [drafter], max_new_tokens=16)
        assert [r.tokens for r in results] == expected
    assert generate(model, prompts[0], drafter, max_new_tokens=16, cache_mode=CacheMode.STATIC).tokens == expected[0]
    assert len(made) == 3 and made[0].mode is CacheMode.STATIC and isinstance(made[0], KVCache)
    many = BatchCache(model, 2, 8)
    assert isinstance(many, KVCache) and many.row_view(1).length == 0  # many rows: the same interface
    for one_sequence_only in (lambda: many.crop_to(0), lambda: many.forward(model, [1]),
                              lambda: many.keep_tree_rows(0, [0])):
        with pytest.raises(NotImplementedError, match="row_view"):
            one_sequence_only()


def test_a_draft_copy_of_the_target_reads_a_batch_of_ones_static_cache():
    """sd with a draft model that is a copy of the target, one slot on the static path: the draft reads the target's
    keys and values from the one-sequence cache itself (row_view of row 0); every drafted token is accepted and
    every output is ar's, over several prompts through the same kept cache."""
    from specdec_cli.io.models import LoadedModel
    from specdec_cli.methods.sd import SpeculativeSampling

    target = tiny_llama(vocab=VOCAB, seed=0)
    loaded = LoadedModel(tiny_llama(vocab=VOCAB, seed=0), None, "tiny-draft", False, info={"copy_of_target": True})
    rng = random.Random(8)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (12, 5, 20)]
    expected = [generate(target, p, Drafter(), max_new_tokens=24).tokens for p in prompts]
    drafter = SpeculativeSampling(loaded, VOCAB, 4)
    drafter.cache_mode = CacheMode.STATIC
    results = generate_batch(target, prompts, [drafter], max_new_tokens=24)
    assert [r.tokens for r in results] == expected
    assert isinstance(drafter.dm.cache, static_cache.StaticCache)
    drafted = sum(s.drafted for r in results for s in r.steps)
    assert drafted > 0 and sum(s.accepted for r in results for s in r.steps) == drafted


def test_a_sampled_chain_does_not_depend_on_its_neighbours():
    """sd with temperature: rejection sampling consumes randomness as the row's own budget decides; prices are the
    fixed batch size's, so prompt 0's output is the same whoever shares the batch with it."""
    from specdec_cli.engine.budget import Budget
    from specdec_cli.io.models import LoadedModel
    from specdec_cli.methods.sd import SpeculativeSampling
    from specdec_cli.runtime.profile import Profile

    target, draft = tiny_llama(vocab=VOCAB, seed=0), tiny_llama(vocab=VOCAB, seed=1)
    times = Profile([1, 4, 16, 64], [0.05, 0.051, 0.053, 0.06])  # drafting pays

    def drafters(n):
        out = []
        for _ in range(n):
            d = SpeculativeSampling(LoadedModel(draft, None, "tiny-draft", False), VOCAB, window=4)
            d.budget = Budget("auto", times)
            out.append(d)
        return out

    sampling = SamplingConfig(1.0)
    first = [[1, 2, 3]]
    runs = [generate_batch(target, first + others, drafters(3), max_new_tokens=16, sampling=sampling, seed=5)[0]
            for others in ([[4, 5]], [[6, 7, 8, 9], [10]], [[11], [12, 13], [14]])]
    assert runs[0].tokens == runs[1].tokens == runs[2].tokens
    assert sum(s.drafted for s in runs[0].steps) > 0


def test_results_come_as_they_finish_and_are_returned_in_input_order():
    model = tiny_llama(vocab=VOCAB)
    prompts = [[1, 2, 3], [4], [5, 6]]
    seen = []
    results = generate_batch(model, prompts, [Drafter(), Drafter()], max_new_tokens=5,
                             on_result=lambda i, r: seen.append(i))
    assert sorted(seen) == [0, 1, 2] and [r.prompt_tokens for r in results] == prompts
    assert all(r.extra["latency_s"] > 0 and len(r.tokens) == 5 for r in results)


class SlotRecorder(Drafter):
    """Proposes nothing; records which slot served which sequence, and when it finished."""

    def __init__(self, slot: int, log: list):
        self.slot, self.log = slot, log

    def start(self, prompt, cfg, generator):
        super().start(prompt, cfg, generator)
        self.log.append(("start", self.slot, prompt[0]))

    def propose(self, tokens, max_tokens):
        self.log.append(("propose", self.slot, tokens[0]))
        return Draft()

    def finish(self):
        self.log.append(("finish", self.slot))


def test_one_drafters_object_keys_its_sequences_by_id():
    """A run's drafter is one object: a sequence takes the slot idle longest, every call for it reaches that slot,
    the slot is idle again when it ends, and a new run starts from the first slots in order."""
    log = []
    drafters = Drafters([SlotRecorder(i, log) for i in range(3)])
    greedy = SamplingConfig()
    drafters.open(2)  # two rows: the third slot stays out of this run
    drafters.begin(7, [70], greedy, None, None)
    drafters.begin(3, [30], greedy, None, None)
    drafters.propose(3, [30], 4)
    drafters.propose(7, [70], 4)
    assert log == [("start", 0, 70), ("start", 1, 30), ("propose", 1, 30), ("propose", 0, 70)]
    with pytest.raises(ValueError, match="already live"):
        drafters.begin(7, [71], greedy, None, None)
    with pytest.raises(ValueError, match="no idle drafter slot"):
        drafters.begin(9, [90], greedy, None, None)
    drafters.end(7)
    drafters.begin(9, [90], greedy, None, None)
    assert drafters.live == {3: drafters[1], 9: drafters[0]}
    drafters.open(3)  # a new run forgets the sequences an interrupted one left live
    assert drafters.live == {} and drafters.idle == list(drafters)
    broken = drafters[0]
    broken.start = lambda *a: 1 / 0
    with pytest.raises(ZeroDivisionError):  # a sequence that never began leaves its slot idle, first in line
        drafters.begin(4, [40], greedy, None, None)
    assert drafters.live == {} and drafters.idle[0] is broken
    del broken.start
    assert len(Drafters.of(SlotRecorder(i, log) for i in range(2))) == 2 and len(Drafters.of(Drafter())) == 1
    with pytest.raises(TypeError, match="not drafters"):
        Drafters.of([Drafter(), "auto"])
    log.clear()
    drafters.finish()
    assert log == [("finish", 2), ("finish", 1), ("finish", 0)]  # the first slot, which saves what is shared, last


def test_a_batch_hands_finished_slots_to_waiting_prompts_in_order():
    """Through the batch loop: prompt ``i`` starts in the slot that waited longest (the same assignment the loop
    made when it held a list of free drafters)."""
    log = []
    model = tiny_llama(vocab=VOCAB)
    prompts = [[1, 2], [3, 4], [5, 6], [7, 8]]
    generate_batch(model, prompts, Drafters([SlotRecorder(i, log) for i in range(2)]), max_new_tokens=3)
    assert [entry[1:] for entry in log if entry[0] == "start"] == [(0, 1), (1, 3), (0, 5), (1, 7)]


def test_rows_freed_together_with_fewer_prompts_waiting():
    """Three rows finish in the same step and two prompts wait: the third row leaves the batch."""
    model = tiny_gemma3(vocab=VOCAB)
    prompts = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [3, 1, 4], [1, 5, 9]]
    expected = [generate(model, p, Drafter(), max_new_tokens=6).tokens for p in prompts]
    results = generate_batch(model, prompts, [RandomTrees() for _ in range(3)], max_new_tokens=6)
    assert [r.tokens for r in results] == expected


def test_a_row_pays_its_share_of_the_whole_batch_forward():
    times = lambda rows, width: 0.05 + 0.01 * rows * width  # noqa: E731 - a forward over rows x width tokens
    share = BatchShare(times, rows=4)
    assert share(1) == pytest.approx(times(4, 1) / 4)
    assert share(3) - share(1) == pytest.approx((times(4, 3) - times(4, 1)) / 4)


def test_batch_times_interpolate_between_measured_row_counts():
    from specdec_cli.runtime.batch_profile import WIDTHS, BatchTimes

    times = BatchTimes({1: [1.0 * w for w in WIDTHS], 4: [2.0 * w for w in WIDTHS]})
    assert times(1, 2) == pytest.approx(2.0) and times(4, 3) == pytest.approx(6.0)
    assert times(2, 1) == pytest.approx(1.0 + (2.0 - 1.0) / 3)
    assert times(8, 1) == pytest.approx(4.0)  # beyond the largest measured batch: linear in rows
    assert times(4, 16) == pytest.approx(32.0)  # beyond the widths: proportional to the tokens


def test_a_sampled_batch_is_priced_by_forwards_timed_on_its_own_path(tmp_path, monkeypatch):
    """A sampled batch attends with SDPA, a greedy one by row spans: each is priced by a table timed on that path,
    cached under a key of its own."""
    from specdec_cli.runtime import batch_profile

    model = tiny_llama(vocab=VOCAB)
    made, real_cache = [], batch_profile.BatchCache
    monkeypatch.setattr(batch_profile, "BatchCache", lambda *a, **k: made.append(real_cache(*a, **k)) or made[-1])
    for exact in (False, True):  # the real timing, on a tiny model: the cache it times is on the asked path
        assert len(batch_profile.measure_rows(model, 2, context=8, exact=exact)) == len(batch_profile.WIDTHS)
    assert [c.own_columns for c in made] == [True, False]
    monkeypatch.setattr(batch_profile, "_path", lambda key: tmp_path / (str(abs(hash(key))) + ".json"))
    timed = []

    def fake(model, rows, context=0, exact=False):
        timed.append((rows, exact))
        return [(2.0 if exact else 1.0) * w for w in batch_profile.WIDTHS]

    monkeypatch.setattr(batch_profile, "measure_rows", fake)
    greedy, sampled = batch_profile.batch_times_for(model, 2), batch_profile.batch_times_for(model, 2, exact=True)
    assert sorted(timed) == [(1, False), (1, True), (2, False), (2, True)]
    assert sampled(2, 1) == pytest.approx(2 * greedy(2, 1))
    batch_profile.batch_times_for(model, 2, exact=True)  # cached: timed once per path
    assert len(timed) == 4


# --- real model: every method batched ---------------------------------------------------------------------------

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def cases(smollm2):
    texts = [CHAT_PROMPTS[0], "def fibonacci(n):", CHAT_PROMPTS[1], CHAT_PROMPTS[0]]
    out = []
    for k, text in enumerate(texts):
        ids = api.encode_prompt(smollm2, text, raw=k == 1, max_new_tokens=NEW_TOKENS)
        out.append((ids, api.run(smollm2, ids, api.make_drafter("ar", smollm2), max_new_tokens=NEW_TOKENS).tokens))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("method,drafts", [("auto", 0), ("pld", 0), ("ngram-trie", 0), ("auto", 1), ("sd", 1),
                                          ("self-verify", 1), ("hsddw", 2)])
def test_every_method_batched_matches_ar_on_smollm2(smollm2, smollm2_int8, cases, method, drafts):
    from specdec_cli.io.models import load_draft

    models = [smollm2_int8, load_draft("bf16:", smollm2)][:drafts]
    drafters = api.make_drafters(method, smollm2, models, api.RunSettings(max_new_tokens=NEW_TOKENS), batch_size=3)
    results = api.run_batch(smollm2, [ids for ids, _ in cases], drafters, max_new_tokens=NEW_TOKENS)
    for d in reversed(drafters):
        d.finish()
    assert [r.tokens for r in results] == [tokens for _, tokens in cases]


@pytest.mark.slow
def test_batched_auto_shares_its_memory_across_slots(smollm2, cases):
    drafters = api.make_drafters("auto", smollm2, [], api.RunSettings(max_new_tokens=NEW_TOKENS), batch_size=2)
    assert drafters[1].memory is drafters[0].memory
    assert drafters[1].run_calibration is drafters[0].run_calibration  # greedy: learnt from every slot's steps
    api.run_batch(smollm2, [ids for ids, _ in cases], drafters, max_new_tokens=NEW_TOKENS)
    for d in reversed(drafters):
        d.finish()
    assert len(drafters[0].memory.sequences) == len(cases)
    assert all(d.calibration is d.run_calibration for d in drafters) and drafters[0].run_calibration.cells
    learnt = drafters[0].run_calibration.state()
    sampled = api.run_batch(smollm2, [ids for ids, _ in cases], drafters, max_new_tokens=8,
                            sampling=SamplingConfig(temperature=0.8))
    assert len(sampled) == len(cases)  # sampled: each generation's own calibration, never the run's
    assert all(d.calibration is not d.run_calibration for d in drafters)
    assert drafters[0].run_calibration.state() == learnt and drafters[1].state()["calibration"] == learnt
