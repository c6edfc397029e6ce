"""The float32 formulations of ``x @ W.T`` that :mod:`specdec_cli.runtime.kernels`' plans choose from, per row
count (that module's docstring says when each wins): the product itself and what each keeps beside the weight."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .dot import dot_rows_threads
from .jit import COMPILED
from .tiles import F32

STRATEGIES = ("nt", "tn", "wt", "mkldnn") + (("dot",) if COMPILED else ())  # "dot" where numba compiles it only
PACKED = ("wt", "mkldnn", "dot")  # strategies that keep something beside the weight (only "wt"/"mkldnn" copy it)
COPIES = ("wt", "mkldnn")


def dot(x2: torch.Tensor, w_np, fmt: int = F32) -> torch.Tensor:
    y = np.empty((x2.shape[0], w_np.shape[0]), np.float32)  # in numpy: ~200 calls a step, ~2 us less each than torch's
    dot_rows_threads(x2.detach().numpy(), w_np, y, torch.get_num_threads(), fmt)  # outputs over threads: same bits
    return torch.from_numpy(y)


def apply(strategy: str, x2: torch.Tensor, weight: torch.Tensor, packed: dict) -> torch.Tensor:
    """``x2 @ weight.T`` by ``strategy`` (``x2``: contiguous ``[n, in]``)."""
    if strategy in ("dot", "blocks"):  # "blocks": (the GGUF blocks, their tiles format), runtime/blocks.py
        return dot(x2, packed["dot"]) if strategy == "dot" else dot(x2, *packed["blocks"])
    if strategy == "tn":
        return (weight @ x2.t()).t()
    if strategy == "wt":
        return x2 @ packed["wt"]
    if strategy == "mkldnn":
        return mkldnn(x2, packed["mkldnn"])
    return F.linear(x2, weight)


# oneDNN's product on a dense input, the weight packed for it once (what inductor emits): the same bits as
# ``mkldnn_linear`` on an oneDNN copy of the input for 2 rows and more (not 1: oneDNN takes another kernel there; the
# plans of docs/profiling.md pick ``mkldnn`` from 17 rows on), 10-15% less time on a prefill's products (the two
# conversions per product are gone); where the op is missing, the inner product on converted rows
_POINTWISE = hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def mkldnn(x2: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    if _POINTWISE:
        return torch.ops.mkldnn._linear_pointwise(x2, packed, None, "none", [], "")
    return torch._C._nn.mkldnn_linear(x2.to_mkldnn(), packed, None).to_dense()


def pack(strategy: str, weight: torch.Tensor):
    if strategy == "dot":  # a numpy view of the weight itself (no copy)
        return weight.detach().contiguous().numpy()
    if strategy == "wt":
        return weight.detach().t().contiguous()
    if strategy == "mkldnn":
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach()) if _POINTWISE else weight.detach().to_mkldnn()
    return None
