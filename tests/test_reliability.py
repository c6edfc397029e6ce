"""Reliability through the CLI: every bad input is one ``specdec: error:`` line with exit code 2 (no traceback)
and leaves the user's files as they were; killed builds and benchmarks leave nothing that looks valid, and an
interrupted ``bench --out`` resumes to the record an uninterrupted run writes.

Checks of arguments and files run the CLI in this process (:func:`cli`: a new process adds nothing there but
three seconds of imports); stdin, signals, kills and real output conventions run it in subprocesses (:func:`run`).
"Refused before any work" is checked by making the work fail (``no_model``, ``no_corpus``), not by a clock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
CMD = [sys.executable, "-m", "specdec_cli.cli"]
BINARY = bytes(range(256)) * 4  # not UTF-8

from conftest import assert_user_error, snapshot


def run(*args, stdin: bytes | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CMD, *map(str, args)], input=stdin, capture_output=True, env=ENV, timeout=timeout)


def cli(*args, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process (typer's runner), as a finished process; an unexpected exception reads as exit
    code 1 with its traceback on stderr."""
    import traceback

    import torch
    from typer.testing import CliRunner

    from specdec_cli.cli import app

    threads = torch.get_num_threads()
    try:
        res = CliRunner().invoke(app, [str(a) for a in args], input=stdin)
    finally:
        torch.set_num_threads(threads)
    err = res.stderr_bytes or b""
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        err += "".join(traceback.format_exception(res.exception)).encode()
    return subprocess.CompletedProcess(args, res.exit_code, res.stdout_bytes, err)


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: what "checked before any model loads" means."""
    from specdec_cli import api

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was refused")

    monkeypatch.setattr(api, "load", load)


@pytest.fixture
def no_corpus(monkeypatch):
    """Reading a corpus fails the test: what "refused before building" means."""
    from specdec_cli.datastore import pipeline

    def iter_documents(*args, **kwargs):
        raise AssertionError("the corpus was read before the bad --out was refused")

    monkeypatch.setattr(pipeline, "iter_documents", iter_documents)


# --- fixtures: small valid stores for smollm2 ----------------------------------------------------------------


@pytest.fixture(scope="module")
def stores(tmp_path_factory, smollm2):
    from specdec_cli.io.corpora import iter_documents, tokenize_documents
    from specdec_cli.datastore import build_suffix_array_datastore
    from specdec_cli.datastore import build_trigram_datastore

    root = tmp_path_factory.mktemp("stores")
    docs = list(tokenize_documents(smollm2.tokenizer, iter_documents("python-stdlib", 40)))
    build_suffix_array_datastore(iter(docs), root / "sa", fingerprint=smollm2.fingerprint,
                                 vocab_size=len(smollm2.tokenizer), progress=False)
    build_trigram_datastore(iter(docs), root / "tri", fingerprint=smollm2.fingerprint, vocab_size=len(smollm2.tokenizer),
                            progress=False)
    build_suffix_array_datastore(iter(docs[:5]), root / "other-tokenizer", fingerprint="0" * 32,
                                 vocab_size=len(smollm2.tokenizer), progress=False)
    return root


def copy_store(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


# --- inputs that fail before any model loads -------------------------------------------------------------------


def test_non_utf8_stdin():
    assert_user_error(run("generate", stdin=BINARY), "stdin is not UTF-8")


def test_binary_batch_file(tmp_path, no_model):
    f = tmp_path / "prompts.bin"
    f.write_bytes(BINARY)
    before = snapshot(f)
    assert_user_error(cli("generate", "--batch-file", f), "not UTF-8")
    assert snapshot(f) == before


@pytest.mark.parametrize("content", [BINARY, b"[1, 2]\n", b"not json\n"], ids=["binary", "array", "not-json"])
def test_bad_compare_file_fails_before_running(tmp_path, content, no_model):
    compare, out = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    compare.write_bytes(content)
    out.write_text("")
    before = snapshot(tmp_path)
    assert_user_error(cli("bench", "--compare", compare, "--out", out, "--limit", "1", "-n", "4"), "--compare")
    assert snapshot(tmp_path) == before


def test_bad_out_file_fails_before_running(tmp_path, no_model):
    out = tmp_path / "results.jsonl"
    out.write_bytes(b"[1, 2]\n")
    before = snapshot(tmp_path)
    assert_user_error(cli("bench", "--out", out, "--limit", "1", "-n", "4"), "--out")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("content", [BINARY, b"[1, 2]\n"], ids=["binary", "array"])
def test_bench_merge_bad_files(tmp_path, content):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(content)
    b.write_bytes(content)
    assert_user_error(cli("bench-merge", a, b), "record file")


def test_cheap_arguments_checked_first(no_model):
    for args, needle in [(("generate", "hi", "-n", "0"), "--max-new-tokens"),
                         (("generate", "hi", "--window", "0", "--method", "sd", "--draft", "int8:"), "--window"),
                         (("generate", "hi", "--threads", "0"), "--threads"),
                         (("bench", "--threads", "0"), "--threads"),
                         (("bench", "-n", "0"), "--max-new-tokens"),
                         (("inspect-entropy", "hi", "--threads", "0"), "--threads"),
                         (("generate", "   "), "empty prompt"),
                         (("generate", "hi", "--method", "warp-drive"), "unknown method"),
                         (("bench", "--resume", "--limit", "1"), "--resume")]:
        assert_user_error(cli(*args), needle)


def test_unknown_models_are_named():
    """Names that resolve to no model fail while resolving, before any weights are read."""
    assert_user_error(cli("generate", "hi", "--model", "no-such-model"), "unknown model")
    line = assert_user_error(cli("generate", "hi", "--model", "nobody/nothing-here"), "nobody/nothing-here")
    assert "HF_HUB_OFFLINE=1" in line


# --- datastores: missing, empty, truncated, foreign, wrong kind, other tokenizer, corrupt --------------------


def test_bad_datastores(tmp_path, stores):
    empty = tmp_path / "empty"
    empty.mkdir()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "manifest.json").write_text('{"name": "my website"}')
    truncated = copy_store(stores / "sa", tmp_path / "truncated")
    shard = next(truncated.glob("*.sa.npy"))
    shard.write_bytes(shard.read_bytes()[:-100])
    cases = [("rest", tmp_path / "missing", "no such directory"), ("rest", empty, "no manifest.json"),
             ("rest", foreign, "not a specdec datastore"), ("rest", truncated, "truncated"),
             ("rest", stores / "tri", "needs 'suffix-array'"), ("aded", stores / "sa", "needs 'trigram'"),
             ("rest", stores / "other-tokenizer", "another tokenizer")]
    before = snapshot(tmp_path, stores)
    for method, store, needle in cases:
        assert_user_error(cli("generate", "def f(", "--raw", "-n", "4", "--method", method, "--datastore", store),
                          needle)
    assert snapshot(tmp_path, stores) == before


@pytest.mark.parametrize("corruption", ["sa-out-of-range", "sa-unsorted", "tokens-out-of-vocab"])
def test_corrupt_shard_of_unchanged_size(tmp_path, stores, corruption):
    store = copy_store(stores / "sa", tmp_path / "store")
    manifest = json.loads((store / "manifest.json").read_text())
    shard = manifest["shards"][0]
    if corruption.startswith("sa"):
        sa = np.load(store / shard["sa"], mmap_mode="r+")
        if corruption == "sa-out-of-range":
            sa[sa.size // 2:] = 2**30
        else:
            sa[:] = sa[::-1].copy()
        sa.flush()
    else:
        data = np.load(store / shard["data"], mmap_mode="r+")
        data[: data.size // 2] = 0xFE  # 0xFEFE = 65278, outside SmolLM2's 49,152 ids
        data.flush()
    before = snapshot(store)
    assert_user_error(cli("generate", "def f(", "--raw", "-n", "4", "--method", "rest", "--datastore", store),
                      "corrupt")
    assert snapshot(store) == before


# --- build-datastore -------------------------------------------------------------------------------------------


def test_build_refuses_a_folder_that_is_not_a_datastore_before_building(tmp_path, no_corpus):
    site = tmp_path / "site"
    site.mkdir()
    (site / "manifest.json").write_text('{"name": "web app", "start_url": "/"}')
    (site / "index.html").write_text("<html></html>")
    before = snapshot(site)
    assert_user_error(cli("build-datastore", "--corpus", "python-stdlib", "--out", site), "not a specdec datastore")
    assert snapshot(site) == before
    file_out = tmp_path / "notes.txt"
    file_out.write_text("keep me")
    assert_user_error(cli("build-datastore", "--corpus", "python-stdlib", "--out", file_out), "not a folder")
    assert file_out.read_text() == "keep me"


def test_build_bad_corpora(tmp_path):
    empty = tmp_path / "corpus"
    empty.mkdir()
    assert_user_error(cli("build-datastore", "--corpus", tmp_path / "nope", "--out", tmp_path / "o"), "unknown corpus")
    assert_user_error(cli("build-datastore", "--corpus", empty, "--out", tmp_path / "o"), "no ")
    assert_user_error(cli("build-datastore", "--corpus", "ultrachat", "--out", tmp_path / "o"), "HF_HUB_OFFLINE=1")
    assert not (tmp_path / "o").exists()


def test_build_output_convention(tmp_path):
    """Progress on stderr, one JSON summary on stdout, for both kinds."""
    for kind in ("suffix-array", "trigram"):
        proc = run("build-datastore", "--corpus", "python-stdlib", "--max-docs", "3", "--kind", kind,
                   "--out", tmp_path / kind)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.decode().splitlines()
        assert len(lines) == 1
        summary = json.loads(lines[0])
        assert summary["kind"] == kind and summary["tokens"] > 0 and summary["peak_rss_bytes"] > 0


def _wait_for(predicate, timeout: float = 120.0) -> None:
    t0 = time.perf_counter()
    while not predicate():
        assert time.perf_counter() - t0 < timeout, "timed out"
        time.sleep(0.1)


def test_killed_build_leaves_nothing_valid_and_is_cleaned_up(tmp_path):
    out = tmp_path / "store"
    proc = subprocess.Popen([*CMD, "build-datastore", "--corpus", "python-stdlib", "--out", str(out), "-q"],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    _wait_for(lambda: any(tmp_path.glob(".store.building-*")) or proc.poll() is not None)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists()  # nothing that looks like a datastore
    stale = list(tmp_path.glob(".store.building-*"))
    assert stale
    done = run("build-datastore", "--corpus", "python-stdlib", "--max-docs", "3", "--out", out, "-q")
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.glob(".store.building-*"))  # the dead build's leftovers are gone
    assert run("build-datastore", "--verify", "--out", out).returncode == 0


def test_terminated_build_cleans_up(tmp_path):
    out = tmp_path / "store"
    proc = subprocess.Popen([*CMD, "build-datastore", "--corpus", "python-stdlib", "--out", str(out), "-q"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for(lambda: any(tmp_path.glob(".store.building-*")) or proc.poll() is not None)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and b"Traceback" not in err, err
    assert not out.exists() and not list(tmp_path.glob(".store.building-*"))


# --- generate: unknown options, context, batch output ------------------------------------------------------


@pytest.mark.slow
def test_unknown_opt_lists_the_method_options():
    line = assert_user_error(run("generate", "hi", "-n", "4", "--method", "pld", "--opt", "warp=9"), "unknown --opt warp")
    assert "max_ngram" in line and "num_pred" in line


@pytest.mark.slow
def test_max_new_tokens_beyond_context():
    assert_user_error(run("generate", "hi", "-n", "100000"), "--max-new-tokens 100000 does not fit")


@pytest.mark.slow
def test_plain_batch_output_is_separated():
    proc = run("generate", "--batch-file", "-", "-n", "4", stdin=b"Say hi.\nSay bye.\n")
    assert proc.returncode == 0, proc.stderr
    assert "\n---\n" in proc.stdout.decode()


# --- bench: progress, checkpoints, --resume ----------------------------------------------------------------

BENCH = ["bench", "--methods", "ar,pld", "--prompts", "humaneval", "--limit", "4", "-n", "12", "--threads", "1",
         "--budget", "paper", "--no-warmup"]
COUNTS = ("prompt_id", "turn", "new_tokens", "forwards", "emitted", "drafted", "accepted")


def _counts(record: dict) -> dict:
    return {r["method"]: [tuple(p[k] for k in COUNTS) for p in sorted(r["per_prompt"], key=lambda p: p["prompt_id"])]
            for r in record["results"]}


@pytest.mark.slow
def test_killed_bench_resumes_to_the_same_record(tmp_path):
    out = tmp_path / "run.jsonl"
    partial = Path(f"{out}.partial")
    proc = subprocess.Popen([*CMD, *BENCH, "--out", str(out)], env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    # killed as soon as the first generation is kept with its learned state (a unit whose state was not yet saved
    # runs again): seven more (seconds of work) stand between that and the end, a margin no scheduling delay of the
    # polling here reaches
    state = Path(f"{partial}.state")
    _wait_for(lambda: (partial.exists() and len(partial.read_text().splitlines()) >= 2 and state.exists())
              or proc.poll() is not None)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists() or not out.read_text().strip()  # no record yet
    kept = len(partial.read_text().splitlines()) - 1
    assert 1 <= kept < 8
    resumed = run(*BENCH, "--out", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    err = resumed.stderr.decode()
    assert "resumed" in err and "prompt 4/4" in err  # progress lines on stderr
    assert not partial.exists()
    record = json.loads(out.read_text().splitlines()[-1])
    full_out = tmp_path / "full.jsonl"
    full = run(*BENCH, "--out", full_out)
    assert full.returncode == 0, full.stderr
    reference = json.loads(full_out.read_text().splitlines()[-1])
    assert _counts(record) == _counts(reference)
    assert all(r["lossless"] for r in record["results"])


@pytest.mark.slow
def test_resume_refuses_other_settings(tmp_path):
    out = tmp_path / "run.jsonl"
    Path(f"{out}.partial").write_text(json.dumps({"schema": "specdec-bench-partial/1", "config": {"model": "x"}}) + "\n")
    assert_user_error(run(*BENCH, "--out", out, "--resume"), "other settings")
