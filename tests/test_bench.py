"""``specdec bench``: prompt loaders, a tiny real benchmark on SmolLM2, --compare, plain output, --plot."""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess

import pytest
import torch
from typer.testing import CliRunner

from specdec_cli import bench as lib
from specdec_cli.cli import app
from specdec_cli.config import RunSettings, SamplingConfig
from specdec_cli.errors import SpecdecError
from specdec_cli.io.prompts import load_prompts

METHODS = "ar,pld,hf" if importlib.util.find_spec("specdec_cli.methods.pld") else "ar,sd,hf"


# --- prompt sets (no model) ---------------------------------------------------------------------------------------


def test_mt_bench_has_80_two_turn_questions():
    prompts = load_prompts("mt-bench")
    assert len(prompts) == 80
    assert all(len(p.turns) == 2 and not p.raw for p in prompts)
    assert len({p.category for p in prompts}) == 8
    coding = load_prompts("mt-bench", category="coding", limit=3)
    assert len(coding) == 3 and {p.category for p in coding} == {"coding"}


def test_humaneval_has_164_raw_prompts():
    prompts = load_prompts("humaneval")
    assert len(prompts) == 164
    assert prompts[0].id == "HumanEval/0" and prompts[0].raw and prompts[0].turns[0].lstrip().startswith("from typing")


def test_shipped_samples_parse_in_the_datasets_layout():
    gsm = load_prompts("gsm8k-sample")
    alpaca = load_prompts("alpaca-sample")
    assert len(gsm) == 5 and all(p.category == "math" and p.turns[0].endswith("?") for p in gsm)
    assert len(alpaca) == 5
    assert "The committee approved" in alpaca[1].turns[0]  # the 'input' field is appended to the instruction


def test_hub_sets_fail_in_one_line_when_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SpecdecError, match="gsm8k-sample") as err:
        load_prompts("gsm8k")
    assert "\n" not in str(err.value)


def test_rag_set_is_built_from_local_documents():
    prompts = load_prompts("rag")
    assert len(prompts) >= 10
    assert {p.category for p in prompts} == {"summarize", "qa"}
    assert prompts[0].turns[0].startswith("Summarize the following document:")


def test_user_jsonl_and_bad_names(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "hello"}\n{"id": "x", "turns": ["a", "b"], "raw": true}\n')
    prompts = load_prompts(str(path))
    assert [p.id for p in prompts] == ["mine/0", "x"] and prompts[1].raw and len(prompts[1].turns) == 2
    with pytest.raises(SpecdecError, match="unknown prompt set"):
        load_prompts("nope")
    with pytest.raises(SpecdecError, match="categories"):
        load_prompts("humaneval", category="poetry")


# --- pure logic ----------------------------------------------------------------------------------------------------


def test_methods_order_and_rotation():
    assert lib.method_list(["hf", "sd"]) == ["ar", "hf", "sd"]
    assert lib.rotated(["a", "b", "c"], 1) == ["b", "c", "a"]
    with pytest.raises(SpecdecError, match="unknown method"):
        lib.method_list(["ar", "warp-drive"])


def test_identity_check_reports_first_divergence():
    gens = [lib.Generation("ar", "p", 0, [1, 2, 3], 1.0, 3, 3, 0, 0, 0.0),
            lib.Generation("x", "p", 0, [1, 9, 3], 0.5, 1, 3, 2, 2, 0.1)]
    ar, x = lib.summarize(gens, ["ar", "x"], greedy=True)
    assert ar["lossless"] and ar["speedup"] == pytest.approx(1.0)
    assert x["lossless"] is False and x["mismatches"] == [{"prompt_id": "p", "turn": 0, "first_divergence": 1}]
    assert x["speedup"] == pytest.approx(2.0) and x["mean_accepted_length"] == pytest.approx(3.0)
    assert x["sigma"] == pytest.approx(0.0) and x["eta"] == pytest.approx(1 / 3)
    assert lib.first_divergence([1, 2], [1, 2, 3]) == 2
    sampled = lib.summarize(gens, ["ar", "x"], greedy=False)
    assert sampled[1]["lossless"] is None


