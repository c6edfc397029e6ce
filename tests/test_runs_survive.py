"""Runs that must survive (issue 21, round two), through the CLI in subprocesses: a resumed ``bench`` under
``--budget auto`` writes the counts of an uninterrupted run; two runs on one ``--out`` cannot clobber each other;
only bench records are appended to; every file a run reads or writes at its end is checked before it starts;
``build-datastore`` replaces only what a build wrote, reports a full disk in one line, and its tokenizer workers
die with it. Every refusal: exit 2, one ``specdec: error:`` line, no traceback, no user file changed, no process
left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false",
       "OMP_NUM_THREADS": "1"}
CMD = [sys.executable, "-m", "specdec_cli.cli"]
BINARY = bytes(range(256)) * 16  # 4,096 bytes, not UTF-8

from conftest import assert_user_error, snapshot


def run(*args, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*CMD, *map(str, args)], capture_output=True, env=ENV, timeout=timeout, **kwargs)


def processes_with(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line holds ``marker`` (forked workers share their parent's)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state not in ("Z", "X"):
            pids.append(int(proc.name))
    return pids


def children_of(pid: int) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(proc.name))
            except (OSError, ValueError, IndexError):
                continue
    return out


def wait_for(predicate, timeout: float = 120.0) -> None:
    t0 = time.perf_counter()
    while not predicate():
        assert time.perf_counter() - t0 < timeout, "timed out"
        time.sleep(0.05)


def assert_no_process_left(marker: str) -> None:
    try:
        wait_for(lambda: not processes_with(marker), timeout=10)
    finally:
        for pid in processes_with(marker):  # never leave them to pile up, even when the test fails
            os.kill(pid, signal.SIGKILL)


# --- records: what --out, --compare and bench-merge read --------------------------------------------------------


def record(prompt_id: str = "p/0", **result_fields) -> dict:
    """A bench record as ``bench --out`` writes it (ar and pld on one prompt)."""
    def result(method, forwards, drafted, accepted):
        return {"method": method, "generations": 1, "new_tokens": 8, "seconds": 0.5, "tokens_per_s": 16.0,
                "mean_token_ms": 62.5, "speedup": 1.0, "mean_accepted_length": 8 / forwards, "sigma": None,
                "eta": None, "draft_ms_per_step": None, "lossless": True, "identical": 1, "mismatches": [],
                "per_prompt": [{"prompt_id": prompt_id, "turn": 0, "new_tokens": 8, "seconds": 0.5,
                                "forwards": forwards, "emitted": 8, "drafted": drafted, "accepted": accepted,
                                "draft_s": 0.0}], **(result_fields if method == "pld" else {})}

    return {"schema": "specdec-bench/1", "timestamp": "2025-01-01T00:00:00+00:00",
            "machine": {"cpu": "x", "cpu_count": 2, "gpu": None, "device": "cpu", "torch": "2", "transformers": "4"},
            "git_commit": None, "config": {"model": "smollm2-135m", "methods": ["ar", "pld"], "prompts": "humaneval",
                                           "max_new_tokens": 8, "temperature": 0.0, "offset": 0, "limit": 1},
            "prompt_set": "humaneval", "num_prompts": 1, "identity_checked": True, "memory": None, "note": None,
            "results": [result("ar", 8, 0, 0), result("pld", 6, 4, 2)]}


def write_jsonl(path: Path, *records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


QUICK = ["bench", "--methods", "ar", "--prompts", "humaneval", "--limit", "1", "-n", "2", "--threads", "1",
         "--no-warmup", "--budget", "paper"]


def test_out_must_be_absent_or_bench_records(tmp_path):
    """``bench --out`` / ``--compare`` with a file of other JSON, ``bench-merge --out`` with a binary file: refused
    before anything runs, the file unchanged (it used to be appended to)."""
    other = tmp_path / "other.jsonl"
    other.write_text('{"a": 1}\n')
    binary = tmp_path / "blob.bin"
    binary.write_bytes(BINARY)
    shards = [write_jsonl(tmp_path / f"s{i}.jsonl", record(f"p/{i}")) for i in range(2)]
    before = snapshot(tmp_path)
    t0 = time.perf_counter()
    assert_user_error(run(*QUICK, "--out", other), "--out", "not a specdec-bench/2 record")
    assert_user_error(run(*QUICK, "--compare", other), "--compare", "not a specdec-bench/2 record")
    assert_user_error(run("bench-merge", *shards, "--out", binary), "--out", "not")
    assert_user_error(run("bench-merge", *shards, "--out", other), "--out", "not a specdec-bench/2 record")
    assert time.perf_counter() - t0 < 120  # no model loaded: four CLI starts, ~10 s each quiet, 61 s seen loaded
    assert snapshot(tmp_path) == before and binary.stat().st_size == 4096
    ok = run("bench-merge", *shards, "--out", tmp_path / "merged.jsonl", "--json")  # the good case still works
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "merged.jsonl").read_text())["num_prompts"] == 2


def test_bad_records_fail_before_the_run(tmp_path):
    """``--compare`` records with ``results: null`` or ``"speedup": "fast"``, ``bench-merge`` with
    ``per_prompt: "x"``: one line up front (they were tracebacks after the whole benchmark ran)."""
    null_results = write_jsonl(tmp_path / "null.jsonl", {**record(), "results": None})
    fast = write_jsonl(tmp_path / "fast.jsonl", record(speedup="fast"))
    per_prompt = write_jsonl(tmp_path / "pp.jsonl", record("p/1", per_prompt="x"))
    good = write_jsonl(tmp_path / "good.jsonl", record("p/0"))
    before = snapshot(tmp_path)
    t0 = time.perf_counter()
    assert_user_error(run(*QUICK, "--compare", null_results), "--compare", "results")
    assert_user_error(run(*QUICK, "--compare", fast), "--compare", "speedup")
    assert_user_error(run("bench-merge", good, per_prompt), "per_prompt")
    assert time.perf_counter() - t0 < 60
    assert snapshot(tmp_path) == before


def test_bad_plot_path_fails_before_the_run(tmp_path):
    out = tmp_path / "run.jsonl"
    for plot in (tmp_path / "no" / "such" / "dir.png", tmp_path):
        assert_user_error(run(*QUICK, "--plot", plot, "--out", out), "--plot")
        assert_user_error(run("bench-merge", write_jsonl(tmp_path / "a.jsonl", record("p/0")),
                              write_jsonl(tmp_path / "b.jsonl", record("p/1")), "--plot", plot), "--plot")
    assert not out.exists() and not Path(f"{out}.partial").exists()


def test_failed_resume_leaves_no_files(tmp_path):
    out = tmp_path / "run.jsonl"
    assert_user_error(run(*QUICK, "--out", out, "--resume"), "no interrupted run")
    assert list(tmp_path.iterdir()) == []  # no empty OUT, no partial


def test_nan_and_inf_arguments(tmp_path):
    t0 = time.perf_counter()
    assert_user_error(run(*QUICK, "--temperature", "nan"), "--temperature")
    assert_user_error(run(*QUICK, "--temperature", "inf"), "--temperature")
    assert_user_error(run("generate", "hi", "-n", "2", "--temperature", "nan"), "--temperature")
    for value in ("nan", "inf"):
        assert_user_error(run("build-datastore", "--corpus", "python-stdlib", "--shard-mb", value,
                              "--out", tmp_path / "o"), "--shard-mb")
    assert time.perf_counter() - t0 < 120  # all before a model loads
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_too_long_prompt_names_the_runs_new_tokens(tmp_path):
    """The error names ``-n 16``, not the warm-up's 8 tokens, and comes before any prompt runs."""
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"prompt": "hello " * 8180, "raw": True}) + "\n")
    proc = run("bench", "--methods", "ar", "--prompts", prompts, "-n", "16", "--threads", "1", "--budget", "paper")
    line = assert_user_error(proc, "+ 16 new tokens")
    assert "+ 8 new" not in line


