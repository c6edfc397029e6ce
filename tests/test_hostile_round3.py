"""Reliability, round three (issue 33): inputs tried as a hostile user would, through the command line.

Every case runs ``specdec`` in a subprocess and asserts what the user sees: exit code 2 and exactly one
``specdec: error:`` line (no traceback, no usage box), no user file changed, and the run bounded -- in memory (the
child's own peak resident size, from ``wait4``) and in time (a generous timeout: a hang fails the test; no speed
is asserted). Cases that can fail before a model loads do; those that need the model are marked slow and kept to
one short run each. Library-level bugs of the same issue (keyword overrides dropped by ``api.run``, batch prices
that nest, gate states not restored) get in-process tests that fail on the code before the fix.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_user_error, snapshot, tiny_llama
from specdec_cli.config import RunSettings

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
CMD = [sys.executable, "-m", "specdec_cli.cli"]
NO_MODEL_MIB = 1024  # a refusal before any model loads: the interpreter and its imports (the bugs reached GBs)
NESTED = "[" * 100_000  # deeper than Python's recursion limit: json.loads raised RecursionError


# ``python -m specdec_cli.cli ARGS`` that writes its own peak resident memory (``VmHWM``, KiB) to $SPECDEC_TEST_PEAK
# at exit. Measured inside: the ``ru_maxrss`` that ``wait4`` reports counts the pages the child shared with this
# test process before its exec (several GB once a test here has loaded a model).
PEAK = r"""
import atexit, os, runpy

def peak():
    with open("/proc/self/status") as status, open(os.environ["SPECDEC_TEST_PEAK"], "w") as out:
        out.write(next(line.split()[1] for line in status if line.startswith("VmHWM:")))

atexit.register(peak)
runpy.run_module("specdec_cli.cli", run_name="__main__", alter_sys=True)
"""


def run(*args, stdin=None, env=None, timeout: float = 300, preexec_fn=None) -> tuple[subprocess.CompletedProcess,
                                                                                      float]:
    """``specdec ARGS`` in a subprocess: the finished process and its peak resident memory in MiB."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as peak:
        feed = subprocess.PIPE if isinstance(stdin, bytes) else (stdin or subprocess.DEVNULL)
        proc = subprocess.Popen([sys.executable, "-c", PEAK, *map(str, args)], stdin=feed, stdout=out, stderr=err,
                                env={**(env or ENV), "SPECDEC_TEST_PEAK": peak.name}, preexec_fn=preexec_fn)
        timer = threading.Timer(timeout, proc.kill)  # a hang fails the test below (killed: not exit 2)
        timer.start()
        try:
            if isinstance(stdin, bytes):
                proc.stdin.write(stdin)
                proc.stdin.close()
            proc.wait()
        finally:
            timer.cancel()
        out.seek(0)
        err.seek(0)
        kib = peak.read().strip()
        return subprocess.CompletedProcess(args, proc.returncode, out.read(), err.read()), int(kib or 0) / 1024


def refused(*args, needles=(), **kwargs) -> str:
    """``specdec ARGS`` fails as a user error before any model loads, within :data:`NO_MODEL_MIB`."""
    proc, peak = run(*args, **kwargs)
    line = assert_user_error(proc, *needles)
    assert peak < NO_MODEL_MIB, f"peak {peak:.0f} MiB"
    return line


@pytest.fixture(scope="module")
def fingerprint() -> str:
    """The tokenizer fingerprint of smollm2-135m (the tokenizer alone, no weights)."""
    from specdec_cli.io.models import load_tokenizer, tokenizer_fingerprint

    return tokenizer_fingerprint(load_tokenizer("smollm2-135m"))


def batch_file(tmp_path: Path, text: str = "Say hi.\nSay bye.\n") -> Path:
    path = tmp_path / "prompts.txt"
    path.write_text(text, encoding="utf-8")
    return path


