"""``--engine vllm`` end to end on the CPU (skipped where vLLM is not installed: ``bash scripts/install-vllm.sh``).

An engine start costs one to three minutes, so the module starts three in all, each in one subprocess run as a
user would: ``bench`` with vLLM's plain decoding, specdec's proposer and specdec's own ``ar`` in one table (the
identity of every output across the engines, the record's schema, the memory of a first pass drafting a second),
and ``generate --batch-file`` on the proposer (answers in input order, the proposer's statistics). The errors
that need no engine are checked without starting one."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "List three uses of a hash map.",
           "Write a Python function that checks whether a number is prime."]


def specdec(*args: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "specdec_cli.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


def one_error_line(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("specdec: error:"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0]


@pytest.fixture(scope="module")
def bench_record(tmp_path_factory) -> dict:
    """One bench run: humaneval's first prompt twice in a row (the second finds the first in the memory)."""
    out = tmp_path_factory.mktemp("vllm") / "bench.jsonl"
    proc = specdec("bench", "--engine", "vllm", "--model", "smollm2-135m", "--prompts", "humaneval*2", "--limit", "1",
                   "-n", "24", "--methods", "vllm,auto,ar", "--threads", "1", "--json", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_bench_holds_both_engines_in_one_record(bench_record):
    record = bench_record
    assert record["baseline"] == "vllm" and record["config"]["engine"] == "vllm"
    rows = {r["method"]: r for r in record["results"]}
    assert list(rows) == ["vllm", "auto", "ar"]
    assert rows["vllm"]["engine"] == "vllm" and rows["auto"]["engine"] == "vllm" and rows["ar"]["engine"] == "specdec"
    for row in rows.values():  # greedy: every output identical to vLLM's plain decoding and to specdec's ar
        assert row["lossless"] is True and row["identical"] == row["generations"] == 2
    assert rows["auto"]["identical_to_ar"] == 2 and rows["vllm"]["identical_to_ar"] == 2
    assert rows["auto"]["speedup"] > 0 and rows["auto"]["speedup_vs_ar"] > 0


def test_the_proposer_reports_its_sources_and_time(bench_record):
    auto = next(r for r in bench_record["results"] if r["method"] == "auto")
    assert auto["draft_ms_per_step"] is not None and auto["mean_accepted_length"] >= 1.0
    assert set(auto["sources"]) >= {"context", "memory"}
    first, second = auto["per_prompt"]
    assert first["sources"].get("memory", {}).get("accepted", 0) == 0  # the warm-up's answer is forgotten
    assert second["sources"]["memory"]["accepted"] > 0  # the first timed one is not: the same prompt again
    assert second["forwards"] < auto["per_prompt"][0]["forwards"]


def test_generate_batch_on_the_proposer(tmp_path):
    batch = tmp_path / "prompts.txt"
    batch.write_text("\n".join(PROMPTS) + "\n")
    proc = specdec("generate", "--engine", "vllm", "--batch-file", str(batch), "--batch-size", "2", "-n", "24",
                   "--json", "--threads", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    answers, summary = records[:-1], records[-1]
    assert [r["index"] for r in answers] == [0, 1, 2] and all(r["engine"] == "vllm" for r in answers)
    assert answers[0]["tokens"] == answers[2]["tokens"]  # one prompt twice: one answer (greedy)
    assert summary["summary"] and summary["proposer"]["sequences_begun"] == 3
    assert summary["proposer"]["propose_ms_per_row"] is not None


def test_errors_before_any_engine_starts(tmp_path):
    one_error_line(specdec("generate", "--engine", "vllm", "--method", "sd", "hi"), "does not run on vLLM")
    one_error_line(specdec("generate", "--engine", "vllm", "--draft", "int8:", "hi"), "--draft")
    one_error_line(specdec("generate", "--engine", "vllm", "--opt", "top_c=4", "hi"), "top_c")
    one_error_line(specdec("generate", "--engine", "vllm", "--distributed-executor-backend", "slurm", "hi"),
                   "--distributed-executor-backend")
    one_error_line(specdec("bench", "--engine", "vllm", "--methods", "vllm,pld@vllm"), "does not run on vllm")
    model = tmp_path / "model"  # a checkpoint vLLM has no architecture for: refused before an engine starts
    model.mkdir()
    from specdec_cli.io.models import find_source

    source = Path(find_source("smollm2-135m")[0])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).write_bytes((source / name).read_bytes())
    config = json.loads((source / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "architectures": ["SpecdecTestOnlyForCausalLM"]}))
    one_error_line(specdec("generate", "--engine", "vllm", "--model", str(model), "hi"), "vLLM cannot load")