# --- build-datastore ----------------------------------------------------------------------------------------


def small_build(out: Path, *extra) -> subprocess.CompletedProcess:
    return run("build-datastore", "--corpus", "python-stdlib", "--max-docs", "3", "--workers", "1", "-q",
               "--out", out, *extra)


def test_build_replaces_only_what_a_build_wrote(tmp_path):
    """A folder whose manifest only says ``{"format": "specdec-datastore"}``, and a real datastore with a file the
    user added, are refused with every file kept; an untouched datastore is still replaced."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "manifest.json").write_text('{"format": "specdec-datastore"}')
    (fake / "thesis.tex").write_text("years of work")
    before = snapshot(fake)
    assert_user_error(small_build(fake), "refusing to replace")
    assert snapshot(fake) == before

    store = tmp_path / "store"
    assert small_build(store).returncode == 0
    (store / "notes.txt").write_text("mine")
    before = snapshot(store)
    assert_user_error(small_build(store), "refusing to replace")
    assert snapshot(store) == before
    (store / "notes.txt").unlink()
    rebuilt = small_build(store)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert run("build-datastore", "--verify", "--out", store).returncode == 0
    assert_no_process_left(str(store))


def test_build_disk_full_is_one_line(tmp_path):
    """A full disk (here: a file-size limit, the same short write) is one line; nothing half-built is left."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    out = tmp_path / "store"
    proc = run("build-datastore", "--corpus", "python-stdlib", "--max-docs", "40", "--workers", "1", "-q",
               "--out", out, preexec_fn=limit)
    assert_user_error(proc, "cannot write the datastore")
    assert list(tmp_path.iterdir()) == []  # neither the store nor its temporary build folder
    assert_no_process_left(str(out))


