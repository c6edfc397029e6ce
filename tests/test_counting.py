"""The compiled frequency trie and the indexed suffix-array search give exactly what the plain formulations give."""

from collections import Counter

import numpy as np
import pytest

from specdec_cli.drafting.count_trie import count_trie, top_by_count


def reference_count_trie(continuations):
    """The np.unique-per-depth formulation the compiled one replaced (nodes depth by depth, (parent, token))."""
    k, length = continuations.shape
    parent_of_row = np.full(k, -1, dtype=np.int64)
    tokens, parents, counts, depths = [], [], [], []
    next_id = 0
    base = int(continuations.max(initial=0)) + 2
    for depth in range(length):
        rows = continuations[:, depth] >= 0
        if not rows.any():
            break
        keys = (parent_of_row[rows] + 1) * base + continuations[rows, depth]
        uniq, inverse, count = np.unique(keys, return_inverse=True, return_counts=True)
        tokens.append(uniq % base)
        parents.append(uniq // base - 1)
        counts.append(count)
        depths.append(np.full(uniq.size, depth))
        parent_of_row[rows] = next_id + inverse.reshape(-1)
        next_id += uniq.size
    cat = lambda parts: np.concatenate(parts).astype(np.int64) if parts else np.empty(0, np.int64)  # noqa: E731
    return cat(tokens), cat(parents), cat(counts), cat(depths)


def random_rows(rng, k, length, vocab):
    rows = rng.integers(0, vocab, size=(k, length))
    rows[:, 1:] = np.where(rng.random((k, length - 1)) < 0.7, rows[rng.integers(0, max(k // 4, 1), k)][:, 1:],
                           rows[:, 1:])  # shared prefixes, as real continuations have
    ends = rng.integers(0, length + 1, size=k)
    rows[np.arange(length)[None, :] >= ends[:, None]] = -1  # continuations cut at a document end
    return rows


@pytest.mark.parametrize("seed", range(30))
def test_compiled_trie_matches_reference(seed):
    rng = np.random.default_rng(seed)
    rows = random_rows(rng, int(rng.integers(1, 400)), int(rng.integers(1, 12)), int(rng.choice([3, 20, 300000])))
    trie = count_trie(rows)
    want = reference_count_trie(rows)
    for got, ref in zip((trie.tokens, trie.parents, trie.counts, trie.depths), want):
        np.testing.assert_array_equal(got, ref)
    for top_c in (1, 8, 64):
        top = top_by_count(trie, top_c)
        assert len(top) == min(top_c, len(trie))


def test_empty_and_all_ended_rows():
    assert len(count_trie(np.empty((0, 10), dtype=np.int64))) == 0
    assert len(count_trie(np.full((5, 4), -1, dtype=np.int64))) == 0


def reference_top(trie, top_c):
    """Rank every node by (count desc, depth, token, creation order) -- what the partitioned selection shortcuts."""
    ranked = np.lexsort((trie.tokens, trie.depths, -trie.counts))[:top_c]
    chosen = np.sort(ranked)
    return chosen[np.lexsort((trie.tokens[chosen], -trie.counts[chosen], trie.depths[chosen]))]


@pytest.mark.parametrize("seed", range(30))
def test_top_selection_matches_full_ranking(seed):
    rng = np.random.default_rng(100 + seed)
    trie = count_trie(random_rows(rng, int(rng.integers(50, 1000)), 10, int(rng.choice([5, 50, 300000]))))
    for top_c in (1, 4, 16, 64):
        top = top_by_count(trie, top_c)
        want = reference_top(trie, top_c)
        np.testing.assert_array_equal(top.tokens, trie.tokens[want])
        np.testing.assert_array_equal(top.counts, trie.counts[want])
        np.testing.assert_array_equal(top.depths, trie.depths[want])


# --- the top-level index of the suffix-array search ----------------------------------------------------------

def _store(tmp_path, rng, vocab, docs=40, shard_bytes=None):
    from specdec_cli.datastore import build_suffix_array_datastore

    corpus = [rng.integers(0, vocab, size=int(rng.integers(1, 300))).tolist() for _ in range(docs)]
    kw = {"shard_bytes": shard_bytes} if shard_bytes else {}
    build_suffix_array_datastore(corpus, tmp_path / "ds", fingerprint="fp", vocab_size=vocab, progress=False, **kw)
    return tmp_path / "ds", corpus


@pytest.mark.parametrize("vocab,stride", [(5, 1), (5, 4), (300, 3), (70000, 2)])
def test_indexed_search_equals_full_search(tmp_path, vocab, stride):
    from specdec_cli.datastore import SuffixArrayDatastore
    from specdec_cli.datastore import format as fmt
    from specdec_cli.datastore.suffix_array import search

    rng = np.random.default_rng(vocab + stride)
    folder, corpus = _store(tmp_path, rng, vocab)
    store = SuffixArrayDatastore.load(folder)
    shard = store.shards[0]
    keys = search.sample_keys(shard.data_u8, shard.sa_i32, stride)
    for _ in range(300):
        doc = corpus[int(rng.integers(len(corpus)))]
        start = int(rng.integers(len(doc)))
        query = doc[start: start + int(rng.integers(1, 6))]
        if rng.random() < 0.3:
            query = rng.integers(0, vocab, size=int(rng.integers(1, 4))).tolist()
        q = fmt.encode_tokens(query, store.width)
        assert search.indexed_range(shard.data_u8, shard.sa_i32, keys, stride, q) == search.match_range(
            shard.data_u8, shard.sa_i32, q)


def test_retrieval_spreads_picks_over_shards_like_one_store(tmp_path):
    """Several shards searched in one compiled call give the matches one big shard gives (counts and rows)."""
    from specdec_cli.datastore import SuffixArrayDatastore

    rng = np.random.default_rng(7)
    folder, corpus = _store(tmp_path, rng, 6, docs=60, shard_bytes=2000)
    store = SuffixArrayDatastore.load(folder)
    assert len(store.shards) > 3
    for _ in range(100):
        doc = corpus[int(rng.integers(len(corpus)))]
        context = doc[: int(rng.integers(1, len(doc) + 1))]
        got = store.retrieve(context, 4, 3, max_matches=10**6)
        n = got.match_length
        want = Counter()  # every occurrence of the last n tokens, and the 3 tokens after it (within a document)
        for d in corpus:
            for i in range(len(d) - n + 1):
                if n and d[i: i + n] == context[-n:]:
                    want[tuple(d[i + n: i + n + 3] + [-1] * (3 - len(d[i + n: i + n + 3])))] += 1
        assert got.match_count == sum(want.values())
        assert Counter(map(tuple, got.continuations.tolist())) == want


def test_store_without_index_files_and_corrupt_index(tmp_path):
    """Stores built before the index existed load (it is sampled at load); a wrong index is caught at load."""
    import json

    from specdec_cli.datastore import SuffixArrayDatastore
    from specdec_cli.errors import SpecdecError

    rng = np.random.default_rng(3)
    folder, corpus = _store(tmp_path, rng, 50)
    want = SuffixArrayDatastore.load(folder).retrieve(corpus[0][:5], 16, 10)
    manifest = json.loads((folder / "manifest.json").read_text())
    keys_file = folder / manifest["shards"][0]["keys"]
    original = np.load(keys_file)
    np.save(keys_file, np.zeros_like(original))
    with pytest.raises(SpecdecError, match="top-level index"):
        SuffixArrayDatastore.load(folder)
    for shard in manifest["shards"]:
        del shard["keys"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    got = SuffixArrayDatastore.load(folder).retrieve(corpus[0][:5], 16, 10)
    assert got.match_count == want.match_count
    np.testing.assert_array_equal(got.continuations, want.continuations)


def test_rest_context_source_leads_the_tree(tmp_path):
    """With ``context`` on, the continuation of the tail's earlier occurrence in the request itself is the first
    branch of rest's tree, even where the datastore knows something else; with it off, only the datastore."""
    from specdec_cli.datastore import SuffixArrayDatastore, build_suffix_array_datastore
    from specdec_cli.methods.rest import RestDrafter
    from specdec_cli.engine.sampling import SamplingConfig

    build_suffix_array_datastore([[1, 2, 3, 4], [7, 2, 3, 9, 9]], tmp_path / "ds", fingerprint="fp", vocab_size=20,
                                 progress=False)
    store = SuffixArrayDatastore.load(tmp_path / "ds")
    prompt = [5, 2, 3, 11, 12, 13, 6, 2, 3]  # "2 3" occurs earlier in the request, followed by 11 12 13
    for context, first in ((True, [11, 12, 13, 6]), (False, [4])):
        drafter = RestDrafter(store, max_matches=10, context=context)
        drafter.start(prompt, SamplingConfig(), None)
        draft = drafter.propose(list(prompt), 4)
        chain, node = [], 0
        while node is not None:  # follow the first child from the root down
            chain.append(draft.tokens[node])
            node = next((i for i, p in enumerate(draft.parents) if p == node), None)
        assert chain[: len(first)] == first
        assert drafter.stats()["context_hits"] == int(context)