# --- a real (tiny) benchmark through the CLI --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def patched_load(smollm2):
    """The CLI loads models via api.load; hand it the session's SmolLM2 (and int8 copy when asked)."""
    mp = pytest.MonkeyPatch()
    from specdec_cli import api
    from specdec_cli.io.models import load_draft

    drafts_cache: dict = {}

    def fake_load(model, drafts=(), dtype="auto", device="auto", kernel_mode="auto"):
        return smollm2, [drafts_cache.setdefault(d, load_draft(d, smollm2)) for d in drafts]

    mp.setattr(api, "load", fake_load)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    mp.undo()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("bench")


@pytest.fixture(scope="module")
def real_run(patched_load, run_dir):
    out = run_dir / "results.jsonl"
    plot = run_dir / "speedup.png"
    args = ["bench", "--model", "smollm2-135m", "--methods", METHODS, "--prompts", "humaneval", "--limit", "2",
            "--max-new-tokens", "8", "--threads", "1", "--json", "--out", str(out), "--plot", str(plot)]
    if "sd" in METHODS:
        args += ["--draft", "int8:"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), out, plot


@pytest.mark.slow
def test_real_run_record_fields(real_run):
    record, out, _ = real_run
    assert record["schema"] == lib.RECORD_SCHEMA and record["prompt_set"] == "humaneval"
    assert set(record["machine"]) >= {"platform", "cpu", "gpu", "torch", "transformers", "specdec"}
    assert record["machine"]["torch_threads"] == 1
    assert record["machine"]["openmp"].startswith("omp ")  # how OpenMP's workers waited (threads' speed hangs on it)
    assert "git_commit" in record and "timestamp" in record
    assert record["config"]["settings"]["max_new_tokens"] == 8 and record["config"]["methods"] == METHODS.split(",")
    by = {r["method"]: r for r in record["results"]}
    assert list(by) == METHODS.split(",")
    for r in by.values():
        assert r["generations"] == 2 and r["tokens_per_s"] > 0 and r["speedup"] > 0
        assert r["lossless"] is True, r["mismatches"]  # greedy: identical to ar, hf's generate included
        assert len(r["per_prompt"]) == 2
    assert by["ar"]["speedup"] == pytest.approx(1.0)
    assert by["ar"]["mean_accepted_length"] == pytest.approx(1.0)
    assert by["hf"]["mean_accepted_length"] == pytest.approx(1.0)  # counted target forwards of generate()
    saved = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(saved) == 1 and saved[0]["results"][0]["method"] == "ar"


@pytest.mark.slow
def test_plot_writes_png(real_run):
    _, _, plot = real_run
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- CLI plumbing on a stored record (no generation) ----------------------------------------------------------------


@pytest.fixture
def canned(real_run, monkeypatch):
    """Make `bench` return a copy of the real record so CLI behaviour can be tested without generating again."""
    record = real_run[0]
    monkeypatch.setattr(lib, "benchmark", lambda cfg, target, drafts, *rest: copy.deepcopy(record))
    return record


def invoke(*args):
    return CliRunner().invoke(app, ["bench", "--prompts", "humaneval", "--methods", METHODS, *args])