# --- 1. --batch-size has a bound, and is never more than one slot per prompt -------------------------------------


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_batch_size_has_a_hard_bound(tmp_path, command):
    prompts = batch_file(tmp_path)
    before = snapshot(tmp_path)
    args = ["--batch-file", prompts] if command == "generate" else ["--methods", "ar", "--prompts", "humaneval"]
    refused(command, *args, "--batch-size", "1000000000", needles=("--batch-size must be from 1 to 256",))
    assert snapshot(tmp_path) == before


def test_batch_size_is_capped_at_the_prompt_count():
    from specdec_cli.commands.generate import check_prompts
    from specdec_cli.config import RunSettings

    assert check_prompts(["a", "b"], RunSettings(batch_size=200)).batch_size == 2
    assert check_prompts(["a", "b", "c"], RunSettings(batch_size=2)).batch_size == 2


# --- 2. reads of a batch file are bounded and can be interrupted ------------------------------------------------


def test_an_endless_pipe_as_the_batch_file_is_refused_bounded():
    yes = subprocess.Popen(["yes", "hello"], stdout=subprocess.PIPE)
    try:
        refused("generate", "--batch-file", "/dev/stdin", stdin=yes.stdout, needles=("larger than 8,388,608 bytes",))
    finally:
        yes.kill()
        yes.wait()


def test_dev_zero_as_the_batch_file_is_refused_bounded():
    refused("generate", "--batch-file", "/dev/zero", needles=("larger than 8,388,608 bytes",))


