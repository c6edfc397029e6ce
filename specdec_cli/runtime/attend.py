"""Attention of a wide 16-bit model's compared forwards (decoding, verification), with a row's result
independent of the rows computed beside it.

Why (issue 35): speculative decoding is lossless when each verified row's logits are those a one-row forward
gives. The linear layers' kernels guarantee it (:mod:`specdec_cli.runtime.dot16`); PyTorch's
``scaled_dot_product_attention`` does not (its CPU kernels block the query rows, so one row's softmax and sums
change in the last bits with the number of rows: measured up to 6e-7 on float32 heads of 64-256). Here each query
row is computed alone, in one order fixed by the keys it sees:

* the columns its mask shows, in cache order (a one-row forward sees the same keys in the same order: its
  ancestors in a tree are exactly the entries a chain would have cached before it);
* scores ``q . k`` by :mod:`~specdec_cli.runtime.dot16`'s fixed-order float32 dot products (the query heads that
  share a key head in one block: the same bits as one at a time), times the scale;
* ``exp(s - max)`` by a fixed polynomial (:func:`_exp`: the same float operations in a vectorised loop body and its
  scalar remainder, unlike a vector math library), summed in column order;
* the values weighted in column order, then divided by that sum.

It is what SDPA computes up to rounding; only the engine's forwards whose logits are read use it (a prefill,
``keep=0``, keeps SDPA).
"""

from __future__ import annotations

import numpy as np
import torch

from .jit import COMPILED, njit

LOG2E = np.float32(1.4426950408889634)  # exp(x) = 2**(x * log2(e))
LN2_HI, LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)  # ln 2 in two parts: exact n * LN2_HI
# error_model="numpy" below: no zero-division checks (runtime/fused.py); a softmax's sum is at least 1
UNDERFLOW = np.float32(-87.0)  # exp below this is under float32's smallest normal: taken as 0
# Cephes' expf polynomial on [-ln2/2, ln2/2] (relative error < 2e-7)
P0, P1, P2 = np.float32(1.9875691500e-4), np.float32(1.3981999507e-3), np.float32(8.3334519073e-3)
P3, P4, P5 = np.float32(4.1665795894e-2), np.float32(1.6666665459e-1), np.float32(5.0000001201e-1)

if COMPILED:  # pragma: no branch
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    from .dot16 import LANES, f32_1, f32_2, f32_4

    @intrinsic
    def _float_bits(typingctx, bits):
        """The float32 whose bits are the int32 ``bits``."""
        return types.float32(types.int32), lambda ctx, builder, sig, args: builder.bitcast(args[0], ir.FloatType())
else:  # pragma: no cover
    LANES = 32


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _exp(x):  # pragma: no cover - compiled
    """``exp(x)`` for float32 ``x <= 0`` (softmax's shifted scores), in the same operations wherever it runs."""
    if x < UNDERFLOW:
        return np.float32(0.0)
    n = np.floor(x * LOG2E + np.float32(0.5))
    r = x - n * LN2_HI - n * LN2_LO
    p = ((((P0 * r + P1) * r + P2) * r + P3) * r + P4) * r + P5
    p = p * r * r + r + np.float32(1.0)
    return p * _float_bits(np.int32((np.int32(n) + 127) << 23))


@njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def _scores(q, k, r, g, h0, groups, cols, m, out):  # pragma: no cover - compiled
    """``out[h0 + i, c] = q[r, h0 + i] . k[g, cols[c]]`` for the ``groups`` query heads of key head ``g``."""
    d = q.shape[2]
    chunks, mcap = d // LANES, out.shape[1]
    qa, ka, oa = q.ctypes.data, k.ctypes.data, out.ctypes.data
    for c in range(m):
        key = ka + (g * k.shape[1] + cols[c]) * d * 4
        h = h0
        while h < h0 + groups:
            at, dst = qa + ((r * q.shape[1] + h) * d) * 4, oa + (h * mcap + c) * 4
            if h + 4 <= h0 + groups:
                f32_4(at, d, key, chunks, dst, mcap)
                h += 4
            elif h + 2 <= h0 + groups:
                f32_2(at, d, key, chunks, dst, mcap)
                h += 2
            else:
                f32_1(at, d, key, chunks, dst, mcap)
                h += 1
        for h in range(h0, h0 + groups):
            s = out[h, c]
            for j in range(chunks * LANES, d):  # the leftover products, one by one
                s = s + q[r, h, j] * k[g, cols[c], j]
            out[h, c] = s


@njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def attend(q, k, v, start, stop, visible, scale, out):  # pragma: no cover - compiled
    """``out [n, H, D]`` = attention of ``q [n, H, D]`` over columns ``[start, stop)`` of the layer's buffers
    ``k``, ``v`` ``[KVH, capacity, D]``; ``visible [n, stop - start]`` (bool) says which columns each row sees
    (shape ``(0, 0)``: all of them)."""
    n, heads, d = q.shape
    groups = heads // k.shape[0]
    cols = np.empty(stop - start, np.int64)
    scores = np.empty((heads, stop - start), np.float32)
    total = np.empty(heads, np.float32)
    acc = np.empty((heads, d), np.float32)
    for r in range(n):
        m = 0
        for c in range(stop - start):
            if visible.shape[0] == 0 or visible[r, c]:
                cols[m] = start + c
                m += 1
        for g in range(k.shape[0]):
            h0 = g * groups
            _scores(q, k, r, g, h0, groups, cols, m, scores)
            for h in range(h0, h0 + groups):
                top = np.float32(-np.inf)
                for c in range(m):
                    scores[h, c] = scores[h, c] * scale
                    top = max(top, scores[h, c])
                for c in range(m):
                    scores[h, c] = _exp(scores[h, c] - top)
                t = np.float32(0.0)
                for c in range(m):
                    t = t + scores[h, c]
                total[h] = t
                acc[h] = 0.0
            for c in range(m):  # each value row read once for the heads that share it
                row = v[g, cols[c]]
                for h in range(h0, h0 + groups):
                    p, a = scores[h, c], acc[h]
                    for j in range(d):
                        a[j] = a[j] + p * row[j]
            for h in range(h0, h0 + groups):
                for j in range(d):
                    out[r, h, j] = acc[h, j] / total[h]


EVERY_COLUMN = np.zeros((0, 0), np.bool_)  # attend's "visible" when a row sees every column of the layer's view


def visible(mask):
    """The columns each row sees, from the cache's additive mask(s) (None, one ``[1, 1, n, cols]`` tensor or a dict
    per layer type): boolean arrays for :func:`attend`."""
    if mask is None:
        return None
    if torch.is_tensor(mask):
        return (mask[0, 0] == 0).numpy()
    return {kind: (m[0, 0] == 0).numpy() for kind, m in mask.items()}


def attention(q: torch.Tensor, layer, past: int, seen, scale: float) -> torch.Tensor:
    """``q [1, n, H, D]`` (contiguous) attending the cache ``layer`` (its new rows written after ``past`` entries)
    -> ``[n, H, D]``; ``seen``: from :func:`visible` (None: every column of the layer's view)."""
    keys, values = layer.buffers()
    out = torch.empty(q.shape[1:], dtype=torch.float32)
    attend(q[0].numpy(), keys[0].numpy(), values[0].numpy(), layer.visible_start(past), layer.length,
           EVERY_COLUMN if seen is None else seen, np.float32(scale), out.numpy())
    return out
