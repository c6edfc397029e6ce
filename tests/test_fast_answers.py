"""Answers that need no model come before torch is imported: argument errors, `specdec methods` / `models`, a
wrongly typed `--opt`, an over-large prompt; a datastore of another tokenizer is refused before weights load.

The mechanism is asserted, not wall-clock time (a loaded two-core machine makes timings flaky): each case runs in
a fresh interpreter through Typer's runner, which reports whether ``torch`` was imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = r"""
import json, sys
from typer.testing import CliRunner
from specdec_cli.cli import app
out = []
for args in json.loads(sys.argv[1]):
    res = CliRunner().invoke(app, args, input=None)
    out.append({"code": res.exit_code, "stderr": res.stderr, "stdout": res.stdout[:200]})
out.append({"torch": "torch" in sys.modules})
print(json.dumps(out))
"""


def probe(cases: list[list[str]]) -> tuple[list[dict], bool]:
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cases)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    *results, flag = json.loads(proc.stdout.strip().splitlines()[-1])
    return results, flag["torch"]


def test_listings_need_no_torch():
    results, torch_imported = probe([["methods"], ["models"]])
    assert [r["code"] for r in results] == [0, 0]
    assert "auto" in results[0]["stdout"] and "smollm2-135m" in results[1]["stdout"]
    assert not torch_imported


@pytest.mark.parametrize("args, needle", [
    (["generate", "-n", "0", "hi"], "--max-new-tokens"),
    (["generate", "--temperature", "nan", "hi"], "--temperature"),
    (["generate", "--top-p", "2", "hi"], "--top-p"),
    (["generate", "--method", "nope", "hi"], "unknown method"),
    (["generate", "--budget", "lots", "hi"], "--budget"),
    (["generate", "--threads", "0", "hi"], "--threads"),
    (["generate", "--compile", "maybe", "hi"], "--compile"),
    (["generate", "--window", "0", "hi"], "--window"),
    (["generate", "--opt", "max_ngram=many", "hi"], "expected int"),
    (["generate", "--method", "pld", "--opt", "nope=1", "hi"], "unknown --opt"),
    (["generate", "   "], "empty prompt"),
    (["generate", "--datastore", "/nonexistent", "hi"], "no readable specdec datastore"),
    (["bench", "-n", "0"], "--max-new-tokens"),
    (["bench", "--methods", "ar,nope"], "unknown method"),
    (["bench", "--tolerance", "2"], "--tolerance"),
    (["bench", "--methods", "ar,rest", "--opt", "verify=x"], "expected int"),
    (["bench", "--temperature", "inf"], "--temperature"),
])
def test_argument_errors_come_before_torch(args, needle):
    (result,), torch_imported = probe([args])
    assert result["code"] == 2
    lines = result["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec: error:") and needle in lines[0]
    assert not torch_imported


def test_an_over_large_prompt_is_refused_unread(tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("x" * (9 << 20) + "\n")
    (result,), torch_imported = probe([["generate", "--batch-file", str(big)]])
    assert result["code"] == 2 and "larger than 8,388,608 bytes" in result["stderr"]  # read no further
    assert not torch_imported


def test_a_store_of_another_tokenizer_is_refused_before_the_weights_load(tmp_path, monkeypatch):
    """A store whose manifest names another tokenizer: refused after loading the tokenizer alone (model weights
    loading fails the test)."""
    from typer.testing import CliRunner

    from specdec_cli import api
    from specdec_cli.cli import app
    from specdec_cli.datastore import build_suffix_array_datastore

    out = tmp_path / "store"
    build_suffix_array_datastore([[1, 2, 3, 4]], out, fingerprint="0" * 64, vocab_size=49152, progress=False)
    monkeypatch.setattr(api, "load", lambda *a, **k: pytest.fail("model weights loaded before the store check"))
    for args in (["generate", "--datastore", str(out), "hi"],
                 ["bench", "--methods", "ar,rest,auto", "--datastore", f"rest={out}", "--datastore", f"auto={out}"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and "another tokenizer" in result.stderr, args


def test_inspect_entropy_arguments_come_before_torch():
    results, torch_imported = probe([["inspect-entropy", "-n", "0", "hi"], ["inspect-entropy", "--window", "0", "hi"]])
    assert [r["code"] for r in results] == [2, 2] and not torch_imported