def test_ctrl_c_while_waiting_for_a_batch_file_is_one_line(tmp_path):
    """A FIFO whose writer sends nothing: the read waits; Ctrl-C ends it with one line and exit 130."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # a writer that never writes nor closes (the read cannot see EOF)
    try:
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen([*CMD, "generate", "--batch-file", str(fifo)], stdout=subprocess.DEVNULL,
                                    stderr=err, env=ENV, preexec_fn=_sigint_as_in_a_terminal)
            _wait_for(lambda: any(os.path.realpath(f"/proc/{proc.pid}/fd/{fd}") == str(fifo)
                                  for fd in _fds(proc.pid)) or proc.poll() is not None)
            proc.send_signal(signal.SIGINT)
            assert _exit_code(proc, 60) == 130
            err.seek(0)
            assert err.read().decode().strip() == "specdec: error: interrupted"
    finally:
        os.close(writer)


def _sigint_as_in_a_terminal() -> None:
    """The child gets Ctrl-C as a program started from a terminal does: delivered and default. Twice in full suite
    runs (never alone, nor under CPU load) the child outlived SIGINT by 60 s; a blocked or ignored SIGINT, which a
    child inherits from its parent's thread, would do that, and the timeout's message now says which."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _exit_code(proc, timeout: float) -> int:
    """``proc``'s exit code, or a failure naming its state and signal masks if it is still running."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                state = [line for line in f.read().splitlines() if line.startswith(("State", "Sig", "Threads"))]
        except OSError:
            state = []
        proc.kill()
        raise AssertionError(f"still running {timeout:.0f} s after SIGINT: {'; '.join(state)}") from None


def _fds(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []


def _wait_for(predicate, timeout: float = 120.0) -> None:
    import time

    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


# --- 3. a line ends at a newline only ----------------------------------------------------------------------------


def test_prompt_lines_split_at_newlines_only(tmp_path):
    from specdec_cli.commands.common import read_prompt_lines

    path = batch_file(tmp_path, "one\fstill one\u2028and\x1cthis\x85too\vhere\r\n\n  \ntwo\n")
    assert read_prompt_lines(str(path), "--batch-file") == ["one\fstill one\u2028and\x1cthis\x85too\vhere", "two"]


@pytest.mark.slow
def test_a_batch_file_gives_one_answer_per_line(tmp_path):
    prompts = batch_file(tmp_path, "Say hi.\fThen\u2028stop\x1cnow\x85ok\r\nSay bye.\n")
    proc, _ = run("generate", "--method", "ar", "--budget", "paper", "-n", "1", "--json", "--batch-file", prompts)
    assert proc.returncode == 0, proc.stderr.decode()
    assert [json.loads(line)["index"] for line in proc.stdout.decode().splitlines()] == [0, 1]


# --- 4-7. --memory: unwritable, full disk, shared, links, sizes ----------------------------------------------------


def write_memory(folder: Path, fingerprint: str, sequences: list[list[int]]) -> Path:
    from specdec_cli.drafting.output_memory import OutputMemory

    memory = OutputMemory()
    for seq in sequences:
        memory.add(seq)
    memory.save(folder, fingerprint)
    return folder


def token_file(folder: Path) -> Path:
    return folder / json.loads((folder / "memory.json").read_text())["file"]


def test_an_unwritable_memory_folder_is_refused_before_the_model_loads():
    refused("generate", "--memory", "/proc/self", "-n", "4", "Hi", needles=("cannot write --memory /proc/self",))


def test_a_failed_memory_save_is_one_line_and_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    """The token file is written, then the manifest fails (a full disk): both new files go, the old memory stays."""
    from specdec_cli.drafting import memory_folder
    from specdec_cli.drafting.output_memory import OutputMemory
    from specdec_cli.errors import SpecdecError

    folder = write_memory(tmp_path / "mem", "fp", [[1, 2, 3]])
    before = snapshot(folder)
    memory = OutputMemory.load(folder, "fp", 50)
    memory.add([4, 5])

    def full(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(memory_folder, "write_text", full)
    with pytest.raises(SpecdecError, match="cannot save --memory .*: No space left on device"):
        memory.save(folder, "fp")
    assert snapshot(folder) == before and sorted(p.name for p in folder.iterdir()) == sorted(
        Path(p).name for p in before)


@pytest.mark.slow
def test_a_full_disk_at_the_memory_save_prints_the_answer_then_one_line(tmp_path, fingerprint):
    """A file-size limit (the same short write as a full disk) when the memory is saved: the answer is printed,
    then one error line, exit 2; the old memory is untouched and no temporary or token file is left."""
    folder = write_memory(tmp_path / "mem", fingerprint, [[t % 5000 for t in range(k, k + 500)] for k in range(40)])
    before = snapshot(folder)

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))  # the token file is 80 KB

    proc, _ = run("generate", "--memory", folder, "-n", "4", "Say hi.", preexec_fn=limit)
    assert_user_error(proc, "cannot save --memory", "File too large")
    assert proc.stdout.strip()  # the answer came first
    assert snapshot(folder) == before and len(list(folder.iterdir())) == 2


def test_two_runs_sharing_a_memory_keep_both_updates(tmp_path):
    """Both load the same memory before either saves (the lost update): the second save merges."""
    from specdec_cli.drafting.output_memory import OutputMemory

    folder = write_memory(tmp_path / "mem", "fp", [[1, 2, 3]])
    first, second = OutputMemory.load(folder, "fp", 50), OutputMemory.load(folder, "fp", 50)
    first.add([4, 5])
    second.add([6, 7, 8])
    first.save(folder, "fp")
    second.save(folder, "fp")
    assert OutputMemory.load(folder, "fp", 50).sequences == [[1, 2, 3], [4, 5], [6, 7, 8]]
    assert len(list(folder.glob("tokens-*.npy"))) == 1


@pytest.mark.slow
def test_two_processes_sharing_a_memory_keep_both_updates(tmp_path, fingerprint):
    from specdec_cli.drafting.output_memory import OutputMemory

    folder = tmp_path / "mem"
    procs = [subprocess.Popen([*CMD, "generate", "--memory", str(folder), "-n", "4", prompt], env=ENV,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for prompt in ("Say hi.", "Name a colour.")]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()
    assert len(OutputMemory.load(folder, fingerprint, 1 << 20).sequences) == 2


def test_a_memory_token_file_that_is_a_link_is_refused(tmp_path):
    folder = write_memory(tmp_path / "mem", "fp", [[1, 2, 3]])
    secret = tmp_path / "secret.npy"
    np.save(secret, np.arange(100, dtype=np.int32))
    tokens = token_file(folder)
    tokens.unlink()
    tokens.symlink_to(secret)
    before = snapshot(tmp_path)
    refused("generate", "--memory", folder, "-n", "4", "Hi", needles=("is a link; refusing to read it",))
    assert snapshot(tmp_path) == before


def test_a_memory_larger_than_any_memory_is_refused_unread(tmp_path):
    """200 MB of tokens (a sparse file: only its header is written): refused from the header, before the model."""
    folder = write_memory(tmp_path / "mem", "fp", [[1, 2, 3]])
    tokens = token_file(folder)
    big = np.lib.format.open_memmap(tokens, mode="w+", dtype=np.int32, shape=(50_000_000,))
    del big
    refused("generate", "--memory", folder, "-n", "4", "Hi", needles=("holds 50,000,000 entries",))


def test_ten_million_tiny_sequences_load_bounded(tmp_path):
    """Only the newest entries a memory of its size holds are read (then split in NumPy): the newest tokens."""
    from specdec_cli.drafting.output_memory import OutputMemory

    folder = write_memory(tmp_path / "mem", "fp", [[1]])
    np.save(token_file(folder), np.tile(np.array([3, -1], dtype=np.int32), 10_000_000))
    memory = OutputMemory.load(folder, "fp", 50, max_tokens=1000)
    assert memory.sequences == [[3]] * 1000


# --- 8. deeply nested JSON: nine readers, one bounded reader -------------------------------------------------------


def nested_store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text(NESTED)
    return store


def nested_file(tmp_path: Path, name: str = "nested.jsonl") -> Path:
    path = tmp_path / name
    path.write_text(NESTED + "\n")
    return path


@pytest.mark.parametrize("case", ["datastore", "bench-out", "throughput-out", "bench-merge", "compare", "memory"])
def test_deeply_nested_json_is_one_line(tmp_path, case):
    path = nested_file(tmp_path)
    if case == "memory":
        (tmp_path / "mem").mkdir()
        (tmp_path / "mem" / "memory.json").write_text(NESTED)
    args = {"datastore": ["generate", "--method", "rest", "--datastore", nested_store(tmp_path), "Hi"],
            "bench-out": ["bench", "--methods", "ar", "--out", path],
            "throughput-out": ["bench", "--methods", "ar", "--batch-size", "2", "--out", path],
            "bench-merge": ["bench-merge", path],
            "compare": ["bench", "--methods", "ar", "--compare", path],
            "memory": ["generate", "--memory", tmp_path / "mem", "Hi"]}[case]
    before = snapshot(tmp_path)
    line = refused(*args)
    assert "nested deeper than 100 levels" in line or "corrupt" in line, line
    assert snapshot(tmp_path) == before


def bench_config(prompts: Path) -> dict:
    """The configuration ``bench --methods auto --prompts P -n 2 --threads 1 --no-warmup --out ...`` records."""
    from specdec_cli import bench as lib

    cfg = lib.BenchConfig(methods=lib.method_list(["auto"]), prompts=str(prompts), warmup=False,
                          settings=RunSettings(2, threads=1))
    return json.loads(json.dumps(cfg.to_json()))


RESUMED = ["bench", "--methods", "auto", "-n", "2", "--threads", "1", "--no-warmup"]


def write_checkpoint(out: Path, prompts: Path, state) -> None:
    """``OUT.partial`` with prompt ``a`` done by both methods, and ``auto``'s learned state after it."""
    from specdec_cli.bench.checkpoint import SCHEMA, STATE_SCHEMA

    config = bench_config(prompts)
    units = [{"prompt_id": "a", "method": m, "generations": [
        {"method": m, "prompt_id": "a", "turn": 0, "tokens": [1, 2], "seconds": 0.1}]} for m in ("ar", "auto")]
    Path(f"{out}.partial").write_text("".join(json.dumps(x) + "\n" for x in [{"schema": SCHEMA, "config": config},
                                                                            *units]))
    text = state if isinstance(state, str) else json.dumps(
        {"schema": STATE_SCHEMA, "config": config, "methods": {"auto": {"after": "a", "state": state}}})
    Path(f"{out}.partial.state").write_text(text)


