"""``--batch-size`` from the command line: generate answers in input order, identical to one at a time; bench's
throughput mode reports every run; bad values are one error line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import assert_user_error

PROMPTS = "def add(a, b):\nWrite a haiku about the sea.\nList three colors.\n"


def specdec(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "specdec_cli.cli", *args], input=stdin, capture_output=True,
                          timeout=600)


@pytest.mark.parametrize("args,needle", [(["generate", "x", "--batch-size", "0"], "--batch-size"),
                                         (["bench", "--batch-size", "2,0"], "from 1 to 256"),
                                         (["bench", "--batch-size", "x"], "positive integers"),
                                         (["bench", "--batch-size", "2", "--methods", "hf-pld"], "hf-pld")])
def test_bad_batch_sizes_are_one_line(args, needle):
    assert_user_error(specdec(*args), needle)


@pytest.mark.slow
def test_generate_batched_answers_in_input_order_identical_to_one_at_a_time(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPTS)
    runs = {}
    for size in ("1", "2"):
        proc = specdec("generate", "--batch-file", str(prompts), "--batch-size", size, "-n", "12", "--json")
        assert proc.returncode == 0, proc.stderr.decode()
        runs[size] = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [r["index"] for r in runs["2"]] == [0, 1, 2]
    assert [r["tokens"] for r in runs["2"]] == [r["tokens"] for r in runs["1"]]
    assert all(r["batch_size"] == 2 and r["latency_s"] > 0 for r in runs["2"])


@pytest.mark.slow
def test_bench_throughput_mode_reports_every_run(tmp_path):
    out = tmp_path / "t.jsonl"
    proc = specdec("bench", "--prompts", "humaneval", "--limit", "3", "-n", "8", "--batch-size", "1,2",
                   "--methods", "ar,auto", "--json", "--out", str(out))
    assert proc.returncode == 0, proc.stderr.decode()
    record = json.loads(proc.stdout.decode())
    assert record["schema"] == "specdec-bench-throughput/2" and json.loads(out.read_text()) == record
    runs = {(r["method"], r["batch_size"]) for r in record["rows"]}
    assert runs == {("ar", "sequential"), ("hf-batch", 1), ("hf-batch", 2), ("auto", 1), ("auto", 2), ("ar", 1),
                    ("ar", 2)}
    for r in record["rows"]:
        assert r["identical"] == 3 and r["tokens_per_s"] > 0 and r["latency_p90_s"] >= r["latency_median_s"]
        assert r["speedup_vs_ar"] > 0 and (r["peak_rss_mib"] or 0) > 0
    assert_user_error(specdec("bench", "--batch-size", "2", "--out", str(tmp_path)), "directory")


def test_throughput_runs_one_vllm_engine_at_a_time_and_none_beside_ours(monkeypatch):
    """An idle vLLM engine's processes take ~7% of a core: in the throughput mode each vLLM method's engine is
    alive only while its own rows run, and none while sequential ar, hf-batch or our batched runs are timed. The
    table keeps its order: per batch size, hf-batch first, then --methods' order."""
    from specdec_cli.bench import engines, throughput as tp
    from specdec_cli.bench.config import BenchConfig
    from specdec_cli.config import BatchSizes, RunSettings

    alive, events = set(), []

    class FakeEngine:
        def __init__(self, name):
            self.name = name
            alive.add(name)

        def finish(self):
            pass

        def close(self):
            alive.discard(self.name)

    def fake_row(method, size):
        return {"method": method, "batch_size": size, "tokens_per_s": 1.0}

    def ours(method, target, drafts, ids, size, cfg, reference, opened):
        events.append((method, size, set(alive)))
        return fake_row(method, size)

    def theirs(label, engine, ids, size, cfg, reference):
        events.append((label, size, set(alive)))
        return fake_row(label, size)

    def hf(target, ids, size, cfg, reference):
        events.append(("hf-batch", size, set(alive)))
        return fake_row("hf-batch", size)

    def sequential(target, ids, settings, greedy, compile="auto"):
        events.append(("ar", "sequential", set(alive)))
        return fake_row("ar", "sequential"), [[1]] * len(ids)

    monkeypatch.setattr(engines, "start_engine", lambda name, target, options: FakeEngine(name))
    monkeypatch.setattr(tp, "timed_ours", ours)
    monkeypatch.setattr(tp, "timed_vllm", theirs)
    monkeypatch.setattr(tp, "timed_hf", hf)
    monkeypatch.setattr(tp, "sequential_ar", sequential)
    monkeypatch.setattr(tp, "encode_turn", lambda target, p, turn, history, n: [1, 2, 3])
    monkeypatch.setattr(tp, "add_speedups", lambda rows: None)
    cfg = BenchConfig(methods=["vllm", "ar@specdec", "vllm-suffix"], prompts="humaneval", settings=RunSettings(4),
                      engine="vllm")
    record = tp.throughput(cfg, None, [], [object()] * 4, BatchSizes((2, 4)), log=lambda text: None)
    for method, size, seen in events:
        assert seen == ({method} if method.startswith("vllm") else set()), (method, size, seen)
    assert not alive
    assert [(r["method"], r["batch_size"]) for r in record["rows"]] == [
        ("ar", "sequential"), ("hf-batch", 2), ("vllm", 2), ("ar@specdec", 2), ("vllm-suffix", 2),
        ("hf-batch", 4), ("vllm", 4), ("ar@specdec", 4), ("vllm-suffix", 4)]
