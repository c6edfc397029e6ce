"""llama.cpp (llama-cpp-python, the extra: ``bash scripts/install-llama-cpp.sh``) as a ``bench`` baseline: its
plain decoding of a GGUF of the run's model, in the same run and on the same prompt ids as specdec's methods.

Methods (the ``llama-cpp*`` entries of :data:`specdec_cli.bench.baselines.BASELINES`): ``llama-cpp`` reads the weights at the run's ``--dtype``
(float32 -> F32, bfloat16 -> BF16, float16 -> F16: the same weights specdec computes with); ``llama-cpp-f32``,
``-f16``, ``-bf16`` name the type; ``llama-cpp-stored`` reads the GGUF file as it ships (quantized: llama.cpp then
computes with 8-bit activations, so it is not the same model). The typed files are written once from the file
the model came from (the alias's GGUF: every tensor de-quantized by ``gguf`` as transformers de-quantizes it, the
1-D norms kept in F32 as llama.cpp's converter keeps them; a transformers directory: llama.cpp's own
``convert_hf_to_gguf.py``, kept by the install script) and cached under ``$SPECDEC_CACHE/llama-cpp/gguf``.

Timing as the other runners: the whole generation, prompt evaluation included (llama.cpp's cache is reset before
each prompt, so no prompt finds its prefix evaluated); ``prefill_s`` is the time to the first token, so
``decode_tokens_per_s`` compares decoding alone. Greedy is llama.cpp's greedy sampler; sampled runs use the
run's temperature with no other warper.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from ..engine.loop import cut_at_stop
from ..errors import SpecdecError
from ..io.atomic import new_build_dir, replace_dir
from ..io.models import cache_root
from ..runtime.machine import cpu_flags
from .config import Generation, Runner

VERSION = "0.3.36"  # the llama-cpp-python release scripts/install-llama-cpp.sh installs
TYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "auto": "f32"}  # --dtype -> GGUF type
CONTEXT = 4096  # llama.cpp's KV cache, in tokens: the longest prompt set (long-edit, <= 620) plus -n, with room


def check_installed() -> None:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise SpecdecError("the llama-cpp methods need llama-cpp-python: bash scripts/install-llama-cpp.sh "
                           "(builds llama.cpp, 10-20 minutes)") from None


def gguf_type(name: str, dtype: str) -> str:
    """``f32``/``f16``/``bf16``, or ``stored`` (the file as shipped), for method ``name`` in a run at ``dtype``."""
    return TYPES.get(dtype, "f32") if name == "llama-cpp" else name.rsplit("-", 1)[1]


def origin(target) -> tuple[Path, bool]:
    """The file the model came from: (the GGUF, True) or (the transformers directory, False)."""
    source = Path(target.info.get("source", ""))
    marker = source / "specdec-converted.json"
    if marker.exists():
        return Path(json.loads(marker.read_text())["gguf"]), True
    if source.is_dir():
        return source, False
    raise SpecdecError(f"llama-cpp: {target.name!r} is neither a GGUF nor a local transformers directory")


def gguf_for(target, kind: str, progress=None) -> Path:
    """A GGUF of ``target`` with its weights as ``kind`` (or the stored file), written once and cached."""
    src, is_gguf = origin(target)
    if kind == "stored":
        if not is_gguf:
            raise SpecdecError("llama-cpp-stored needs a model that came from a GGUF file")
        return src
    st = src.stat()
    key = hashlib.sha256(f"{src.resolve()}|{st.st_size}|{int(st.st_mtime)}|{kind}".encode()).hexdigest()[:16]
    out = cache_root() / "llama-cpp" / "gguf" / f"{src.stem}-{kind}-{key}"
    path = out / "model.gguf"
    if path.exists():
        return path
    if progress:
        progress(f"writing a {kind.upper()} GGUF of {src.name} for llama.cpp (once) ...")
    tmp = new_build_dir(out)
    try:
        (retype if is_gguf else convert_hf)(src, tmp / "model.gguf", kind)
        replace_dir(tmp, out)
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return path


def retype(src: Path, dst: Path, kind: str) -> None:
    """``src``'s metadata and tensors, every 2-D tensor de-quantized to float32 and stored as ``kind``."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q, GGUFReader, GGUFWriter, LlamaFileType, dequantize, quantize

    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch)
    file_type = {"f32": LlamaFileType.ALL_F32, "f16": LlamaFileType.MOSTLY_F16, "bf16": LlamaFileType.MOSTLY_BF16}
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = file_type[kind] if name == "general.file_type" else field.contents()
        writer.add_key_value(name, value, field.types[0], field.types[-1] if len(field.types) > 1 else None)
    for t in reader.tensors:
        data = dequantize(t.data, t.tensor_type).astype(np.float32)
        if data.ndim < 2 or kind == "f32":
            writer.add_tensor(t.name, data)
        elif kind == "f16":
            writer.add_tensor(t.name, data.astype(np.float16))
        else:
            writer.add_tensor(t.name, quantize(data, Q.BF16), raw_dtype=Q.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def convert_hf(src: Path, dst: Path, kind: str) -> None:
    """llama.cpp's own converter (kept by scripts/install-llama-cpp.sh) on a transformers directory."""
    script = cache_root() / "llama-cpp" / VERSION / "convert_hf_to_gguf.py"
    if not script.exists():
        raise SpecdecError(f"llama-cpp: {script} is missing; run bash scripts/install-llama-cpp.sh")
    proc = subprocess.run([sys.executable, str(script), str(src), "--outtype", kind, "--outfile", str(dst)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SpecdecError(f"llama-cpp: converting {src} failed: {last}")


def note(text: str) -> None:
    """Progress of the one-time GGUF conversion, on stderr as bench's other notes."""
    print(f"bench: {text}", file=sys.stderr, flush=True)


def has_amx() -> bool:
    """Whether this CPU reports AMX (Linux's flags): ggml then moves quantized weights into its AMX buffers."""
    return "amx_int8" in cpu_flags()


@contextmanager
def no_amx_buffers():
    """While a model loads: ggml's extra buffer types off where the CPU has AMX. Why: on the Intel Xeon VMs this
    project measures on, llama.cpp's AMX path (taken for quantized files: ``llama-cpp-stored``) crashes the process
    with a segmentation fault at its first decode (ggml's AMX buffers on virtualized AMX CPUs: llama.cpp issue
    20824, pull request 26954); without them it decodes the same file by its AVX-512 kernels. F32/F16/BF16 files
    never use those buffers. llama-cpp-python 0.3.36 does not pass ``use_extra_bufts`` through ``Llama``."""
    import llama_cpp.llama as module

    low = module.llama_cpp
    default = low.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    if has_amx():
        low.llama_model_default_params = params
    try:
        yield
    finally:
        low.llama_model_default_params = default


def llama_cpp_runner(name: str, target, drafts, cfg, progress=None) -> Runner:
    """A runner decoding with llama.cpp (one model per method, loaded now); ``drafts`` unused (no drafting)."""
    check_installed()
    from llama_cpp import Llama

    import torch

    threads = cfg.settings.threads or torch.get_num_threads()
    path = gguf_for(target, gguf_type(name, cfg.dtype), progress or note)
    with no_amx_buffers():
        llm = Llama(model_path=str(path), n_ctx=CONTEXT, n_threads=threads, n_threads_batch=threads,
                    seed=cfg.settings.seed, verbose=False)
    stop = target.stop_ids
    temperature = cfg.settings.sampling.temperature
    sampling = dict(temp=0.0) if cfg.greedy else dict(temp=temperature, top_k=0, top_p=1.0, min_p=0.0)

    def run(ids: list[int], max_new_tokens: int) -> Generation:
        produced: list[int] = []
        first = None
        llm.reset()  # no prefix of this prompt is reused: the prompt is evaluated inside the timing
        t0 = time.perf_counter()
        for token in llm.generate(ids, reset=True, repeat_penalty=1.0, **sampling):
            first = first or time.perf_counter() - t0
            produced.append(int(token))
            if token in stop or len(produced) >= max_new_tokens:
                break
        seconds = time.perf_counter() - t0
        return Generation(name, "", 0, cut_at_stop(produced, stop), seconds, forwards=len(produced),
                          emitted=len(produced), prefill_s=first)

    run.state = lambda: None  # llama.cpp learns nothing across prompts
    run.load_state = lambda state: None
    return run
