"""Suffix-array datastore: byte coding, suffix array vs naive sort, shards, retrieval vs brute force, trie,
integrity checks (tokenizer, truncation, corruption), corpus readers."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from specdec_cli.io.corpora import iter_documents, iter_json_array, record_texts, tokenize_documents
from specdec_cli.datastore import SuffixArrayDatastore, build_suffix_array_datastore
from specdec_cli.drafting.count_trie import count_trie as build_trie, top_by_count as select_top
from specdec_cli.datastore import format as fmt
from specdec_cli.datastore.suffix_array.build import ByteBuffer, aligned_suffixes
from specdec_cli.errors import SpecdecError

SAMPLE = Path(__file__).resolve().parent.parent / "datastores" / "samples" / "ultrachat-sample.jsonl"
FP = "f" * 32


def random_docs(seed: int, vocab: int, n_docs: int = 12, alphabet: int = 5, max_len: int = 30) -> list[list[int]]:
    """Repetitive documents (few distinct ids, some near the top of the vocabulary) so matches are plentiful."""
    rng = random.Random(seed)
    ids = [0, 1, vocab - 1, vocab - 2, vocab // 2][:alphabet]
    return [[rng.choice(ids) for _ in range(rng.randint(1, max_len))] for _ in range(n_docs)]


def naive_sorted_suffixes(docs: list[list[int]], sep: int) -> list[tuple[int, ...]]:
    flat = [t for doc in docs for t in (*doc, sep)]
    suffixes = [tuple(flat[i:]) for i in range(len(flat)) if flat[i] != sep]
    return sorted(suffixes)


def shard_bytes_array(docs: list[list[int]], width: int) -> np.ndarray:
    """Documents with a separator after each, as a writable 1-D uint8 array (divsufsort's input)."""
    buf = ByteBuffer(width)
    for doc in docs:
        buf.add(doc)
    return buf.array()


def build(tmp_path: Path, docs, vocab: int, name: str = "ds", **kw) -> Path:
    out = tmp_path / name
    build_suffix_array_datastore(docs, out, fingerprint=FP, vocab_size=vocab, progress=False, **kw)
    return out


# --- coding and suffix arrays -----------------------------------------------------------------------------


@pytest.mark.parametrize("vocab,width", [(100, 2), (65_534, 2), (65_535, 3), (200_000, 3)])
def test_token_width_and_roundtrip(vocab, width):
    assert fmt.token_width(vocab) == width
    ids = np.array([0, 1, vocab - 1, fmt.separator(width)])
    assert fmt.decode_tokens(fmt.encode_tokens(ids, width), width).tolist() == ids.tolist()


@pytest.mark.parametrize("vocab", [50, 200_000])  # width 2 and width 3 (> 65,535 ids)
def test_suffix_array_matches_naive_sort(vocab):
    width = fmt.token_width(vocab)
    docs = random_docs(1, vocab, n_docs=15)
    data = shard_bytes_array(docs, width)
    assert data.dtype == np.uint8 and data.ndim == 1 and data.flags.writeable
    sa = aligned_suffixes(data, width)
    tokens = fmt.decode_tokens(data, width).tolist()
    got = [tuple(tokens[off // width:]) for off in sa.tolist()]
    assert got == naive_sorted_suffixes(docs, fmt.separator(width))
    assert all(off % width == 0 for off in sa.tolist())


def test_shards_cover_all_suffixes(tmp_path):
    docs = random_docs(2, 70_000, n_docs=40)
    out = build(tmp_path, docs, 70_000, shard_bytes=120)
    store = SuffixArrayDatastore.load(out, FP, verify=True)
    assert len(store.shards) > 2
    assert store.manifest["num_tokens"] == sum(map(len, docs))
    assert sum(s.sa.size for s in store.shards) == sum(map(len, docs))
    for shard in store.shards:
        assert shard.data.size < 120 + 1 and shard.data[-3:].tolist() == [255, 255, 255]


# --- retrieval vs brute force -----------------------------------------------------------------------------


def brute_force(docs, context, n_max, cont_len):
    """Longest suffix of ``context`` occurring in some document, and the multiset of its continuations."""
    for n in range(min(n_max, len(context)), 0, -1):
        query = context[-n:]
        conts = [tuple(doc[i + n:i + n + cont_len]) for doc in docs for i in range(len(doc) - n + 1)
                 if doc[i:i + n] == query]
        if conts:
            return n, Counter(conts)
    return 0, Counter()


@pytest.mark.parametrize("vocab,shard_bytes", [(60, 10_000), (200_000, 10_000), (60, 50)])
def test_retrieval_matches_brute_force(tmp_path, vocab, shard_bytes):
    docs = random_docs(3, vocab, n_docs=30, max_len=20)  # <= 24 tokens: no document is cut at a shard border
    store = SuffixArrayDatastore.load(build(tmp_path, docs, vocab, shard_bytes=shard_bytes), FP)
    rng = random.Random(4)
    alphabet = sorted({t for d in docs for t in d}) + [7]  # 7: absent from the data
    for _ in range(60):
        context = [rng.choice(alphabet) for _ in range(rng.randint(1, 20))]
        n, expected = brute_force(docs, context, n_max=6, cont_len=4)
        got = store.retrieve(context, n_max=6, cont_len=4, max_matches=10**9)
        assert got.match_length == n
        assert got.match_count == sum(expected.values())
        rows = Counter(tuple(t for t in row.tolist() if t >= 0) for row in got.continuations)
        assert rows == expected


def test_retrieval_samples_evenly_when_capped(tmp_path):
    docs = [[5, 6, 7] for _ in range(100)] + [[5, 9]]
    store = SuffixArrayDatastore.load(build(tmp_path, docs, 50), FP)
    got = store.retrieve([5], n_max=4, cont_len=2, max_matches=10)
    assert got.match_length == 1 and got.match_count == 101 and len(got.continuations) == 10


def test_no_match_gives_empty_draft(tmp_path):
    store = SuffixArrayDatastore.load(build(tmp_path, [[1, 2, 3]], 50), FP)
    got = store.retrieve([9, 9], n_max=4, cont_len=3)
    assert got.match_length == 0 and got.continuations.shape[0] == 0
    assert len(select_top(build_trie(got.continuations), 8)) == 0


# --- trie ---------------------------------------------------------------------------------------------------


def prefix_counts(rows):
    counts = Counter()
    for row in rows:
        row = [t for t in row if t >= 0]
        for j in range(1, len(row) + 1):
            counts[tuple(row[:j])] += 1
    return counts


def node_paths(trie):
    paths = []
    for tok, parent in zip(trie.tokens.tolist(), trie.parents.tolist()):
        paths.append((paths[parent] if parent >= 0 else ()) + (tok,))
    return paths


def test_trie_counts_and_top_c_prefix_closed():
    rng = np.random.default_rng(0)
    conts = rng.integers(0, 4, size=(300, 6))
    conts[rng.random(conts.shape) < 0.08] = -1
    conts = np.where(np.cumprod(conts >= 0, axis=1).astype(bool), conts, -1)
    trie = build_trie(conts)
    expected = prefix_counts(conts.tolist())
    assert dict(zip(node_paths(trie), trie.counts.tolist())) == dict(expected)
    for c in (1, 5, 17, 64):
        top = select_top(trie, c)
        paths = node_paths(top)
        assert len(top) == min(c, len(expected))
        assert all(p < i for i, p in enumerate(top.parents.tolist()))  # topological (BFS) order
        assert all(path[:-1] in set(paths) or len(path) == 1 for path in paths)  # prefix-closed
        assert list(top.depths) == sorted(top.depths)  # breadth first
        threshold = min(expected[p] for p in paths)
        assert all(count <= threshold for p, count in expected.items() if p not in set(paths))


# --- integrity -------------------------------------------------------------------------------------------


def test_manifest_records_format(tmp_path):
    out = build(tmp_path, [[1, 2, 3], [4, 5]], 50, meta={"corpus": "unit"})
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format_version"] == fmt.FORMAT_VERSION and manifest["kind"] == "suffix-array"
    assert manifest["token_width"] == 2 and manifest["vocab_size"] == 50 and manifest["tokenizer_fingerprint"] == FP
    assert set(manifest["files"]) == {"shard-00000.data.npy", "shard-00000.sa.npy", "shard-00000.keys.npy"}
    assert manifest["corpus"] == "unit" and manifest["num_documents"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left behind


def test_other_tokenizer_refused(tmp_path):
    out = build(tmp_path, [[1, 2, 3]], 50)
    with pytest.raises(SpecdecError, match="another tokenizer"):
        SuffixArrayDatastore.load(out, "0" * 32)


@pytest.mark.parametrize("damage", ["missing", "truncated", "flipped", "no-manifest", "bad-json", "version"])
def test_corrupt_datastore_refused(tmp_path, damage):
    out = build(tmp_path, random_docs(5, 50), 50)
    data = out / "shard-00000.data.npy"
    if damage == "missing":
        data.unlink()
    elif damage == "truncated":
        data.write_bytes(data.read_bytes()[:-7])
    elif damage == "flipped":
        raw = bytearray(data.read_bytes())
        raw[-3] ^= 0x01
        data.write_bytes(bytes(raw))
    elif damage == "no-manifest":
        (out / "manifest.json").unlink()
    elif damage == "bad-json":
        (out / "manifest.json").write_text('{"format": "specdec-datastore", ')
    elif damage == "version":
        manifest = json.loads((out / "manifest.json").read_text())
        manifest["format_version"] = 99
        (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SpecdecError, match="datastore"):
        SuffixArrayDatastore.load(out, FP, verify=True)
    if damage == "flipped":  # sizes cannot see a flipped bit; the structural check at load does (issue 11)
        with pytest.raises(SpecdecError, match="corrupt"):
            SuffixArrayDatastore.load(out, FP, verify=False)


def test_failed_build_leaves_nothing(tmp_path):
    def docs():
        yield [1, 2, 3]
        raise RuntimeError("corpus broke")

    with pytest.raises(RuntimeError):
        build(tmp_path, docs(), 50)
    assert list(tmp_path.iterdir()) == []


# --- corpora ------------------------------------------------------------------------------------------------


def test_hub_format_jsonl_sample():
    docs = list(iter_documents(str(SAMPLE)))
    records = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    assert len(docs) == sum(len(r["messages"]) for r in records)
    assert docs[0].startswith("How do I reverse a list")
    assert list(iter_documents(str(SAMPLE), limit_docs=3)) == docs[:3]


def test_record_shapes():
    assert record_texts({"text": "a"}) == ["a"]
    assert record_texts({"content": "b"}) == ["b"]
    assert record_texts({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "r"}]}) == ["q", "r"]
    assert record_texts({"messages": [{"role": "user", "content": "q"}]}) == ["q"]
    assert record_texts({"other": 1}) == []


def test_truncated_json_array_keeps_complete_records(tmp_path):
    records = [{"id": i, "conversations": [{"from": "gpt", "value": "x" * (i * 37)}]} for i in range(50)]
    text = json.dumps(records, indent=2)
    path = tmp_path / "cut.json"
    path.write_text(text[: text.index('"id": 40') + 30])  # cut inside record 40
    got = list(iter_json_array(path, chunk_chars=64))  # tiny chunks: records straddle chunk borders
    assert [r["id"] for r in got] == list(range(40))
    path.write_text(text)
    assert len(list(iter_json_array(path, chunk_chars=100))) == 50


def test_unknown_corpus_is_one_line_error():
    with pytest.raises(SpecdecError, match="unknown corpus"):
        list(iter_documents("no-such-corpus-xyz"))


class FakeTokenizer:
    def __call__(self, batch, add_special_tokens=False):
        return {"input_ids": [[ord(c) for c in text] for text in batch]}


def test_tokenize_documents_caps_tokens():
    docs = ["abc", "defg", "hi"]
    assert list(tokenize_documents(FakeTokenizer(), docs, max_tokens=None, batch_size=2)) == [
        [97, 98, 99], [100, 101, 102, 103], [104, 105]]
    assert list(tokenize_documents(FakeTokenizer(), docs, max_tokens=5)) == [[97, 98, 99], [100, 101]]