def test_deeply_nested_resume_state_is_read_as_damaged(tmp_path):
    """``OUT.partial.state`` nested 100,000 deep reads as a torn state (every method reruns from its start); the
    run then stops at its missing prompt file: one line, no RecursionError, before any model loads."""
    prompts, out = tmp_path / "p.jsonl", tmp_path / "run.jsonl"
    write_checkpoint(out, prompts, NESTED)
    refused(*RESUMED, "--prompts", prompts, "--out", out, "--resume", needles=("cannot read prompt file",))


def test_deeply_nested_caches_are_measured_again(tmp_path, monkeypatch):
    """Kernel plans and forward-time profiles are caches: nested JSON there reads as no cache (measured again)."""
    from specdec_cli.runtime import kernels, profile

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "plans.json").write_text(NESTED)
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "k.json").write_text(NESTED)
    assert kernels.load_plans() == {} and profile.load("k") is None


# --- 9. a huge number in resume state ------------------------------------------------------------------------------


def hostile_auto_state(number) -> dict:
    from specdec_cli.engine.budget import DEPTH_BINS, SCORE_BINS, Budget

    table = [[number] * SCORE_BINS] * DEPTH_BINS
    return {"budget": Budget().state(),
            "drafter": {"calibration": [["context", 0, {"accepted": table, "tested": table, "raw_total": 1.0}]],
                        "gates": {}, "memory": {"sequences": [], "added": 0, "forgotten": 0}, "pending": [None],
                        "trigram": []}}


