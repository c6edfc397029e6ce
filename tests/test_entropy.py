"""inspect-entropy: the library collection on a tiny random model, and the CLI end to end on SmolLM2."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from specdec_cli.bench.entropy import collect_entropies, describe, entropy_report, plot_histogram
from specdec_cli.io.models import LoadedModel

from conftest import tiny_llama


class TinyLoaded(LoadedModel):
    @property
    def stop_ids(self):
        return frozenset()


def test_describe_quartiles():
    d = describe([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (d["count"], d["mean"], d["median"], d["q1"], d["q3"]) == (5, 3.0, 3.0, 2.0, 4.0)
    assert describe([])["mean"] is None and describe([2.0])["q3"] == 2.0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_collect_entropies_on_tiny_model(tmp_path, temperature):
    from specdec_cli.engine.sampling import SamplingConfig

    target = TinyLoaded(tiny_llama(seed=0), None, "tiny", False)
    draft = TinyLoaded(tiny_llama(seed=1), None, "tiny-draft", False)
    sample = collect_entropies(target, draft, [[1, 2, 3], [4, 5]], window=4, max_new_tokens=24,
                               sampling=SamplingConfig(temperature))
    judged = len(sample.accepted) + len(sample.rejected)
    assert judged > 0 and sample.rejected  # a different random draft gets rejected sometimes
    assert all(0.0 <= h <= torch.log(torch.tensor(8.0)).item() + 1e-5 for h in sample.accepted + sample.rejected)
    report = entropy_report(sample)
    assert report["learned_tau"] == pytest.approx(sum(sample.rejected) / len(sample.rejected))
    assert len(report["learned_tau_per_prompt"]) == 2
    png = tmp_path / "h.png"
    plot_histogram(sample, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_without_prompts_is_a_one_line_error():
    from specdec_cli.cli import app

    result = CliRunner().invoke(app, ["inspect-entropy"])
    assert result.exit_code == 2
    assert "no prompts" in result.output


@pytest.mark.slow
def test_cli_end_to_end_writes_png_and_json(tmp_path):
    from specdec_cli.cli import app

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Write a haiku about caches.\n\n")
    png = tmp_path / "entropy.png"
    args = ["inspect-entropy", "Name three primes.", "--prompts-file", str(prompts), "--stdin", "--draft", "bf16:",
            "--max-new-tokens", "12", "--window", "3", "--dtype", "float32", "--device", "cpu", "--threads", "1",
            "--plot", str(png), "--json"]
    threads = torch.get_num_threads()
    try:
        result = CliRunner().invoke(app, args, input="Say hello.\n")
    finally:
        torch.set_num_threads(threads)  # the command ran in-process: do not leak --threads 1 to later tests
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["prompts"] == 3 and report["window"] == 3
    assert report["accepted"]["count"] + report["rejected"]["count"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