def write_records(path, *records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.mark.slow
def test_plain_table_when_piped(canned):
    result = invoke()
    assert result.exit_code == 0, result.output
    assert "\x1b[" not in result.stdout and "│" not in result.stdout
    lines = result.stdout.splitlines()
    assert lines[1].split()[:4] == ["method", "tok/s", "ms/tok", "speedup"]
    assert lines[2].startswith("ar ") and "yes 2/2" in lines[2]


@pytest.mark.slow
def test_compare_passes_an_unchanged_record(canned, tmp_path):
    old = tmp_path / "old.jsonl"
    write_records(old, canned)
    result = invoke("--compare", str(old))
    assert result.exit_code == 0, result.output
    assert "REGRESSION" not in result.stdout and "OK" in result.stdout


@pytest.mark.slow
def test_compare_flags_a_speedup_regression(canned, tmp_path):
    faster = copy.deepcopy(canned)
    faster["results"][-1]["speedup"] = canned["results"][-1]["speedup"] * 1.5  # the old run was much faster
    unrelated = copy.deepcopy(canned)
    unrelated["config"]["model"] = "another-model"
    old = tmp_path / "old.jsonl"
    write_records(old, faster, unrelated)  # the latest *matching* record is `faster`
    result = invoke("--compare", str(old), "--json")
    assert result.exit_code == lib.REGRESSION_EXIT_CODE, result.output
    findings = {f["method"]: f for f in json.loads(result.stdout)["compare"]}
    assert findings[canned["results"][-1]["method"]]["status"] == "regression"
    assert findings["ar"]["status"] == "ok"
    loose = invoke("--compare", str(old), "--tolerance", "0.5")
    assert loose.exit_code == 0, loose.output


@pytest.mark.slow
def test_compare_flags_a_losslessness_failure(canned, tmp_path, monkeypatch):
    broken = copy.deepcopy(canned)
    broken["results"][1].update(lossless=False, identical=1,
                                mismatches=[{"prompt_id": "HumanEval/0", "turn": 0, "first_divergence": 3}])
    monkeypatch.setattr(lib, "benchmark", lambda cfg, target, drafts, *rest: copy.deepcopy(broken))
    old = tmp_path / "old.jsonl"
    write_records(old, canned)
    result = invoke("--compare", str(old))
    assert result.exit_code == lib.REGRESSION_EXIT_CODE
    assert "output differs from ar" in result.stdout and "NO 1/2" in result.stdout


def test_user_errors_are_one_line():
    result = CliRunner().invoke(app, ["bench", "--methods", "ar,warp-drive"])
    assert result.exit_code == 2 and "unknown method" in result.stderr and len(result.stderr.splitlines()) == 1
    result = CliRunner().invoke(app, ["bench", "--compare", "/no/such/file.jsonl"])
    assert result.exit_code == 2 and "cannot read --compare" in result.stderr


def test_runners_on_a_tiny_model_greedy_and_sampled():
    """Our ar and transformers' generate agree token for token (greedy); sampling settings reach generate."""
    from types import SimpleNamespace

    from conftest import tiny_llama

    target = SimpleNamespace(model=tiny_llama(vocab=8), tokenizer=SimpleNamespace(pad_token_id=0),
                             stop_ids=frozenset({7}))
    cfg = lib.BenchConfig()
    ids = [1, 2, 3, 4]
    ar = lib.make_runner("ar", target, [], cfg)(ids, 12)
    for method in ("hf", "hf-pld"):
        gen = lib.make_runner(method, target, [], cfg)(ids, 12)
        assert gen.tokens == ar.tokens and gen.forwards >= 1
    hot = lib.BenchConfig(settings=RunSettings(sampling=SamplingConfig(1.0), seed=3))
    a = lib.make_runner("hf", target, [], hot)(ids, 12).tokens
    assert a == lib.make_runner("hf", target, [], hot)(ids, 12).tokens  # seeded: reproducible
    with pytest.raises(SpecdecError, match="needs a draft"):
        lib.make_runner("hf-assisted", target, [], cfg)


# --- sharding: --offset, per-method --datastore, bench-merge (no model) -------------------------------------------


def test_offset_skips_prompts_after_category_and_is_checked():
    assert [p.id for p in load_prompts("humaneval", limit=2, offset=5)] == ["HumanEval/5", "HumanEval/6"]
    coding = load_prompts("mt-bench", category="coding")
    assert load_prompts("mt-bench", category="coding", offset=3)[0].id == coding[3].id
    with pytest.raises(SpecdecError, match="--offset"):
        load_prompts("humaneval", offset=164)


def test_datastore_per_method():
    specs = ["rest=ds/sa", "aded=ds/tri"]
    assert lib.datastore_for("rest", specs) == "ds/sa" and lib.datastore_for("aded", specs) == "ds/tri"
    assert lib.datastore_for("rest", ["ds/all"]) == "ds/all" and lib.datastore_for("pld", []) is None
    assert lib.datastore_for("aded", ["ds/all", "rest=ds/sa"]) == "ds/all"
    with pytest.raises(SpecdecError, match="METHOD=DIR"):
        lib.datastore_for("rest", ["a", "b"])


def test_a_bare_datastore_that_no_method_reads_is_not_checked(tmp_path):
    """`bench --methods auto,pld --datastore DIR`: auto reads only auto=DIR and pld no store, so DIR is not opened;
    its tokenizer is not checked either (a missing DIR's manifest was read there: a traceback). A store a method
    does read is still refused in one line."""
    from specdec_cli.commands.bench import check_stores

    missing = str(tmp_path / "missing")
    assert check_stores(lib, lib.BenchConfig(methods=["auto", "pld"], datastore=[missing])) == {}
    with pytest.raises(SpecdecError, match="no such directory"):
        check_stores(lib, lib.BenchConfig(methods=["pld", "rest"], datastore=[missing]))


def gen(method, pid, tokens, seconds, forwards=None, drafted=None, accepted=None):
    return lib.Generation(method, pid, 0, [1] * tokens, seconds, forwards=forwards, emitted=tokens,
                          drafted=drafted, accepted=accepted, draft_s=0.0 if forwards else None)


def shard_record(gens, offset):
    cfg = lib.BenchConfig(methods=["ar", "pld"], prompts="humaneval", offset=offset, limit=2)
    results = lib.summarize(gens, ["ar", "pld"], greedy=True)
    return lib.make_record(cfg, [None, None], results, "cpu")


def test_merge_records_pools_counts_of_disjoint_shards(tmp_path):
    a = shard_record([gen("ar", "p0", 10, 1.0, 10), gen("ar", "p1", 10, 1.0, 10),
                      gen("pld", "p0", 10, 0.5, 5, 8, 5), gen("pld", "p1", 10, 0.5, 5, 8, 5)], 0)
    b = shard_record([gen("ar", "p2", 20, 2.0, 20), gen("ar", "p3", 20, 4.0, 20),
                      gen("pld", "p2", 20, 3.0, 10, 20, 10), gen("pld", "p3", 20, 3.0, 10, 20, 10)], 2)
    merged = lib.merge_records([a, b])
    ar, pld = merged["results"]
    assert merged["num_prompts"] == 4 and [m["offset"] for m in merged["merged_from"]] == [0, 2]
    assert ar["tokens_per_s"] == pytest.approx(60 / 8) and pld["tokens_per_s"] == pytest.approx(60 / 7)
    assert pld["speedup"] == pytest.approx(8 / 7)
    assert pld["mean_accepted_length"] == pytest.approx(60 / 30) and pld["sigma"] == pytest.approx(1 - 30 / 56)
    assert pld["lossless"] and pld["identical"] == 4
    with pytest.raises(SpecdecError, match="overlap"):
        lib.merge_records([a, a])
    c = copy.deepcopy(b)
    c["config"]["settings"]["max_new_tokens"] = 64
    with pytest.raises(SpecdecError, match="max_new_tokens"):
        lib.merge_records([a, c])
    for i, rec in enumerate((a, b)):
        lib.append_record(str(tmp_path / f"{i}.jsonl"), rec)
    res = CliRunner().invoke(app, ["bench-merge", str(tmp_path / "0.jsonl"), str(tmp_path / "1.jsonl"), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["num_prompts"] == 4
    res = CliRunner().invoke(app, ["bench-merge", str(tmp_path / "0.jsonl"), str(tmp_path / "0.jsonl")])
    assert res.exit_code == 2 and "overlap" in res.output


def as_v1(record: dict) -> dict:
    """``record`` as specdec-bench/1 wrote it: the run's settings flat in the config, the budget as typed."""
    old = copy.deepcopy(record)
    config, settings = old["config"], old["config"].pop("settings")
    config.update(max_new_tokens=settings["max_new_tokens"], temperature=settings["sampling"]["temperature"],
                  seed=settings["seed"], window=settings["window"], budget=str(settings["budget"]),
                  threads=settings["threads"])
    return {**old, "schema": "specdec-bench/1"}


def test_v1_records_read_merge_and_report_as_v2():
    """Stored specdec-bench/1 records (docs/results) still read: checked, upgraded, merged with /2 shards, titled."""
    from specdec_cli.bench.config import upgraded_config
    from specdec_cli.bench.report import title

    a = shard_record([gen("ar", "p0", 10, 1.0, 10), gen("pld", "p0", 10, 0.5, 5, 8, 5)], 0)
    b = shard_record([gen("ar", "p1", 10, 1.0, 10), gen("pld", "p1", 10, 0.5, 5, 8, 5)], 1)
    old = as_v1(b)
    assert a["schema"] == lib.RECORD_SCHEMA == "specdec-bench/2" and "settings" not in old["config"]
    assert lib.record_problem(old, merge=True) is None and upgraded_config(old["config"]) == b["config"]
    assert title(old) == title(b)
    merged = lib.merge_records([old, a])
    assert merged["schema"] == lib.RECORD_SCHEMA and merged["config"]["settings"] == a["config"]["settings"]
    assert merged["num_prompts"] == 4  # shard_record says 2 prompts each


def test_baselines_registry_is_one_entry_each():
    """Every outside baseline names a help text and a runner factory that imports (bench.baselines), and is a
    method label of specdec's engine: adding one is one entry."""
    import importlib

    from specdec_cli.bench.baselines import OUTSIDE_BASELINES
    from specdec_cli.bench.labels import methods_of

    for name, baseline in OUTSIDE_BASELINES.items():
        module, function = baseline.runner.split(":")
        assert baseline.help and callable(getattr(importlib.import_module(f"specdec_cli.bench.{module}"), function))
        assert name in methods_of("specdec") and lib.method_list([name]) == ["ar", name]


def test_api_keywords_override_the_settings_given():
    """``api.run``/``make_drafter``/``run_batch``: keywords given with a RunSettings replace its fields (checked
    again), never dropped; alone they make the settings."""
    from specdec_cli.api import with_values

    settings = RunSettings(64, budget="paper")
    short = with_values(settings, {"max_new_tokens": 8})
    assert short.max_new_tokens == 8 and short.budget.paper and with_values(settings, {}) is settings
    assert with_values(None, {"budget": "4"}).budget.limit == 4
    with pytest.raises(SpecdecError, match="max-new-tokens"):
        with_values(settings, {"max_new_tokens": 0})


def test_the_record_names_the_commit_a_run_started_on(monkeypatch):
    """``git_commit`` is asked when a run starts and kept: a commit made during a long run is not the code the run
    loaded (a record once named a commit made while its run was going)."""
    from specdec_cli.bench import records

    records.git_commit.cache_clear()
    calls = []

    def fake_run(*args, **kwargs):
        calls.append(args)
        return subprocess.CompletedProcess(args, 0, stdout=f"{len(calls):040d}\n", stderr="")

    monkeypatch.setattr(records.subprocess, "run", fake_run)
    try:
        first = records.git_commit()
        assert records.git_commit() == first == f"{1:040d}" and len(calls) == 1
    finally:
        records.git_commit.cache_clear()