def test_a_huge_number_in_learned_state_is_a_value_error():
    from specdec_cli.bench.runners import restore_state
    from specdec_cli.errors import SpecdecError
    from specdec_cli.io.state import count, number

    for bad in (10**400, -10**400):
        with pytest.raises(ValueError):
            number(bad)
        with pytest.raises(ValueError):
            count(bad)

    class Runner:
        @staticmethod
        def load_state(state):
            from specdec_cli.engine.budget import Calibrator

            Calibrator().load_state(state["drafter"]["calibration"][0][2])

    with pytest.raises(SpecdecError, match="damaged state for method auto"):
        restore_state(Runner, "auto", hostile_auto_state(10**400), type("C", (), {"state_path": "S"}))


@pytest.mark.slow
def test_a_huge_number_in_resume_state_is_one_line(tmp_path):
    prompts, out = tmp_path / "p.jsonl", tmp_path / "run.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": "Say hi.", "raw": True}) + "\n" for i in "ab"))
    write_checkpoint(out, prompts, hostile_auto_state(10**400))
    proc, _ = run(*RESUMED, "--prompts", prompts, "--out", out, "--resume")
    err = proc.stderr.decode()
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("bench: ")]  # progress
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("specdec: error: ") and "damaged state for method auto" in lines[0]


# --- 10. argument-parser errors are one line -----------------------------------------------------------------------


@pytest.mark.parametrize("args,needle", [
    (["generate", "--batch-size", "x", "Hi"], "Invalid value for '--batch-size'"),
    (["generate", "--batch-size", "nan", "Hi"], "Invalid value for '--batch-size'"),
    (["generate", "-n", "x", "Hi"], "'--max-new-tokens' / '-n'"),
    (["generate", "--no-such-flag", "Hi"], "No such option: --no-such-flag"),
    (["bench", "--threads", "x"], "Invalid value for '--threads'"),
    (["generate", "Hi", "there"], "unexpected extra argument"),
    (["no-such-command"], "No such command"),
])
def test_parser_errors_are_one_line(args, needle):
    line = refused(*args, needles=(needle,))
    assert "specdec" in line.split("(see")[-1]  # points at the command's --help


