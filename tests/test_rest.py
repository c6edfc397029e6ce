"""``rest`` on the real SmolLM2-135M-Instruct: greedy output equals ``ar``; datastore checks; the CLI command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_cli import api
from specdec_cli.io.corpora import iter_documents, stdlib_files, tokenize_documents
from specdec_cli.datastore import SuffixArrayDatastore, build_suffix_array_datastore
from specdec_cli.errors import SpecdecError

pytestmark = pytest.mark.slow

SAMPLE = Path(__file__).resolve().parent.parent / "datastores" / "samples" / "ultrachat-sample.jsonl"
STDLIB_FILES = ("argparse.py", "os.py", "json/decoder.py", "textwrap.py", "shutil.py")
CODE_PROMPT = 'import argparse\n\n\ndef main():\n    parser = argparse.ArgumentParser(description="Copy files.")\n    parser.add_argument('
PROMPTS = [(CODE_PROMPT, True), ("Write a Python function that reads a JSON file and returns the parsed object.", False)]
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def stdlib_store(smollm2, tmp_path_factory) -> Path:
    """A small datastore of a few stdlib modules, tokenized with the target's tokenizer."""
    wanted = {f for f in stdlib_files() if any(str(f).endswith("/" + name) for name in STDLIB_FILES)}
    texts = [f.read_text(encoding="utf-8") for f in sorted(wanted)]
    assert len(texts) == len(STDLIB_FILES)
    out = tmp_path_factory.mktemp("rest") / "stdlib"
    docs = tokenize_documents(smollm2.tokenizer, texts, max_tokens=None)
    build_suffix_array_datastore(docs, out, fingerprint=smollm2.fingerprint,
                                 vocab_size=len(smollm2.tokenizer), progress=False)
    return out


def test_rest_greedy_matches_ar(smollm2, stdlib_store):
    drafter = api.make_drafter("rest", smollm2, datastore=str(stdlib_store), budget="paper")
    accepted = 0
    for text, raw in PROMPTS:
        ids = api.encode_prompt(smollm2, text, raw=raw, max_new_tokens=NEW_TOKENS)
        expected = api.run(smollm2, ids, api.make_drafter("ar", smollm2), max_new_tokens=NEW_TOKENS).tokens
        result = api.run(smollm2, ids, drafter, max_new_tokens=NEW_TOKENS)
        assert result.tokens == expected, text
        summary = result.summary()
        accepted += summary["accepted"]
        assert summary["accepted"] <= summary["drafted"]
        assert summary["retrieval_ms_p99"] >= summary["retrieval_ms_median"] > 0
        assert sum(summary["match_length_hist"].values()) == summary["target_forwards"]
    assert accepted > 0  # the code prompt continues argparse idioms found in the datastore


def test_rest_batched_matches_ar(smollm2, stdlib_store):
    """Three slots, one target forward per step: each prompt's output is still its own ar output."""
    cases = [api.encode_prompt(smollm2, text, raw=raw, max_new_tokens=NEW_TOKENS) for text, raw in PROMPTS]
    expected = [api.run(smollm2, ids, api.make_drafter("ar", smollm2), max_new_tokens=NEW_TOKENS).tokens
                for ids in cases]
    # --budget paper: every retrieved draft is verified, so "accepted > 0" does not hang on how this machine's
    # measured batch forward times price rest's drafts (under --budget auto a slow or loaded machine may gate them
    # all, which is a speed choice, not a correctness one; the losslessness of auto is asserted just below)
    for budget in ("paper", "auto"):
        settings = api.RunSettings(max_new_tokens=NEW_TOKENS, budget=budget)
        drafters = api.make_drafters("rest", smollm2, [], settings, batch_size=3, datastore=str(stdlib_store))
        results = api.run_batch(smollm2, cases, drafters, max_new_tokens=NEW_TOKENS)
        assert [r.tokens for r in results] == expected, budget
        if budget == "paper":
            assert sum(r.summary()["accepted"] for r in results) > 0


def test_rest_options_shape_the_tree(smollm2, stdlib_store):
    drafter = api.make_drafter("rest", smollm2, datastore=str(stdlib_store),
                               options={"top_c": "8", "cont_len": "3", "n_max": "4", "max_matches": "50"})
    ids = api.encode_prompt(smollm2, CODE_PROMPT, raw=True)
    draft = drafter.propose(ids, max_tokens=100)
    assert 0 < len(draft) <= 8 and all(p < i for i, p in enumerate(draft.parents))
    depth = {}
    for i, p in enumerate(draft.parents):
        depth[i] = 1 if p < 0 else depth[p] + 1
    assert max(depth.values()) <= 3
    assert len(drafter.propose(ids, max_tokens=1).tokens) <= 8  # depth capped by the budget
    assert all(p == -1 for p in drafter.propose(ids, max_tokens=1).parents)
    with pytest.raises(SpecdecError, match="top_c"):
        api.make_drafter("rest", smollm2, datastore=str(stdlib_store), options={"top_c": "0"})


def test_other_tokenizer_datastore_refused(smollm2, tmp_path):
    out = tmp_path / "other"
    build_suffix_array_datastore([[1, 2, 3]], out, fingerprint="0" * 32, vocab_size=100, progress=False,
                                 meta={"model": "some-other-model"})
    with pytest.raises(SpecdecError, match="another tokenizer"):
        api.make_drafter("rest", smollm2, datastore=str(out))


def test_truncated_datastore_refused(smollm2, stdlib_store, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(stdlib_store, copy)
    sa = copy / "shard-00000.sa.npy"
    sa.write_bytes(sa.read_bytes()[: sa.stat().st_size // 2])
    with pytest.raises(SpecdecError, match="shard-00000.sa.npy"):
        api.make_drafter("rest", smollm2, datastore=str(copy))
    with pytest.raises(SpecdecError, match="no such directory"):
        api.make_drafter("rest", smollm2, datastore=str(tmp_path / "nothing"))


ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


def specdec(*args):
    return subprocess.run([sys.executable, "-m", "specdec_cli.cli", *args], capture_output=True, text=True,
                          env=ENV, timeout=300)


def test_cli_builds_from_hub_format_jsonl_and_verifies(smollm2, tmp_path):
    out = tmp_path / "sample"
    proc = specdec("build-datastore", "--corpus", str(SAMPLE), "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])  # progress on stderr, the summary on stdout
    expected = sum(len(ids) for ids in tokenize_documents(smollm2.tokenizer, iter_documents(str(SAMPLE))))
    assert summary["tokens"] == expected and summary["documents"] == 12
    store = SuffixArrayDatastore.load(out, smollm2.fingerprint, verify=True)
    assert store.retrieve(smollm2.tokenizer("a list in Python")["input_ids"]).match_length >= 3
    proc = specdec("build-datastore", "--out", str(out), "--verify")
    assert proc.returncode == 0 and "ok" in proc.stderr


@pytest.mark.parametrize("args,needle", [
    (["--corpus", "ultrachat"], "could not stream corpus 'ultrachat'"),
    (["--corpus", "no-such-corpus"], "unknown corpus"),
    (["--corpus", "python-stdlib", "--kind", "bogus"], "unknown --kind"),
])
def test_cli_errors_are_one_line(tmp_path, args, needle):
    proc = specdec("build-datastore", *args, "--out", str(tmp_path / "x"), "--quiet")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr
    assert not (tmp_path / "x").exists()
