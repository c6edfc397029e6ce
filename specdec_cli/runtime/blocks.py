"""GGUF weights read as stored (``--kernels blocks``, issue 35): the linear layers of a target loaded from a GGUF
file keep the file's quantized blocks beside their de-quantized float32 weights, and decoding steps read the
blocks, widening them to float32 in registers (:mod:`specdec_cli.runtime.tiles`: ``Q4_1``, ``Q5_0``, ``Q8_0``, and
the k-quants ``Q4_K``, ``Q6_K``).

The blocks are copied into one arena of 2 MB pages (:mod:`specdec_cli.runtime.hugepages`: Gemma-3's one-row blocks
step 31.3 -> 26.3 ms). Where they cannot move (no transparent huge pages, little memory), those of layers the
converter did not permute stay a read-only mapping of the GGUF file: a file rewritten in place under a running
process then changes what it reads.

**The same weights, bit for bit.** A block is de-quantized in registers by the float operations of gguf's
reference (``d * q + m``, ``q * d`` in float32), so every weight equals the float32 one transformers converted from
the file, and the tiles sum the products in the order of the ``dot`` strategy: a product read from the blocks has
the bits ``dot`` gives on the float32 weights. Each layer's blocks are checked against its float32 weight when they
are attached; a layer whose blocks do not give its weight bit for bit keeps the float32 path.

**Compiled layers.** A blocks model's decoding and verification forwards run :mod:`specdec_cli.runtime.fused`'s two
compiled calls per layer, as a 16-bit model's do: its one-row step was ~45% per-call overhead and small tensor
operations around 8.8 ms of products (SmolLM2). Their norms, activation and attention round in their own fixed
order, so a verified row has the bits of a one-row forward (every method lossless against ``ar``), and the output
equals the float32 tensor path's on most prompts, not by construction (``scripts/dtype_agreement.py --dtypes
blocks``). A prefill runs the float32 tensor path. The compiled layers run on one thread whatever ``--threads``
says: at one row that is still faster than the tensor path's products split over two threads (SmolLM2: 10.9 ms
against ~14 ms a step); a batch (``--batch-size``) keeps the tensor path and its threads.

Why: a decoding step is memory-bound and the float32 copy is 4 bytes a weight; SmolLM2's file stores its linear
layers in ``Q4_1`` (0.625 bytes a weight) and its tied embedding in ``Q8_0`` (1.06); Gemma-3's its head and
``attn_v`` in ``Q8_0``, ``attn_output`` and ``ffn_down`` in ``Q4_K``/``Q6_K`` (0.56/0.82: their 1024 and 2048
inputs hold whole 256-weight super-blocks), the others in ``Q5_0`` (0.69).
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import SpecdecError

from . import hugepages
from .ggml_blocks import GGUF_NAMES, STORED, dequantize

FORMATS = {name: fmt for fmt, name in GGUF_NAMES.items()}  # GGUF tensor type -> tiles format
ATTR = "_specdec_gguf_blocks"  # set on an nn.Linear: (format, blocks [out, in // STORED * block bytes] uint8)
# GGUF's per-layer tensor names (llama.cpp's converter) -> the transformers module of a Llama or Gemma-3 layer
LAYER_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj"}


def _linear_of(model, gguf_name: str):
    """The ``nn.Linear`` that GGUF tensor ``gguf_name`` is the weight of (None: none here)."""
    parts = gguf_name.split(".")
    if gguf_name in ("output.weight", "token_embd.weight"):  # the head (its own, or tied to the embedding)
        head = model.get_output_embeddings()
        tied = head is not None and head.weight is model.get_input_embeddings().weight
        return head if gguf_name == "output.weight" or tied else None
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in LAYER_NAMES and parts[3] == "weight":
        try:
            return model.get_submodule(f"model.layers.{int(parts[1])}.{LAYER_NAMES[parts[2]]}")
        except (AttributeError, ValueError):
            return None
    return None


def _rows(gguf_name: str, n_out: int, config) -> np.ndarray | None:
    """The order of the file's rows in the model: llama.cpp's converter permutes a Llama's q and k rows for its
    rotary layout, and transformers permutes them back when it loads the file (its ``_reverse_permute_weights``)."""
    if config.model_type != "llama" or not (".attn_q." in gguf_name or ".attn_k." in gguf_name):
        return None
    heads = config.num_attention_heads if ".attn_q." in gguf_name else config.num_key_value_heads
    if not heads or n_out % (2 * heads):
        return None  # not a layout the converter permutes: the bit check then keeps the float32 path
    return np.arange(n_out).reshape(heads, n_out // heads // 2, 2).swapaxes(2, 1).reshape(n_out)


CHECK_ROWS = 4096  # rows de-quantized at a time by the check (Gemma-3's 262,144-row head: 10 MB, not 671 MB)


def same_weights(blocks: np.ndarray, fmt: int, weight: np.ndarray) -> bool:
    """Whether gguf's de-quantization of ``blocks`` (tiles format ``fmt``) is ``weight``, bit for bit."""
    if blocks.shape[0] != weight.shape[0]:
        return False
    for at in range(0, weight.shape[0], CHECK_ROWS):
        part, mine = dequantize(blocks[at: at + CHECK_ROWS], fmt), weight[at: at + CHECK_ROWS]
        if part.shape != mine.shape or not np.array_equal(part.view(np.uint32), mine.view(np.uint32)):
            return False  # compared as bits: -0.0 is not 0.0
    return True


