"""ADED: PUCT/E by hand, Algorithm 2 on a tiny matrix, the tri-gram store, and greedy identity with ``ar``."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from specdec_cli.errors import SpecdecError
from specdec_cli.drafting.mcts import MCTSConfig, run_mcts
from specdec_cli.engine.trees import merge_paths
from specdec_cli.datastore import TrigramMatrix, build_trigram_datastore

V = 10


def exploration(total_visits: int, c1: float, c2: float) -> float:
    """Eq. 3: ``E = C1 + log((sum_b N(s, b) + C2 + 1) / C2)`` -- grows slowly with the parent's visits (the
    reference for the compiled search in drafting/mcts.py, which computes it inline)."""
    return c1 + math.log((total_visits + c2 + 1) / c2)


def puct(q: float, prior: float, visits: int, total_visits: int, c1: float, c2: float) -> float:
    """Eq. 2: ``Q(s, a) + E * P(s, a) * sqrt(sum_b N(s, b)) / (1 + N(s, a))``."""
    return q + exploration(total_visits, c1, c2) * prior * math.sqrt(total_visits) / (1 + visits)


def test_exploration_and_puct_by_hand():
    # E = c1 + log((N + c2 + 1) / c2) with N = 8, c1 = 32, c2 = 8: 32 + log(17 / 8)
    assert exploration(8, 32.0, 8.0) == pytest.approx(32 + math.log(17 / 8))
    assert exploration(0, 32.0, 8.0) == pytest.approx(32 + math.log(9 / 8))
    # PUCT = Q + E * P * sqrt(N) / (1 + n): Q = 1.5, P = 0.25, N = 8, n = 3
    e = 32 + math.log(17 / 8)
    assert puct(1.5, 0.25, 3, 8, 32.0, 8.0) == pytest.approx(1.5 + e * 0.25 * math.sqrt(8) / 4)
    # an unvisited parent gives no exploration bonus: only Q counts
    assert puct(0.7, 0.9, 0, 0, 32.0, 8.0) == pytest.approx(0.7)


def test_puct_prefers_prior_then_spreads_visits():
    # after one visit each, the child with the larger prior wins; many visits on it hand the turn to the other
    assert puct(1.0, 0.6, 1, 2, 32, 8) > puct(1.0, 0.4, 1, 2, 32, 8)
    assert puct(1.0, 0.6, 30, 31, 32, 8) < puct(1.0, 0.4, 1, 31, 32, 8)


def tiny_matrix() -> TrigramMatrix:
    # counts: (1,2)->3 x3, (1,2)->4 x1, (2,3)->5 x2, (2,4)->6 x1
    docs = [[1, 2, 3, 5], [1, 2, 3, 5], [1, 2, 3], [1, 2, 4, 6]]
    return TrigramMatrix.from_token_docs(docs, V, top_k=2)


def test_matrix_probabilities_and_pruning():
    m = TrigramMatrix.from_token_docs([[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 4], [1, 2, 4], [1, 2, 7]], V, top_k=2)
    assert m.probs(1, 2) == ([3, 4], [pytest.approx(0.6), pytest.approx(0.4)])  # 7 pruned (top 2), renormalised
    assert m.probs(2, 3) == ([], [])


def test_algorithm2_adjust_tiny_example():
    m = tiny_matrix()
    assert m.probs(1, 2) == ([3, 4], [pytest.approx(0.75), pytest.approx(0.25)])
    # tokens 1 2 4 9: tri-grams (1,2,4) seen -> 0.25 + 0.5; (2,4,9) unseen -> 0.5 (capped rule: min(p + inc, 1))
    assert m.adjust([1, 2, 4, 9], increment=0.5, max_prob=1.0) == 2
    assert m.overlay[m.key(1, 2)] == {3: pytest.approx(0.75), 4: pytest.approx(0.75)}
    assert m.overlay[m.key(2, 4)] == {6: pytest.approx(1.0), 9: pytest.approx(0.5)}
    assert m.probs(2, 4) == ([6, 9], [pytest.approx(2 / 3), pytest.approx(1 / 3)])
    # max_prob caps; a new tri-gram in a full row (top_k = 2) evicts the weakest entry
    m.adjust([1, 2, 3], increment=0.5, max_prob=1.0)
    assert m.overlay[m.key(1, 2)][3] == pytest.approx(1.0)
    m.adjust([1, 2, 8], increment=0.5, max_prob=1.0)
    assert m.overlay[m.key(1, 2)] == {3: pytest.approx(1.0), 4: pytest.approx(0.75)}  # 8 (0.5) is the weakest
    m.adjust([1, 2, 8], increment=0.9, max_prob=1.0)
    assert m.overlay[m.key(1, 2)] == {3: pytest.approx(1.0), 8: pytest.approx(0.9)}  # now 4 (0.75) goes


def test_mcts_finds_the_likely_continuation():
    m = tiny_matrix()
    found = run_mcts(m, 1, 2, MCTSConfig(iterations=50, depth=2, candidates=5), random.Random(0))
    seqs = [seq for seq, _ in found]
    assert seqs[0] == [3, 5]  # the most probable chain scores highest: 1 + 0.75 + 1
    assert [4, 6] in seqs
    assert run_mcts(m, 7, 7, MCTSConfig(), random.Random(0)) == []  # unseen context: no draft


def test_merge_paths_shares_prefixes():
    d = merge_paths([[3, 5, 1], [3, 5, 2], [4, 6]], max_depth=2)
    assert d.tokens == [3, 5, 4, 6]
    assert d.parents == [-1, 0, -1, 2]


def test_store_round_trip(tmp_path):
    docs = [[1, 2, 3, 5], [1, 2, 3, 5], [1, 2, 4, 6], [9, 9]]
    stats = build_trigram_datastore(docs, tmp_path / "tri", fingerprint="fp", vocab_size=V, top_k=12, progress=False)
    assert stats.documents == 4 and stats.tokens == 14 and stats.details["contexts"] == 3 and stats.bytes > 0
    m = TrigramMatrix.load(tmp_path / "tri", "fp")
    assert isinstance(m.keys, np.memmap)
    mem = TrigramMatrix.from_token_docs(docs, V)
    for a, b in [(1, 2), (2, 3), (2, 4), (9, 9)]:
        assert m.probs(a, b) == mem.probs(a, b)
    manifest = json.loads((tmp_path / "tri" / "manifest.json").read_text())
    assert manifest["kind"] == "trigram" and manifest["vocab_size"] == V and len(manifest["files"]) == 4
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary directory left


def test_saved_adapted_store_round_trip(tmp_path):
    build_trigram_datastore([[1, 2, 3, 5], [1, 2, 4]], tmp_path / "a", fingerprint="fp", vocab_size=V,
                            progress=False)
    m = TrigramMatrix.load(tmp_path / "a", "fp")
    m.adjust([1, 2, 4, 4, 7], increment=0.5)
    expected = {ctx: m.probs(*ctx) for ctx in [(1, 2), (2, 3), (2, 4), (4, 4)]}
    m.save(tmp_path / "b")
    again = TrigramMatrix.load(tmp_path / "b", "fp")
    for ctx, (ids, ps) in expected.items():
        got_ids, got_ps = again.probs(*ctx)
        assert got_ids == ids and got_ps == pytest.approx(ps, rel=1e-6)


def test_store_refuses_other_tokenizer_and_corruption(tmp_path):
    out = tmp_path / "tri"
    build_trigram_datastore([[1, 2, 3, 4, 5]], out, fingerprint="fp", vocab_size=V, progress=False)
    with pytest.raises(SpecdecError, match="another tokenizer"):
        TrigramMatrix.load(out, "other")
    original = (out / "next_ids.npy").read_bytes()
    data = bytearray(original)
    data[-1] ^= 0xFF
    (out / "next_ids.npy").write_bytes(bytes(data))
    with pytest.raises(SpecdecError, match="corrupt"):
        TrigramMatrix.load(out, "fp")
    (out / "next_ids.npy").write_bytes(original)
    TrigramMatrix.load(out, "fp")
    (out / "counts.npy").write_bytes((out / "counts.npy").read_bytes()[:-4])
    with pytest.raises(SpecdecError, match="truncated"):
        TrigramMatrix.load(out, "fp")
    (out / "manifest.json").unlink()
    with pytest.raises(SpecdecError, match="no manifest.json"):
        TrigramMatrix.load(out, "fp")
    with pytest.raises(SpecdecError, match="no such directory"):
        TrigramMatrix.load(tmp_path / "missing", "fp")


# ------------------------------------------------------------------------------------- real model, greedy


@pytest.fixture(scope="module")
def stdlib_store(smollm2, tmp_path_factory):
    import sysconfig
    from pathlib import Path

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:25]
    tok = smollm2.tokenizer
    docs = (tok(f.read_text(errors="ignore"), add_special_tokens=False)["input_ids"] for f in files)
    out = tmp_path_factory.mktemp("aded") / "trigram"
    build_trigram_datastore(docs, out, fingerprint=smollm2.fingerprint, vocab_size=smollm2.vocab_size,
                            progress=False)
    return out


from test_ngram_trie import greedy_cases  # noqa: E402,F401 - the same module-scoped ar reference outputs


def test_aded_greedy_matches_ar(smollm2, stdlib_store, greedy_cases, tmp_path):
    from specdec_cli import api

    drafter = api.make_drafter("aded", smollm2, datastore=str(stdlib_store), options={"iterations": "60"})
    accepted = candidates = 0
    for i, (ids, expected) in enumerate(greedy_cases):
        result = api.run(smollm2, ids, drafter, max_new_tokens=32)
        assert result.tokens == expected
        s = result.summary()
        # a new drafter's first step searches (a probe always drafts); a later generation's first step may still be
        # inside the gated stretch of a drafter that lost badly on the previous one (Budget.start: on a busy CPU the
        # search costs more than it yields), and then it does not search at all
        assert s["mcts_ms_per_step"] > 0 if i == 0 else (s["mcts_ms_per_step"] > 0 or s["gated_steps"] > 0)
        assert s["accepted"] <= s["drafted"] and s["mcts_empty_steps"] <= s["target_forwards"]
        accepted += s["accepted"]
        candidates += s["mcts_candidates_per_step"]
    assert candidates > 0 and accepted > 0  # the searches drafted, and the target took some of it
    assert drafter.stats()["adapted_contexts"] > 0
    drafter.save_adapted(tmp_path / "adapted")
    assert TrigramMatrix.load(tmp_path / "adapted", smollm2.fingerprint).overlay == {}


def test_aded_batched_matches_ar(smollm2, stdlib_store, greedy_cases):
    from specdec_cli import api

    drafters = api.make_drafters("aded", smollm2, [], api.RunSettings(max_new_tokens=32), batch_size=2,
                                 datastore=str(stdlib_store), options={"iterations": "60"})
    assert drafters[1].matrix is drafters[0].matrix  # one opened store, adapted by every slot
    results = api.run_batch(smollm2, [ids for ids, _ in greedy_cases], drafters, max_new_tokens=32)
    assert [r.tokens for r in results] == [expected for _, expected in greedy_cases]


def test_store_kinds_share_one_manifest_and_refuse_each_other(tmp_path):
    from specdec_cli.datastore import build_suffix_array_datastore
    from specdec_cli.datastore import format as fmt

    build_trigram_datastore([[1, 2, 3, 4, 5]], tmp_path / "tri", fingerprint="fp", vocab_size=V, progress=False)
    build_suffix_array_datastore([[1, 2, 3, 4, 5]], tmp_path / "sa", fingerprint="fp", vocab_size=V,
                                 progress=False)
    tri = fmt.read_manifest(tmp_path / "tri", "trigram")
    assert tri["format"] == fmt.FORMAT and tri["num_tokens"] == 5
    fmt.check_files(tmp_path / "tri", tri, verify=True)
    with pytest.raises(SpecdecError, match="is a 'suffix-array' datastore; this needs 'trigram'"):
        TrigramMatrix.load(tmp_path / "sa", "fp")
    with pytest.raises(SpecdecError, match="is a 'trigram' datastore; this needs 'suffix-array'"):
        fmt.read_manifest(tmp_path / "tri")
