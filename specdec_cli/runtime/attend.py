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

from .jit import COMPILED, njit, numba

prange = numba.prange if COMPILED else range

LOG2E = np.float32(1.4426950408889634)  # exp(x) = 2**(x * log2(e))
LN2_HI, LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)  # ln 2 in two parts: exact n * LN2_HI
# error_model="numpy" below: no zero-division checks (runtime/fused.py); a softmax's sum is at least 1
WEIGHTED_LANES = 16  # lanes of its accumulators: one AVX-512 register each (AVX2 splits each in two; every lane
# its own sum either way)
WEIGHTED = 64  # floats of a value row that :func:`_weighted` sums per call: 4 accumulators of 16 lanes (with the
# value vector and the weight, 6 of AVX-512's 32 registers; 12 of AVX2's 16); Gemma-3's 256-wide heads take 4 calls
UNDERFLOW = np.float32(-87.0)  # exp below this is under float32's smallest normal: taken as 0
# Cephes' expf polynomial on [-ln2/2, ln2/2] (relative error < 2e-7)
P0, P1, P2 = np.float32(1.9875691500e-4), np.float32(1.3981999507e-3), np.float32(8.3334519073e-3)
P3, P4, P5 = np.float32(4.1665795894e-2), np.float32(1.6666665459e-1), np.float32(5.0000001201e-1)

