"""Hostile and damaged datastores (issue 21): whatever the files hold, opening a store is either a one-line
:class:`SpecdecError` (``specdec: error:``, exit code 2 through the CLI) or a store whose drafts are token ids, so
generation stays identical to ``ar`` -- never a crash, a hang, a traceback, or a read outside the store's folder
or outside its arrays.

Library-level cases run in-process (fast); a few go through the CLI in subprocesses to check exit code 2 and the
one-line message, where ``generate --method rest/aded`` checks the store before any model loads. The fuzz tests
flip random bytes at 200+ positions of every file of a small suffix-array store and a small tri-gram store and
generate with a tiny random model for every flip that still opens.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import assert_user_error, tiny_llama
from specdec_cli.datastore import (SuffixArrayDatastore, TrigramMatrix, build_suffix_array_datastore, build_trigram_datastore)
from specdec_cli.datastore import format as fmt
from specdec_cli.datastore.suffix_array import search
from specdec_cli.datastore.suffix_array.retrieval import SAMPLE
from specdec_cli.engine.loop import Drafter, generate
from specdec_cli.errors import SpecdecError
from specdec_cli.drafting.mcts import MCTSConfig
from specdec_cli.methods.aded import Aded
from specdec_cli.methods.rest import RestDrafter

FP = "f" * 32
V = 300  # a 2-byte store; ids 300..65534 are outside the vocabulary, so many flipped bytes make a wrong id
NEW = 12  # tokens generated per fuzzed store
POSITIONS = 200  # flipped positions per file
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
CMD = [sys.executable, "-m", "specdec_cli.cli"]


# --- fixtures --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama, a few prompts with their ``ar`` continuations, and stores that hold those continuations
    (so drafts are accepted and a damaged store changes what is drafted) among random documents."""
    torch.manual_seed(0)
    model = tiny_llama(vocab=V, seed=3)
    rng = random.Random(0)
    prompts = [[rng.randrange(V) for _ in range(6)] for _ in range(3)]
    outputs = [generate(model, p, Drafter(), max_new_tokens=NEW).tokens for p in prompts]
    docs = [p + o for p, o in zip(prompts, outputs)]
    # about 4,000 tokens: more suffix-array entries than the order check samples, more index rows than it compares
    docs += [[rng.randrange(V) for _ in range(rng.randint(1, 60))] for _ in range(130)]
    root = tmp_path_factory.mktemp("hostile")
    build_suffix_array_datastore(iter(docs), root / "sa", fingerprint=FP, vocab_size=V, progress=False)
    build_trigram_datastore(iter(docs), root / "tri", fingerprint=FP, vocab_size=V, progress=False)
    return {"model": model, "prompts": prompts, "outputs": outputs, "root": root}


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def manifest_of(store: Path) -> dict:
    return json.loads((store / "manifest.json").read_text())


def write_manifest(store: Path, manifest: dict) -> None:
    (store / "manifest.json").write_text(json.dumps(manifest))


def load_error(loader, store: Path) -> str:
    with pytest.raises(SpecdecError) as err:
        loader(store, FP)
    message = str(err.value)
    assert "\n" not in message
    return message


