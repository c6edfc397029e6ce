"""llama.cpp as a bench baseline (issue 35): typed GGUFs of the model's own file, the methods' names and errors,
and -- where llama-cpp-python is installed (scripts/install-llama-cpp.sh) -- its plain decoding in a bench run."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from specdec_cli.bench import llama_cpp
from specdec_cli.errors import SpecdecError

HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None


def tiny_gguf(path):
    """A GGUF with a little metadata, one Q8_0 matrix and one F32 vector."""
    from gguf import GGMLQuantizationType as Q, GGUFWriter, quantize

    writer = GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_token_list(["<a>", "<b>", "<c>"])
    writer.add_file_type(7)  # MOSTLY_Q8_0
    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((4, 64)).astype(np.float32)
    writer.add_tensor("blk.0.ffn_up.weight", quantize(matrix, Q.Q8_0), raw_dtype=Q.Q8_0)
    writer.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(64).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("kind,stored", [("f32", "F32"), ("f16", "F16"), ("bf16", "BF16")])
def test_a_typed_gguf_is_the_stored_one_dequantized(tmp_path, kind, stored):
    from gguf import GGUFReader, dequantize

    tiny_gguf(tmp_path / "q8.gguf")
    llama_cpp.retype(tmp_path / "q8.gguf", tmp_path / "typed.gguf", kind)
    src, out = GGUFReader(tmp_path / "q8.gguf"), GGUFReader(tmp_path / "typed.gguf")
    assert out.fields["tokenizer.ggml.tokens"].contents() == ["<a>", "<b>", "<c>"]
    types = {t.name: t.tensor_type.name for t in out.tensors}
    assert types == {"blk.0.ffn_up.weight": stored, "blk.0.attn_norm.weight": "F32"}  # norms stay F32
    want = dequantize(src.tensors[0].data, src.tensors[0].tensor_type)
    got = dequantize(out.tensors[0].data, out.tensors[0].tensor_type)
    tolerance = {"f32": 0, "f16": 1e-3, "bf16": 1e-2}[kind]  # the type's rounding of the Q8_0 values
    assert np.allclose(got, want, rtol=tolerance, atol=tolerance)


def test_method_names_and_types():
    from specdec_cli.bench.labels import method_list

    assert method_list(["auto", "llama-cpp", "llama-cpp-f16"]) == ["ar", "auto", "llama-cpp", "llama-cpp-f16"]
    assert [llama_cpp.gguf_type("llama-cpp", d) for d in ("float32", "bfloat16", "float16", "auto")] == \
        ["f32", "bf16", "f16", "f32"]
    assert llama_cpp.gguf_type("llama-cpp-stored", "bfloat16") == "stored"


def test_without_llama_cpp_python_the_methods_say_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails
    with pytest.raises(SpecdecError, match="install-llama-cpp.sh"):
        llama_cpp.check_installed()


def test_throughput_mode_refuses_llama_cpp():
    from specdec_cli.bench.throughput import check_methods

    with pytest.raises(SpecdecError, match="llama-cpp"):
        check_methods(["ar", "llama-cpp"])


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama-cpp-python not installed (scripts/install-llama-cpp.sh)")
def test_llama_cpp_decodes_the_same_prompts_in_the_same_run(smollm2, tmp_path, monkeypatch):
    """llama.cpp on an F32 GGUF of SmolLM2's own file beside ar: the same prompt ids, timed the same way (its
    decode rate reported), its outputs checked against ar's (the issue measured them identical)."""
    from specdec_cli.bench import BenchConfig, benchmark
    from specdec_cli.config import RunSettings

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    cfg = BenchConfig(methods=["ar", "llama-cpp"], prompts="humaneval", limit=2, warmup=False,
                      settings=RunSettings(16, threads=1), dtype="float32")
    record = benchmark(cfg, smollm2, [])
    row = next(r for r in record["results"] if r["method"] == "llama-cpp")
    assert row["generations"] == 2 and row["new_tokens"] > 0 and row["decode_tokens_per_s"] > 0
    assert row["identical"] >= 1  # the same model: a tokenizer or weight mix-up would differ at once
    assert record["peak_rss_mib"] > 0


@pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama-cpp-python not installed (scripts/install-llama-cpp.sh)")
def test_amx_buffers_are_off_only_while_a_model_loads(monkeypatch):
    """Where the CPU has AMX, ggml's extra buffer types are off while llama.cpp loads a model (its AMX path
    crashed the process on the first decode of a quantized file on this project's Xeon VMs), and back after."""
    import llama_cpp.llama as module

    before = module.llama_cpp.llama_model_default_params
    monkeypatch.setattr(llama_cpp, "has_amx", lambda: True)
    with llama_cpp.no_amx_buffers():
        assert module.llama_cpp.llama_model_default_params().use_extra_bufts is False
    assert module.llama_cpp.llama_model_default_params is before and before().use_extra_bufts
    monkeypatch.setattr(llama_cpp, "has_amx", lambda: False)
    with llama_cpp.no_amx_buffers():
        assert module.llama_cpp.llama_model_default_params is before


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama-cpp-python not installed (scripts/install-llama-cpp.sh)")
def test_llama_cpp_decodes_the_shipped_quantized_file(tmp_path):
    """``llama-cpp-stored`` (SmolLM2's shipped Q4_1 file) in a bench run of its own process: a crash inside
    llama.cpp would end the process, so it runs apart from pytest's."""
    import subprocess

    out = tmp_path / "stored.jsonl"
    done = subprocess.run([sys.executable, "-m", "specdec_cli.cli", "bench", "--model", "smollm2-135m", "--prompts",
                           "humaneval", "--limit", "1", "-n", "8", "--threads", "1", "--no-warmup", "--methods",
                           "ar,llama-cpp-stored", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"llama-cpp-stored"' in out.read_text()