def attach(model, gguf_path) -> dict:
    """Read ``gguf_path``'s blocks into the float32 linear layers of ``model`` (converted from that file) whose
    weights they give bit for bit. Returns a summary: layers with blocks, per format, and the bytes a step reads
    from them against their float32 weights."""
    from ..io.gguf_tensors import tensors as read_tensors

    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    summary = {"layers": 0, "formats": {}, "block_bytes": 0, "float32_bytes": 0, "mismatched": []}
    found = []
    try:
        tensors = read_tensors(gguf_path)  # the tensors alone (gguf's reader parses the vocabulary first: ~7 s)
    except (OSError, ValueError, KeyError, IndexError) as err:  # a damaged or truncated file
        raise SpecdecError(f"--kernels blocks: cannot read {gguf_path}: {err}") from None
    for tensor in tensors:
        fmt = FORMATS.get(tensor.type_name)
        layer = _linear_of(model, tensor.name) if fmt is not None else None
        if layer is None:
            continue
        if layer.weight.dtype != torch.float32 or layer.weight.device.type != "cpu":  # a 16-bit or GPU model
            summary["mismatched"].append(tensor.name)
            continue
        blocks = np.asarray(tensor.data, dtype=np.uint8)
        blocks = blocks.reshape(blocks.shape[0], -1)
        order = _rows(tensor.name, blocks.shape[0], cfg)
        blocks = np.ascontiguousarray(blocks if order is None else blocks[order])
        weight = layer.weight.detach().numpy()
        if weight.shape[1] % STORED[fmt] or not same_weights(blocks, fmt, weight):
            summary["mismatched"].append(tensor.name)
            continue
        found.append((layer, fmt, blocks))
        summary["layers"] += 1
        summary["formats"][tensor.type_name] = summary["formats"].get(tensor.type_name, 0) + 1
        summary["block_bytes"] += blocks.nbytes
        summary["float32_bytes"] += weight.nbytes
    packed = hugepages.pack([b for _, _, b in found])  # read as the float32 weights are: from 2 MB pages
    for (layer, fmt, _), b in zip(found, packed):
        setattr(layer, ATTR, (fmt, b))
    return summary


TALL_ROWS = 32  # rows up to which a product reads the blocks with the tall tiles of AVX-512 (tiles.TALL: a block
# de-quantized once per 8 rows). One thread, Intel Xeon VM, the step's products in ms, blocks / the float32 plan:
# SmolLM2 16 rows 42 / 86, 32: 83 / 113, 64: 157 / 127; Gemma-3 16: 99 / 164, 32: 196 / 256, 64: 384 / 357
# (docs/profiling.md, "The k-quants, output pairs and tall tiles")
SHORT_ROWS = 8  # ... and without them (AVX2), blocks 1.87x the float32 plan at 1 row, 1.21x at 8, 0.97x at 12 (SmolLM2)


def block_rows() -> int:
    """Rows up to which a product reads the blocks: above, the float32 plan's compute-bound kernels win."""
    from . import tiles

    return TALL_ROWS if getattr(tiles, "TALL", False) else SHORT_ROWS


def adopt(linear, table: list[str]) -> tuple[dict, list[str]]:
    """What a :class:`~specdec_cli.runtime.kernels.FastLinear` keeps for ``linear``'s blocks (``{"blocks": (blocks,
    tiles format)}``; nothing without them) and its strategy per row count: ``blocks`` from 1 to
    :func:`block_rows` rows, the float32 plan's above."""
    found = getattr(linear, ATTR, None)
    if found is None:
        return {}, table
    assert found[0] in FORMATS.values() and linear.in_features % STORED[found[0]] == 0, "blocks the tiles read"
    rows = block_rows()
    return {"blocks": found[::-1]}, ["blocks" if 1 <= n <= rows else s for n, s in enumerate(table)]


def attached(model) -> bool:
    """Whether a linear layer of ``model`` reads GGUF blocks (``--kernels blocks``, after the kernels' install)."""
    return any("blocks" in getattr(m, "_packed", ()) for m in model.modules())