def unsampled(size: int) -> int:
    """An index of a ``size``-entry suffix array that the load's order check does not sample."""
    picks = set(np.unique(np.linspace(0, size - 1, min(SAMPLE, size)).astype(np.int64)).tolist())
    return next(i for i in range(size // 2, size) if i not in picks)


# --- the suffix array and data file: corruption of unchanged size ----------------------------------------------


def sa_file(store: Path) -> Path:
    return store / manifest_of(store)["shards"][0]["sa"]


def data_file(store: Path) -> Path:
    return store / manifest_of(store)["shards"][0]["data"]


@pytest.mark.parametrize("value", [-2**31, -1, 2**31 - 1, 3])  # far below, just below, far above, misaligned
def test_suffix_array_entry_out_of_range_at_an_unsampled_position(tmp_path, tiny, value):
    store = copy(tiny["root"] / "sa", tmp_path / "s")
    sa = np.load(sa_file(store), mmap_mode="r+")
    assert sa.size > SAMPLE
    sa[unsampled(sa.size)] = value
    sa.flush()
    del sa
    message = load_error(SuffixArrayDatastore.load, store)
    assert "corrupt" in message and sa_file(store).name in message  # the suffix-array file, not the data file


def test_flipped_bytes_in_the_data_are_reported(tmp_path, tiny):
    store = copy(tiny["root"] / "sa", tmp_path / "s")
    raw = bytearray(data_file(store).read_bytes())
    middle = len(raw) // 2
    raw[middle:middle + 16] = bytes(b ^ 0xFF for b in raw[middle:middle + 16])
    data_file(store).write_bytes(bytes(raw))
    message = load_error(SuffixArrayDatastore.load, store)
    assert "corrupt" in message and data_file(store).name in message


@pytest.mark.parametrize("which", ["data", "sa"])
def test_one_flipped_byte_that_breaks_a_range_is_reported(tmp_path, tiny, which):
    """A byte that makes an id outside the vocabulary (data) or an offset outside the data (suffix array), at a
    position the sampled checks skip. (A byte that turns one valid id or offset into another is only found by
    ``verify``: the fuzz tests below check such stores generate what ``ar`` does.)"""
    store = copy(tiny["root"] / "sa", tmp_path / "s")
    path = data_file(store) if which == "data" else sa_file(store)
    array = np.load(path, mmap_mode="r")
    header = path.stat().st_size - array.nbytes
    entries = array.size // 2 if which == "data" else array.size
    index = unsampled(entries)
    del array
    raw = bytearray(path.read_bytes())
    at = header + (2 * index if which == "data" else 4 * index + 3)  # a token's high byte; an int32's top byte
    raw[at] ^= 0x80
    path.write_bytes(bytes(raw))
    message = load_error(SuffixArrayDatastore.load, store)
    assert "corrupt" in message and path.name in message
    with pytest.raises(SpecdecError, match="checksum mismatch"):
        fmt.check_files(store, manifest_of(store), verify=True)


def test_compiled_search_bounds_its_reads_without_the_load_checks(tiny):
    """The kernels alone: suffix-array entries far outside the data (negative, past the end, misaligned) and top-level
    indexes of the wrong size never make a read leave the arrays (a segfault would end the test run)."""
    store = SuffixArrayDatastore.load(tiny["root"] / "sa", FP)
    shard = store.shards[0]
    data = np.ascontiguousarray(shard.data_u8)
    rng = np.random.default_rng(0)
    hostile = np.array(shard.sa_i32)
    bad = np.array([-2**31, -2**20, -1, -3, data.size, data.size - 1, 2**31 - 1], dtype=np.int64)
    hostile[::3] = rng.choice(bad, size=hostile[::3].size).astype(np.int32)
    contexts = [p + o for p, o in zip(tiny["prompts"], tiny["outputs"])] + [[0], [V - 1] * 5]
    for keys in (shard.keys, shard.keys[: shard.keys.shape[0] // 2], np.concatenate([shard.keys] * 3),
                 np.zeros((0, search.KEY_BYTES), dtype=np.uint8)):
        arrays = search.shard_lists([data], [hostile], [np.ascontiguousarray(keys)], [shard.key_stride])
        for context in contexts:
            for n in range(1, len(context) + 1):
                k, total, rows = search.retrieve(*arrays, store.tail(context[:n], 8), 2, 8, 64, 6, fmt.separator(2))
                assert 0 <= k <= 8 and rows.shape[0] <= 64
                assert rows.size == 0 or (rows.min() >= -1 and rows.max() < fmt.separator(2))


def test_a_store_without_the_index_is_still_read(tmp_path, tiny):
    """Stores built before the top-level index existed: it is sampled at load, after the range checks."""
    store = copy(tiny["root"] / "sa", tmp_path / "s")
    manifest = manifest_of(store)
    keys = manifest["shards"][0].pop("keys")
    manifest["files"].pop(keys)
    write_manifest(store, manifest)
    context = tiny["prompts"][0] + tiny["outputs"][0][:4]
    expected = SuffixArrayDatastore.load(tiny["root"] / "sa", FP).retrieve(context, 8, 6)
    got = SuffixArrayDatastore.load(store, FP).retrieve(context, 8, 6)
    assert got.match_length == expected.match_length > 0
    assert np.array_equal(got.continuations, expected.continuations)
    sa = np.load(sa_file(store), mmap_mode="r+")
    sa[unsampled(sa.size)] = -2**31
    sa.flush()
    del sa
    assert sa_file(store).name in load_error(SuffixArrayDatastore.load, store)


# --- manifest paths: only plain files inside the store's folder ------------------------------------------------


@pytest.mark.parametrize("listed", [True, False], ids=["listed", "unlisted"])
@pytest.mark.parametrize("name", ["../../../../../../etc/passwd", "/etc/passwd", "../other/shard-00000.data.npy",
                                  "sub/shard-00000.data.npy", "..", ""])
def test_shard_paths_outside_the_folder_are_refused(tmp_path, tiny, name, listed):
    other = copy(tiny["root"] / "sa", tmp_path / "other")
    store = copy(tiny["root"] / "sa", tmp_path / "s")
    manifest = manifest_of(store)
    old = manifest["shards"][0]["data"]
    manifest["shards"][0]["data"] = name
    if listed:  # in `files` too, as a forger would
        manifest["files"][name] = manifest["files"].pop(old)
    write_manifest(store, manifest)
    message = load_error(SuffixArrayDatastore.load, store)
    assert "not a file name inside the datastore folder" in message
    assert "root:" not in message
    assert other.is_dir()


def test_a_link_out_of_the_folder_is_refused(tmp_path, tiny):
    other = copy(tiny["root"] / "sa", tmp_path / "other")
    store = copy(tiny["root"] / "sa", tmp_path / "s")
    link = data_file(store)
    link.unlink()
    link.symlink_to(data_file(other))
    assert "outside the datastore folder" in load_error(SuffixArrayDatastore.load, store)


@pytest.mark.parametrize("listed", [True, False])
def test_a_fifo_is_refused_without_hanging(tmp_path, tiny, listed):
    store = copy(tiny["root"] / "sa", tmp_path / "s")
    os.mkfifo(store / "pipe.npy")
    manifest = manifest_of(store)
    old = manifest["shards"][0]["data"]
    manifest["shards"][0]["data"] = "pipe.npy"
    if listed:
        manifest["files"]["pipe.npy"] = manifest["files"].pop(old)
    write_manifest(store, manifest)
    t0 = time.perf_counter()
    message = load_error(SuffixArrayDatastore.load, store)
    assert ("not a plain file" if listed else "not listed in files") in message
    assert time.perf_counter() - t0 < 10


def test_a_file_that_is_not_an_array_is_not_echoed(tmp_path, tiny):
    store = copy(tiny["root"] / "sa", tmp_path / "s")
    path = data_file(store)
    size = path.stat().st_size
    path.write_bytes((b"root:x:0:0:root:/root:/bin/bash\n" * size)[:size])
    message = load_error(SuffixArrayDatastore.load, store)
    assert path.name in message and "root:" not in message


# --- manifest values of the wrong type --------------------------------------------------------------------------


def _set(key, value):
    def edit(m):
        m[key] = value
    return edit


def _shard(key, value=None, drop=False):
    def edit(m):
        if drop:
            del m["shards"][0][key]
        else:
            m["shards"][0][key] = value
    return edit


def _bytes_as_text(m):
    name = m["shards"][0]["data"]
    m["files"][name]["bytes"] = str(m["files"][name]["bytes"])


SA_MANIFESTS = [
    ("shards-text", _set("shards", "abc"), "shards"),
    ("shards-empty", _set("shards", []), "shards"),
    ("shards-null", _set("shards", None), "shards"),
    ("shard-not-object", _set("shards", [1]), "shards[0]"),
    ("shard-without-sa", _shard("sa", drop=True), "lacks 'sa'"),
    ("shard-sa-number", _shard("sa", 7), "shards[0].sa"),
    ("key-stride-text", _shard("key_stride", "32"), "key_stride"),
    ("key-stride-zero", _shard("key_stride", 0), "key_stride"),
    ("key-stride-huge", _shard("key_stride", 2**70), "key_stride"),
    ("token-width-text", _set("token_width", "abc"), "token_width"),
    ("token-width-4", _set("token_width", 4), "token_width"),
    ("token-width-bool", _set("token_width", True), "token_width"),
    ("vocab-text", _set("vocab_size", "300"), "vocab_size"),
    ("vocab-zero", _set("vocab_size", 0), "vocab_size"),
    ("vocab-too-large", _set("vocab_size", 70_000), "vocab_size"),
    ("fingerprint-number", _set("tokenizer_fingerprint", 5), "tokenizer_fingerprint"),
    ("files-null", _set("files", None), "files"),
    ("files-list", _set("files", []), "files"),
    ("file-entry-null", lambda m: m["files"].update({m["shards"][0]["sa"]: None}), "files["),
    ("bytes-as-text", _bytes_as_text, "files["),
    ("num-tokens-text", _set("num_tokens", "many"), "num_tokens"),
]


@pytest.mark.parametrize("edit,needle", [c[1:] for c in SA_MANIFESTS], ids=[c[0] for c in SA_MANIFESTS])
def test_wrongly_typed_suffix_array_manifest(tmp_path, tiny, edit, needle):
    store = copy(tiny["root"] / "sa", tmp_path / "s")
    manifest = manifest_of(store)
    edit(manifest)
    write_manifest(store, manifest)
    message = load_error(SuffixArrayDatastore.load, store)
    assert needle in message, message
    with pytest.raises(SpecdecError):  # `build-datastore --verify` reads the same manifest
        fmt.check_files(store, fmt.read_manifest(store), verify=True)


def test_size_mismatch_message_compares_numbers(tmp_path, tiny):
    store = copy(tiny["root"] / "sa", tmp_path / "s")
    manifest = manifest_of(store)
    name = manifest["shards"][0]["data"]
    manifest["files"][name]["bytes"] += 1
    write_manifest(store, manifest)
    message = load_error(SuffixArrayDatastore.load, store)
    size = (store / name).stat().st_size
    assert f"has {size} bytes, the manifest says {size + 1}" in message


TRI_MANIFESTS = [
    ("files-null", _set("files", None), "files"),
    ("files-text", _set("files", "abc"), "files"),
    ("vocab-text", _set("vocab_size", "300"), "vocab_size"),
    ("vocab-too-large", _set("vocab_size", 3_000_000), "vocab_size"),
    ("top-k-text", _set("top_k", "abc"), "top_k"),
    ("top-k-zero", _set("top_k", 0), "top_k"),
    ("path-outside", lambda m: m["files"].update({"../keys.npy": m["files"].pop("keys.npy")}), "not a file name"),
    ("bytes-as-text", lambda m: m["files"]["keys.npy"].update(bytes=str(m["files"]["keys.npy"]["bytes"])), "files["),
]


@pytest.mark.parametrize("edit,needle", [c[1:] for c in TRI_MANIFESTS], ids=[c[0] for c in TRI_MANIFESTS])
def test_wrongly_typed_trigram_manifest(tmp_path, tiny, edit, needle):
    store = copy(tiny["root"] / "tri", tmp_path / "t")
    manifest = manifest_of(store)
    edit(manifest)
    write_manifest(store, manifest)
    assert needle in load_error(TrigramMatrix.load, store)


@pytest.mark.parametrize("name,value,needle", [("counts", np.nan, "counts.npy"), ("counts", -1.0, "counts.npy"),
                                               ("counts", np.inf, "counts.npy"), ("next_ids", V, "next_ids.npy"),
                                               ("keys", -5, "keys.npy"), ("offsets", 10**9, "offsets.npy")])
def test_trigram_values_out_of_range(tmp_path, tiny, name, value, needle):
    store = copy(tiny["root"] / "tri", tmp_path / "t")
    array = np.load(store / f"{name}.npy", mmap_mode="r+")
    array[array.size // 2] = value
    array.flush()
    del array
    message = load_error(TrigramMatrix.load, store)
    assert "corrupt" in message and needle in message


# --- fuzz: random bytes of every file, at the library layer -------------------------------------------------------


def flip_positions(path: Path, seed: int) -> list[tuple[int, int]]:
    """At least ``POSITIONS`` distinct positions (40 of them in the first 128 bytes: the ``.npy`` header) and a
    non-zero XOR mask for each."""
    rng = random.Random(seed)
    size = path.stat().st_size
    head = rng.sample(range(min(128, size)), min(40, size))
    rest = rng.sample(range(size), min(POSITIONS, size))
    positions = list(dict.fromkeys(head + rest))
    return [(p, rng.randrange(1, 256)) for p in positions]


def xor_byte(path: Path, pos: int, mask: int) -> None:
    """In place (same inode, no truncation: a memory map of an earlier load never loses its pages)."""
    with open(path, "r+b") as fh:
        fh.seek(pos)
        byte = fh.read(1)[0]
        fh.seek(pos)
        fh.write(bytes([byte ^ mask]))


def fuzz(store: Path, opened, seed: int) -> dict:
    """Flip each position of each file of ``store`` in turn (restoring it after); ``opened(store)`` runs on every
    store that still opens. Returns how many flips were refused and how many opened, per file."""
    tally = {}
    for k, path in enumerate(sorted(p for p in store.iterdir() if p.is_file())):
        before = path.read_bytes()
        refused = ok = 0
        for pos, mask in flip_positions(path, seed + k):
            xor_byte(path, pos, mask)
            try:
                try:
                    loaded = opened.load(store)
                except SpecdecError as err:
                    assert "\n" not in str(err)
                    refused += 1
                    continue
                opened.use(loaded, (path.name, pos, mask))
                ok += 1
            finally:
                xor_byte(path, pos, mask)
        assert path.read_bytes() == before
        tally[path.name] = (refused, ok)
    return tally


class RestCheck:
    def __init__(self, tiny):
        self.tiny = tiny

    def load(self, store):
        return SuffixArrayDatastore.load(store, FP)

    def use(self, store, where):
        for prompt, output in zip(self.tiny["prompts"], self.tiny["outputs"]):
            for context in (prompt, prompt + output, output[-3:], [V - 1, 0]):
                found = store.retrieve(context, n_max=8, cont_len=6, max_matches=64)
                assert found.continuations.size == 0 or (-1 <= found.continuations.min()
                                                         and found.continuations.max() < V), where
        prompt, output = self.tiny["prompts"][0], self.tiny["outputs"][0]
        got = generate(self.tiny["model"], prompt, RestDrafter(store, n_max=8, cont_len=6, top_c=16),
                       max_new_tokens=NEW).tokens
        assert got == output, where


class AdedCheck:
    def __init__(self, tiny):
        self.tiny = tiny

    def load(self, store):
        return TrigramMatrix.load(store, FP)

    def use(self, matrix, where):
        offsets, ids, probs = matrix.gather(np.arange(0, V * V, 97, dtype=np.int64))
        assert ids.size == 0 or (ids.min() >= 0 and ids.max() < V), where
        assert np.isfinite(probs).all(), where
        prompt, output = self.tiny["prompts"][0], self.tiny["outputs"][0]
        drafter = Aded(matrix, MCTSConfig(iterations=10, depth=3, candidates=4))
        assert generate(self.tiny["model"], prompt, drafter, max_new_tokens=NEW).tokens == output, where


def test_fuzz_suffix_array_store(tmp_path, tiny):
    store = copy(tiny["root"] / "sa", tmp_path / "s")
    assert {p.name.split(".")[-2] for p in store.iterdir()} == {"data", "sa", "keys", "manifest"}
    tally = fuzz(store, RestCheck(tiny), seed=1)
    assert all(refused + ok >= POSITIONS for refused, ok in tally.values()), tally
    assert all(refused > 0 for refused, _ in tally.values()), tally  # every file's damage is seen at times...
    assert sum(ok for _, ok in tally.values()) > 100, tally  # ...and many valid-looking stores were generated with


def test_fuzz_trigram_store(tmp_path, tiny):
    store = copy(tiny["root"] / "tri", tmp_path / "t")
    tally = fuzz(store, AdedCheck(tiny), seed=2)
    assert len(tally) == 5 and all(refused + ok >= POSITIONS for refused, ok in tally.values()), tally
    assert all(refused > 0 for refused, _ in tally.values()), tally
    assert sum(ok for _, ok in tally.values()) > 100, tally


# --- through the CLI: exit code 2, one line, no traceback, no hang ------------------------------------------------


def run_cli(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CMD, *map(str, args)], capture_output=True, env=ENV, timeout=timeout)


def generate_with(store: Path, method: str = "rest") -> subprocess.CompletedProcess:
    return run_cli("generate", "def f(", "--raw", "-n", "4", "--method", method, "--datastore", store)


def test_cli_hostile_stores(tmp_path, tiny):
    """One subprocess per case; every store is refused before a model loads (``precheck_datastore``)."""
    negative = copy(tiny["root"] / "sa", tmp_path / "negative")  # the store that segfaulted (rc 139)
    sa = np.load(sa_file(negative), mmap_mode="r+")
    sa[unsampled(sa.size)] = -2**31
    sa.flush()
    del sa
    passwd = copy(tiny["root"] / "sa", tmp_path / "passwd")
    other = copy(tiny["root"] / "sa", tmp_path / "other")
    sibling = copy(tiny["root"] / "sa", tmp_path / "sibling")
    fifo = copy(tiny["root"] / "sa", tmp_path / "fifo")
    os.mkfifo(fifo / "pipe.npy")
    typed = copy(tiny["root"] / "sa", tmp_path / "typed")
    tri = copy(tiny["root"] / "tri", tmp_path / "tri")
    for store, name in ((passwd, "../../../../../../../../etc/passwd"), (sibling, f"../{other.name}/DATA"),
                        (fifo, "pipe.npy")):
        manifest = manifest_of(store)
        old = manifest["shards"][0]["data"]
        name = name.replace("DATA", old)
        manifest["shards"][0]["data"] = name
        manifest["files"][name] = manifest["files"].pop(old)
        write_manifest(store, manifest)
    write_manifest(typed, {**manifest_of(typed), "shards": "abc"})
    write_manifest(tri, {**manifest_of(tri), "files": None})
    cases = [(negative, "rest", ("corrupt", "sa.npy")), (passwd, "rest", ("not a file name",)),
             (sibling, "rest", ("not a file name",)), (fifo, "rest", ("not a plain file",)),
             (typed, "rest", ("shards",)), (tri, "aded", ("files",))]
    for store, method, needles in cases:
        proc = generate_with(store, method)
        line = assert_user_error(proc, *needles)
        assert "root:" not in line
    assert_user_error(run_cli("build-datastore", "--verify", "--out", typed), "shards")