# --- also found ------------------------------------------------------------------------------------------------


def test_threads_beyond_the_cpus_are_refused():
    from specdec_cli.config import cpu_count

    for command in (["generate", "Hi"], ["bench"]):
        refused(*command, "--threads", "999", needles=(f"--threads must be at most {cpu_count()}",))


@pytest.mark.parametrize("args", [["generate", "--method", "pld", "Hi"], ["bench", "--methods", "ar,pld"]])
def test_memory_with_another_method_names_the_flag(tmp_path, args):
    line = refused(*args, "--memory", tmp_path / "mem", needles=("--memory is an option of auto only",))
    assert "memory_dir" not in line and not (tmp_path / "mem").exists()


@pytest.mark.slow
@pytest.mark.parametrize("drafts", [["int8:", "int8:"], ["bf16:", "int8:"]], ids=["int8-int8", "bf16-int8"])
def test_hsddw_with_an_int8_second_draft(drafts):
    """The README's hsddw shape (a second draft that is ``int8:``): vocab_size of a quantized head."""
    args = [a for d in drafts for a in ("--draft", d)]
    proc, _ = run("generate", "--method", "hsddw", *args, "-n", "8", "Explain caching.")
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.strip() and "Traceback" not in proc.stderr.decode()


@pytest.mark.slow
def test_int8_head_vocab_size(smollm2_int8, smollm2):
    assert smollm2_int8.vocab_size == smollm2.vocab_size


def tiny_target():
    from specdec_cli.io.models import LoadedModel

    target = LoadedModel(tiny_llama(vocab=16), None, "tiny", False)
    target.__dict__["stop_ids"] = frozenset()  # no stop token: every run is as long as asked
    return target


def test_keyword_values_override_the_settings_passed():
    """``api.run(..., settings, max_new_tokens=N)`` decodes N tokens (the warm-ups ran at full length)."""
    from specdec_cli import api

    target, settings = tiny_target(), api.RunSettings(max_new_tokens=12)
    drafter = api.make_drafter("ar", target, [], settings)
    assert len(api.run(target, [1, 2, 3], drafter, settings, max_new_tokens=3).tokens) == 3
    assert len(api.run(target, [1, 2, 3], drafter, settings).tokens) == 12
    drafters = api.make_drafters("ar", target, [], settings, batch_size=2)
    results = api.run_batch(target, [[1, 2, 3], [4, 5]], drafters, settings, max_new_tokens=3)
    assert [len(r.tokens) for r in results] == [3, 3]


def test_throughput_warm_ups_are_short(monkeypatch):
    """bench --batch-size's warm-ups (sequential ar, our batched runs) decode WARMUP_TOKENS, not the run's length."""
    from specdec_cli import api
    from specdec_cli.bench import BenchConfig, throughput
    from specdec_cli.bench.config import WARMUP_TOKENS

    asked: list[int] = []
    generate, generate_batch = api.generate, api.generate_batch
    monkeypatch.setattr(api, "generate", lambda *a, **k: asked.append(k["max_new_tokens"]) or generate(*a, **k))
    monkeypatch.setattr(api, "generate_batch",
                        lambda *a, **k: asked.append(k["max_new_tokens"]) or generate_batch(*a, **k))
    target, cfg = tiny_target(), BenchConfig(methods=["ar"], settings=RunSettings(WARMUP_TOKENS + 4, budget="paper"))
    ids = [[1, 2, 3], [4, 5]]
    throughput.sequential_ar(target, ids, cfg.settings, True)
    throughput.timed_ours("ar", target, [], ids, 2, cfg, None, {})
    n = cfg.settings.max_new_tokens
    assert asked == [WARMUP_TOKENS, n, n, WARMUP_TOKENS, n]