if COMPILED:  # pragma: no branch
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    from .dot16 import LANES, f32_1, f32_2, f32_4
    from .tiles import fma_sums

    @intrinsic
    def _float_bits(typingctx, bits):
        """The float32 whose bits are the int32 ``bits``."""
        return types.float32(types.int32), lambda ctx, builder, sig, args: builder.bitcast(args[0], ir.FloatType())

    @intrinsic
    def _weighted(typingctx, p_addr, v_addr, cols_addr, m, d, off, out_addr):
        """``out[i] = sum_c p[c] * v[cols[c] * d + off + i]`` for ``i < WEIGHTED``, the columns in order, each
        product rounded, then added (``acc + p * v``, as the scalar loop it replaces): the 64 sums stay in registers
        across the columns instead of being loaded and stored once per column."""
        sig = types.void(*[types.intp] * 7)
        return sig, lambda context, builder, signature, args: _emit_weighted(context, builder, args)

    def _emit_weighted(context, builder, args):
        p_addr, v_addr, cols_addr, m, d, off, out_addr = args
        f32, i64 = ir.FloatType(), ir.IntType(64)
        vf = ir.VectorType(f32, WEIGHTED_LANES)
        pp, vp = builder.inttoptr(p_addr, f32.as_pointer()), builder.inttoptr(v_addr, f32.as_pointer())
        cp = builder.inttoptr(cols_addr, i64.as_pointer())

        def column(c, accs):
            p = builder.load(builder.gep(pp, [c]))
            pv = builder.insert_element(ir.Constant(vf, ir.Undefined), p, ir.Constant(ir.IntType(32), 0))
            pv = builder.shuffle_vector(pv, pv, ir.Constant(ir.VectorType(ir.IntType(32), WEIGHTED_LANES),
                                                            [0] * WEIGHTED_LANES))
            base = builder.add(builder.mul(builder.load(builder.gep(cp, [c])), d), off)
            new = []
            for i, acc in enumerate(accs):
                at = builder.gep(vp, [builder.add(base, ir.Constant(i64, WEIGHTED_LANES * i))])
                row = builder.load(builder.bitcast(at, vf.as_pointer()), align=4)
                new.append(builder.fadd(acc, builder.fmul(pv, row)))
            return new

        finals = fma_sums(builder, m, WEIGHTED // WEIGHTED_LANES, column, WEIGHTED_LANES)
        op = builder.inttoptr(out_addr, f32.as_pointer())
        for i, acc in enumerate(finals):
            builder.store(acc, builder.bitcast(builder.gep(op, [ir.Constant(i64, WEIGHTED_LANES * i)]),
                                               vf.as_pointer()), align=4)
        return context.get_dummy_value()
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
    mcap = stop - start
    scores = np.empty((heads, mcap), np.float32)
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
            v_g = v.ctypes.data + g * v.shape[1] * d * 4
            for h in range(h0, h0 + groups):  # acc[h] = sum over the columns in order of p * value row
                j = 0
                while j + WEIGHTED <= d:
                    _weighted(scores.ctypes.data + h * mcap * 4, v_g, cols.ctypes.data, m, d, j,
                              acc.ctypes.data + (h * d + j) * 4)
                    j += WEIGHTED
                for jj in range(j, d):  # a head width that is not a multiple of WEIGHTED: the rest one by one
                    a = np.float32(0.0)
                    for c in range(m):
                        a = a + scores[h, c] * v[g, cols[c], jj]
                    acc[h, jj] = a
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
    assert keys.is_contiguous() and values.is_contiguous() and values.dtype == torch.float32, "attend's addresses"
    out = torch.empty(q.shape[1:], dtype=torch.float32)
    attend(q[0].numpy(), keys[0].numpy(), values[0].numpy(), layer.visible_start(past), layer.length,
           EVERY_COLUMN if seen is None else seen, np.float32(scale), out.numpy())
    return out


@njit(parallel=True, cache=True, nogil=True, boundscheck=False)
def attend_rows(q, k, v, starts, stops, visible, scale, out):  # pragma: no cover - compiled
    """:func:`attend` for every row ``b`` of a batch (``q [B, n, H, D]``, ``k``, ``v`` ``[B, KVH, capacity, D]``,
    ``out [B, n, H, D]``): row ``b`` over columns ``[starts[b], stops[b])``, ``visible[b]`` of them (``visible``
    ``[B, 0, 0]``: all); the rows over numba's threads."""
    for b in prange(q.shape[0]):
        attend(q[b], k[b], v[b], starts[b], stops[b], visible[b], scale, out[b])


ROWS_MAX = 8  # query positions per row up to which a batch's rows attend here: 32 SmolLM2 rows of 150-280 tokens,
# 2 threads, SDPA / here: 0.57 / 0.28 ms a layer at 1 position (0.22 by spans), 1.66 / 0.50 at 2, 2.01 / 0.88 at 4,
# 3.29 / 1.88 at 8; 8 rows: 0.52 / 0.43 at 8 (docs/profiling.md, "Batched attention by row spans")
ROWS = True  # False: SDPA attends every batch, the module code's bits (tests compare the rest of the lean path so)
_LAST: tuple = (None, None)  # the last mask read and its rows' columns (a forward's layers of one kind share one
# mask, built anew each step and never changed in place); one tuple, read and replaced whole, so forwards on two
# Python threads never pair a mask with others' columns


def row_columns(mask: torch.Tensor):
    """``(starts, stops, visible)`` for :func:`attend_rows` from a batch's additive mask ``[B, 1, n, end]``: with one
    query position per row whose columns are one span, each row's span (``visible`` ``[B, 0, 0]``: no mask to
    read); else every row over ``[0, end)`` with its boolean mask ``[B, n, end]``. None where a query position sees
    no column (SDPA's answer for it, not 0 / 0)."""
    global _LAST
    last = _LAST
    if last[0] is mask:
        return last[1]
    seen = mask[:, 0] == 0  # [B, n, end]
    rows, n, end = seen.shape
    cols = None
    if n == 1:
        count, start = seen[:, 0].sum(1), seen[:, 0].int().argmax(1)
        final = end - 1 - seen[:, 0].flip(1).int().argmax(1)
        if bool(((final - start + 1 == count) & (count > 0)).all()):
            every = np.zeros((rows, 0, 0), np.bool_)
            cols = (start.numpy().astype(np.int64), (final + 1).numpy().astype(np.int64), every)
    if cols is None and bool(seen.any(-1).all()):
        cols = (np.zeros(rows, np.int64), np.full(rows, end, np.int64), np.ascontiguousarray(seen.numpy()))
    _LAST = (mask, cols)
    return cols


def batch_rows(q: torch.Tensor, layer, mask, scale: float) -> torch.Tensor | None:
    """A batch's rows (``q [B, H, n, D]``, ``n`` <= :data:`ROWS_MAX`; the rows' keys and values already in the
    :class:`~specdec_cli.runtime.batch_cache.BatchLayer` ``layer``) -> ``[B, n, H * D]``, each row reading its own
    columns alone; None where this does not apply (SDPA then attends every row over the widest prefix).

    Why: SDPA attends each row over the batch's widest prefix, the padding masked, and its kernel pays per head and
    row (:data:`ROWS_MAX`' figures). Each query row here is computed alone in one fixed order (:func:`attend`): the
    same bits whatever rows are beside it (while the batch takes this path: two rows or more, none wider than
    :data:`ROWS_MAX`, float32 on the CPU), SDPA's values up to rounding."""
    from .dot import on_pool  # numba's OpenMP pool, started once from a thread of its own (runtime/dot.py)

    # a BatchLayer (its buffer column c is the mask's column c) of a cache whose rows may attend alone (greedy)
    ours = getattr(layer, "MASK_COLUMNS", False) and getattr(layer.owner, "own_columns", False)
    if not (ROWS and COMPILED and ours) or not torch.is_tensor(mask) or mask.dim() != 4:
        return None
    keys, values, (b, heads, n, d) = layer._k, layer._v, q.shape
    if keys is None or n > ROWS_MAX or not (keys.dtype == q.dtype == mask.dtype == torch.float32) \
            or keys.device.type != "cpu" or q.device.type != "cpu" or keys.shape[0] != b or mask.shape[0] != b \
            or mask.shape[-1] > keys.shape[2] or heads % keys.shape[1]:
        return None  # the kernel reads float32 CPU buffers at raw addresses: anything else is SDPA's
    cols = row_columns(mask)
    if cols is None:
        return None
    starts, stops, visible = cols
    out = torch.empty(b, n, heads, d, dtype=torch.float32)
    qr = q.transpose(1, 2).contiguous()  # [B, n, H, D]
    threads = min(b, torch.get_num_threads())
    if threads > 1 and on_pool(threads):
        attend_rows(qr.numpy(), keys.numpy(), values.numpy(), starts, stops, visible, np.float32(scale), out.numpy())
    else:
        for r in range(b):
            attend(qr[r].numpy(), keys[r].numpy(), values[r].numpy(), starts[r], stops[r], visible[r],
                   np.float32(scale), out[r].numpy())
    return out.view(b, n, heads * d)
