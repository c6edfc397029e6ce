"""Bad input gives one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


def specdec(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "specdec_cli.cli", *args], input=stdin, capture_output=True,
                          text=True, env=ENV, timeout=300)


def assert_one_line_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_unknown_model():
    assert_one_line_error(specdec("generate", "hi", "--model", "no-such-model"), "unknown model")


def test_unknown_hub_model_offline():
    assert_one_line_error(specdec("generate", "hi", "--model", "nobody/nothing-here"), "could not load model")


def test_missing_local_path():
    assert_one_line_error(specdec("generate", "hi", "--model", "./does/not/exist"), "unknown model")


def test_unknown_method():
    assert_one_line_error(specdec("generate", "hi", "--method", "warp-drive"), "unknown method")


def test_bad_option_values():
    assert_one_line_error(specdec("generate", "hi", "--temperature", "-1"), "--temperature")
    assert_one_line_error(specdec("generate", "hi", "--opt", "novalue"), "--opt")


@pytest.mark.slow
def test_empty_prompt():
    assert_one_line_error(specdec("generate", "   "), "empty prompt")


@pytest.mark.slow
def test_prompt_longer_than_context():
    assert_one_line_error(specdec("generate", "word " * 9000, "--raw"), "too long")


@pytest.mark.slow
def test_sd_needs_a_draft():
    assert_one_line_error(specdec("generate", "hi", "--method", "sd"), "draft")


@pytest.mark.slow
def test_draft_of_another_tokenizer_is_accepted(tmp_path, smollm2):
    """A draft with another tokenizer (one extra token) drafts through the token bridge: the output is ar's."""
    import json

    from transformers import LlamaConfig, LlamaForCausalLM

    tok = smollm2.tokenizer
    tok_dir = tmp_path / "other-vocab"
    other = type(tok).from_pretrained(smollm2.info["source"])
    other.add_tokens(["<specdec-extra-token>"])
    cfg = LlamaConfig(vocab_size=len(other), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
    LlamaForCausalLM(cfg).save_pretrained(tok_dir)
    other.save_pretrained(tok_dir)
    runs = [specdec("generate", "hi", "--json", "-n", "8", *args) for args in
            (["--method", "ar"], ["--method", "sd", "--draft", str(tok_dir), "--budget", "paper"])]
    assert all(proc.returncode == 0 for proc in runs), [proc.stderr for proc in runs]
    ar, sd = (json.loads(proc.stdout)["tokens"] for proc in runs)
    assert sd == ar and json.loads(runs[1].stdout)["drafted"] > 0


@pytest.mark.slow
def test_generate_json_and_stdin_batch(tmp_path):
    proc = specdec("generate", "--batch-file", "-", "--json", "-n", "8", "--method", "sd", "--draft", "int8:",
                   stdin="Say hello.\n\nName a colour.\n")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["index"] for r in records] == [0, 1]
    for r in records:
        assert r["new_tokens"] == len(r["tokens"]) <= 8
        assert {"text", "target_forwards", "mean_accepted_length", "draft_s", "verify_s"} <= r.keys()


@pytest.mark.slow
def test_generate_streams_text_from_stdin():
    proc = specdec("generate", "-n", "6", stdin="What is 2+2?")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_dtype_and_kernels_checked_before_anything_loads(command):
    """--dtype and --kernels are refused before the model is even looked up (the unknown model would be the
    error otherwise) and before torch is imported."""
    extra = ["hi"] if command == "generate" else []
    assert_one_line_error(specdec(command, *extra, "--model", "no-such-model", "--kernels", "fast"), "--kernels",
                          "auto, exact, blocks or torch")
    assert_one_line_error(specdec(command, *extra, "--model", "no-such-model", "--dtype", "int4"), "--dtype",
                          "bfloat16")


def test_dtype_names_match_the_loaders():
    from specdec_cli.config import DTYPE_NAMES
    from specdec_cli.io.models import DTYPES

    assert tuple(DTYPES) == tuple(DTYPE_NAMES)