def test_a_batched_run_leaves_each_drafters_own_prices():
    """After run_batch every budget prices with its own profile again: a second run (the timed one after the
    warm-up) does not wrap the first one's batch shares."""
    from specdec_cli import api

    target, settings = tiny_target(), api.RunSettings(max_new_tokens=4)
    drafters = api.make_drafters("ar", target, [], settings, batch_size=2)
    own = [d.budget.profile for d in drafters]
    for _ in range(2):
        api.run_batch(target, [[1, 2, 3], [4, 5], [6]], drafters, settings)
        assert all(d.budget.profile is p for d, p in zip(drafters, own))


def test_auto_gate_states_survive_a_checkpoint_round_trip():
    """An ``auto`` with a draft model (a gated source) run until its gate has recorded: ``state()`` -> JSON ->
    ``load_state`` restores the gate exactly (the resume tests ran auto without gated sources). Mutation check:
    without ``gate.load_state(...)`` in ``AutoDrafter.load_state`` this test fails."""
    from specdec_cli.engine.budget import Budget
    from specdec_cli.engine.loop import generate

    from test_auto import PROMPT, STEEP, tiny_auto

    target, drafter = tiny_llama(seed=0), tiny_auto(Budget("auto", STEEP))
    for k in range(3):
        generate(target, PROMPT + [k], drafter, max_new_tokens=24)
    state = json.loads(json.dumps(drafter.state()))
    assert state["gates"]["model"]["runs"] > 0  # the gate recorded: its state is not a new gate's
    fresh = tiny_auto(Budget("auto", STEEP))
    fresh.load_state(state)
    assert {name: gate.state() for name, gate in fresh.gates.items()} == state["gates"]
    assert json.loads(json.dumps(fresh.state())) == state


# --- the GGUF conversion cache: one conversion at a time; a broken one is converted again ------------------------

FAKE_CONVERSION = r"""
import json, sys, time
from pathlib import Path
from specdec_cli.io import atomic, gguf

def fake(src, out, progress):  # a conversion that waits for the test's go-ahead
    print("converting", flush=True)
    Path(sys.argv[2]).touch()
    while not Path(sys.argv[3]).exists():
        time.sleep(0.05)
    tmp = atomic.new_build_dir(out)
    (tmp / "config.json").write_text("{}")
    (tmp / gguf.MARKER).write_text(json.dumps({"gguf": str(src), "files": {"config.json": 2}}))
    atomic.replace_dir(tmp, out)

gguf._convert = fake
print(gguf.convert(Path(sys.argv[1])), flush=True)
"""


def test_two_processes_converting_one_gguf_convert_it_once(tmp_path):
    src, started, go = tmp_path / "m.gguf", tmp_path / "started", tmp_path / "go"
    src.write_bytes(b"GGUF")
    env = {**ENV, "SPECDEC_CACHE": str(tmp_path / "cache")}
    files = [tempfile.TemporaryFile(mode="a+b") for _ in range(4)]  # appended to: reading moves no write
    first = subprocess.Popen([sys.executable, "-c", FAKE_CONVERSION, src, started, go], env=env, stdout=files[0],
                             stderr=files[1])
    _wait_for(lambda: started.exists() or first.poll() is not None)
    second = subprocess.Popen([sys.executable, "-c", FAKE_CONVERSION, src, started, go], env=env, stdout=files[2],
                              stderr=files[3])
    _wait_for(lambda: b"waiting for another process" in _read(files[3]) or second.poll() is not None)
    go.touch()
    assert first.wait(timeout=120) == 0 and second.wait(timeout=120) == 0, _read(files[3])
    outs = [_read(files[0]).decode().split(), _read(files[2]).decode().split()]
    assert outs[0][0] == "converting" and "converting" not in outs[1] and outs[0][-1] == outs[1][-1]