def test_killed_build_leaves_no_tokenizer_workers(tmp_path):
    """SIGKILL of the build process alone (not its group): its tokenizer workers exit too (they used to block on
    their task pipe forever, ~215 MB each)."""
    out = tmp_path / "store"
    proc = subprocess.Popen([*CMD, "build-datastore", "--corpus", "python-stdlib", "--workers", "2", "-q",
                             "--out", str(out)], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_for(lambda: len(children_of(proc.pid)) >= 2 or proc.poll() is not None)
        time.sleep(0.5)
        workers = children_of(proc.pid)
        assert proc.poll() is None and len(workers) >= 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        wait_for(lambda: not processes_with(str(out)), timeout=10)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not out.exists()


# --- bench: one run per --out; resume under --budget auto ---------------------------------------------------

RESUME = ["bench", "--methods", "ar,pld,auto", "--prompts", "humaneval", "--limit", "3", "-n", "32", "--threads", "1",
          "--budget", "auto", "-t", "0.8", "--seed", "1"]  # warm-up on: its effect on what the methods learn is part
# of the checkpoint; sampled, so the budget prices drafting with its predictions, not the clock (greedy runs read
# measured drafting times, and on a loaded machine two greedy runs could decide a step differently)
COUNTS = ("prompt_id", "turn", "new_tokens", "forwards", "emitted", "drafted", "accepted")


def counts(path: Path) -> dict:
    rec = json.loads(path.read_text().splitlines()[-1])
    return {r["method"]: [tuple(p[k] for k in COUNTS) for p in sorted(r["per_prompt"], key=lambda p: p["prompt_id"])]
            for r in rec["results"]}


@pytest.mark.slow
def test_resume_under_budget_auto_equals_an_uninterrupted_run(tmp_path):
    """A second run on the same --out is refused in one line while the first lives; the first, killed after four
    of nine units, resumes (learned state restored from the checkpoint) to the counts of an uninterrupted run."""
    out = tmp_path / "run.jsonl"
    partial = Path(f"{out}.partial")
    proc = subprocess.Popen([*CMD, *RESUME, "--out", str(out)], env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_for(lambda: partial.exists() or proc.poll() is not None)
        second = run(*RESUME, "--out", out, "--no-warmup")
        assert_user_error(second, "another bench run", str(out))
        wait_for(lambda: len(partial.read_text().splitlines()) >= 5 or proc.poll() is not None)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not out.exists()  # no record, and no empty file either
    kept = len(partial.read_text().splitlines()) - 1
    assert 4 <= kept < 9
    resumed = run(*RESUME, "--out", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed" in resumed.stderr.decode()
    assert not partial.exists() and not Path(f"{out}.partial.state").exists()
    full = tmp_path / "full.jsonl"
    done = run(*RESUME, "--out", full)
    assert done.returncode == 0, done.stderr
    assert counts(out) == counts(full)
    assert any(p[5] for p in counts(full)["pld"]) and any(p[5] for p in counts(full)["auto"])  # they did draft


@pytest.mark.slow
def test_learned_state_round_trips_and_hostile_state_is_refused(smollm2, tmp_path):
    """Library layer: ``state()`` -> JSON -> ``load_state`` gives the same state (budget, auto with its memory);
    damaged state data is a ValueError/KeyError/TypeError, which ``--resume`` reports in one line."""
    from specdec_cli import api

    drafter = api.make_drafter("auto", smollm2, budget="auto")
    ids = api.encode_prompt(smollm2, "def add(a, b):\n    return a + b\n\ndef add(a, b):", raw=True, max_new_tokens=8)
    for _ in range(2):
        api.run(smollm2, ids, drafter, max_new_tokens=8, compile="off")
    state = json.loads(json.dumps({"budget": drafter.budget.state(), "drafter": drafter.state()}))
    assert state["drafter"]["memory"]["sequences"] and state["drafter"]["calibration"]
    fresh = api.make_drafter("auto", smollm2, budget="auto")
    fresh.budget.load_state(state["budget"])
    fresh.load_state(state["drafter"])
    assert json.loads(json.dumps({"budget": fresh.budget.state(), "drafter": fresh.state()})) == state
    for bad in ({**state["budget"], "value": "fast"}, {**state["budget"], "calibrator": {"accepted": [[1]]}}, {}):
        with pytest.raises((ValueError, KeyError, TypeError)):
            api.make_drafter("auto", smollm2, budget="auto").budget.load_state(bad)
    memory = state["drafter"]["memory"]
    for bad in ({**state["drafter"], "memory": {**memory, "sequences": [["x"]]}},
                {**state["drafter"], "gates": {"nope": {}}}, {**state["drafter"], "pending": "x"}):
        with pytest.raises((ValueError, KeyError, TypeError)):
            api.make_drafter("auto", smollm2, budget="auto").load_state(bad)


def test_memory_and_trigram_state_round_trip():
    """``rest``'s and ``auto``'s memory (past its bound: the oldest forgotten) and ``aded``'s adapted tri-gram rows
    come back from their JSON state exactly; hostile data is refused."""
    from specdec_cli.datastore.trigram.matrix import TrigramMatrix
    from specdec_cli.drafting.output_memory import OutputMemory

    memory = OutputMemory(40)
    for k in range(12):
        memory.remember([1, 2, 3], [(k * 7 + i) % 50 for i in range(9)])
    state = json.loads(json.dumps(memory.state()))
    again = OutputMemory(40)
    again.load_state(state)
    assert again.state() == memory.state() and memory.forgotten > 0
    assert (again.index.last, again.index.prev, again.index.tokens) == (memory.index.last, memory.index.prev,
                                                                      memory.index.tokens)
    for bad in ({**state, "sequences": [[-5]]}, {**state, "sequences": [list(range(41))]}, {**state, "added": -1}):
        with pytest.raises((ValueError, KeyError, TypeError)):
            OutputMemory(40).load_state(bad)

    docs = [[(i * 3 + j) % 20 for j in range(60)] for i in range(5)]
    matrix = TrigramMatrix.from_token_docs(docs, 20)
    matrix.adjust([1, 2, 3, 4, 1, 2, 5], increment=0.3)
    rows = json.loads(json.dumps(matrix.overlay_state()))
    fresh = TrigramMatrix.from_token_docs(docs, 20)
    fresh.load_overlay_state(rows)
    assert fresh.overlay == matrix.overlay and fresh.probs(1, 2) == matrix.probs(1, 2)
    for bad in ([[10**9, []]], [[3, [[99, 0.5]]]], [[3, [[1, float("nan")]]]], "x"):
        with pytest.raises((ValueError, KeyError, TypeError)):
            TrigramMatrix.from_token_docs(docs, 20).load_overlay_state(bad)