def _read(fh) -> bytes:
    fh.seek(0)
    return fh.read()


def test_a_conversion_that_does_not_load_even_again_names_its_folder(tmp_path, monkeypatch):
    from specdec_cli.errors import SpecdecError
    from specdec_cli.io import gguf, models

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "m.gguf"
    src.write_bytes(b"GGUF")
    out = gguf.cache_dir(src)
    out.mkdir(parents=True)
    (out / gguf.MARKER).write_text(json.dumps({"gguf": str(src)}))
    rebuilt = []
    monkeypatch.setattr(gguf, "rebuild", lambda *a: rebuilt.append(a))

    def broken(source):
        raise OSError("config.json: not JSON")

    with pytest.raises(SpecdecError, match=f"converted copy {out}: .*delete that folder"):
        models._load_converted_again("model 'm'", str(out), broken)
    assert len(rebuilt) == 1


@pytest.mark.slow
def test_a_broken_conversion_in_the_cache_is_converted_again(tmp_path, monkeypatch):
    """A cached conversion whose config.json is damaged (and whose marker predates the file list): the run says
    so, converts the GGUF again and answers; the folder is complete afterwards."""
    from specdec_cli.io import gguf
    from specdec_cli.io.aliases import ALIASES
    from specdec_cli.io.models import _pypi_gguf_path

    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECDEC_CACHE", str(cache))
    src = _pypi_gguf_path(ALIASES["smollm2-135m"])
    out = gguf.cache_dir(src)
    out.mkdir(parents=True)
    (out / gguf.MARKER).write_text(json.dumps({"gguf": str(src.resolve())}))
    (out / "config.json").write_text("{ not json")
    proc, _ = run("generate", "--method", "ar", "--budget", "paper", "--kernels", "torch", "-n", "2", "Say hi.",
                  env={**ENV, "SPECDEC_CACHE": str(cache)}, timeout=900)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert f"the converted model in {out} cannot be loaded" in err and proc.stdout.strip()
    assert gguf.complete(out) and "files" in json.loads((out / gguf.MARKER).read_text())


def test_warm_ups_teach_the_timed_runs_nothing(smollm2, monkeypatch):
    """The warm-up decodes the first timed prompt's first tokens: auto's memory would hand them back to the timed
    run. bench and throughput mode restore each method's (each slot's) learnt state after it."""
    from specdec_cli import api
    from specdec_cli.bench import BenchConfig, runners, throughput

    target, ids = smollm2, [[1, 2, 3, 4], [5, 6, 7]]
    cfg = BenchConfig(methods=["auto"], settings=RunSettings(12, budget="paper"))
    runner = runners.make_runner("auto", target, [], cfg)
    before = runner.state()
    monkeypatch.setattr(runners, "encode_turn", lambda *a: ids[0])
    runners.warm_up(target, [None], {"auto": runner}, 12)
    assert runner.state() == before
    runner(ids[0], 4)
    assert runner.state() != before  # what it restored is what a generation changes
    order = []  # a vLLM runner: its proposer's state lives in vLLM's processes, marked and returned to there
    vllm = lambda ids, n: order.append("run")
    vllm.before_warmup, vllm.after_warmup = lambda: order.append("mark"), lambda: order.append("back")
    runners.warm_up(target, [None], {"vllm-auto": vllm}, 12)
    assert order == ["mark", "run", "back"]

    seen = []
    run_batch = api.run_batch
    monkeypatch.setattr(api, "run_batch", lambda t, rows, drafters, *a, **k: seen.append(
        [(d.budget.state(), d.state()) for d in drafters]) or run_batch(t, rows, drafters, *a, **k))
    throughput.timed_ours("auto", target, [], ids, 2, cfg, None, {})
    assert seen[0] == seen[1]  # the timed run starts where the warm-up did
