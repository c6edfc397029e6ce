"""GGUF's block formats as the tiles read them (:mod:`specdec_cli.runtime.tiles`, ``--kernels blocks``): their
layout, their de-quantization in registers (LLVM IR the tiles' loops inline), and gguf's reference de-quantization
(the tiles' path without numba, and what the IR must equal bit for bit).

ggml's layout: blocks of 32 weights of one row each.

* ``Q4_1``: float16 scale ``d`` and minimum ``m``, then 16 bytes of nibbles (weight ``i`` the low nibble of byte
  ``i``, weight ``i + 16`` the high one); ``w = d * q + m``.
* ``Q8_0``: float16 ``d``, then 32 int8; ``w = q * d``.
* ``Q5_0``: float16 ``d``, 32 high bits (bit ``i``: weight ``i``'s fifth bit), then ``Q4_1``'s nibbles;
  ``w = d * (q - 16)``.

The k-quants store super-blocks of 256 weights (8 sub-blocks of 32: the tiles read one sub-block per block step):

* ``Q4_K`` (144 bytes): float16 ``d`` and ``dmin``, 12 bytes of 6-bit scales and minima (ggml's
  ``get_scale_min_k4``), then 128 bytes of nibbles: sub-block ``s`` is the low (even ``s``) or high (odd ``s``)
  nibbles of bytes ``32 (s // 2) ..``; ``w = (d * sc) * q - dmin * m``.
* ``Q6_K`` (210 bytes): 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales (one per 16 weights),
  then float16 ``d``; ``w = (d * scale) * (q - 32)``.
"""

from __future__ import annotations

import numpy as np

Q4_1, Q8_0, Q5_0, Q4_K, Q6_K = 3, 4, 5, 6, 7  # the tiles' format numbers (0-2: float32, bfloat16, float16)
BLOCK_FORMATS = (Q4_1, Q8_0, Q5_0, Q4_K, Q6_K)
GGUF_NAMES = {Q4_1: "Q4_1", Q8_0: "Q8_0", Q5_0: "Q5_0", Q4_K: "Q4_K", Q6_K: "Q6_K"}  # format -> gguf's type name
BLOCK = 32  # weights per block step of the tiles (a block, or a k-quant's sub-block)
STORED = np.array([1, 1, 1, 32, 32, 32, 256, 256], np.int64)  # weights per stored block, by format number
BLOCK_BYTES = np.array([0, 0, 0, 20, 34, 22, 144, 210], np.int64)  # bytes of one stored block, by format number
AHEAD = 2  # tiles ahead that the blocks' prefetch asks for (SmolLM2's step, one thread: 1 -> 16.3 ms of products,
# 2 -> 15.1 ms, 3 -> 16.2 ms)
VECTOR = 8  # float32 lanes of the tiles' accumulators (tiles.VECTOR)


def dequantize(w: np.ndarray, fmt: int) -> np.ndarray:
    """gguf's own reference de-quantization (``gguf.quants``, a dependency), in float32: blocks
    ``[N, K / STORED[fmt] * BLOCK_BYTES[fmt]]`` -> ``[N, K]``."""
    from gguf import GGMLQuantizationType, quants

    return quants.dequantize(w, GGMLQuantizationType[GGUF_NAMES[fmt]]).astype(np.float32, copy=False)


try:  # pragma: no cover - without llvmlite (no numba) the tiles never emit these
    from llvmlite import ir
    from numba.core import cgutils
except ImportError:  # pragma: no cover
    ir = None
else:
    _F32, _I32, _I64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)


def _lanes(kind, n: int):
    """The vector type of ``n`` rows' lanes: :data:`VECTOR` per row."""
    return ir.VectorType(kind, VECTOR * n)


def _spread(builder, values: list, kind):
    """One scalar per row -> a vector with row ``i``'s value in lanes ``8i .. 8i + 7``."""
    n = len(values)
    vec = ir.Constant(ir.VectorType(kind, n), ir.Undefined)
    for i, v in enumerate(values):
        vec = builder.insert_element(vec, v, ir.Constant(_I32, i))
    return builder.shuffle_vector(vec, ir.Constant(ir.VectorType(kind, n), ir.Undefined),
                                  ir.Constant(_lanes(_I32, n), [i for i in range(n) for _ in range(VECTOR)]))


def _constant(value, n: int):
    """An i32 vector over ``n`` rows: ``value`` (an int, or one row's :data:`VECTOR` lane values) in every row."""
    row = value if isinstance(value, list) else [value] * VECTOR
    return ir.Constant(_lanes(_I32, n), row * n)


def _eight(builder, addrs: list):
    """Eight bytes at each address (an i64 per row) -> one i8 vector over the rows (the caller widens them)."""
    kind = ir.VectorType(ir.IntType(8), VECTOR)
    assert 1 <= len(addrs) <= 2, "one row or an output pair"
    parts = [builder.load(builder.inttoptr(a, kind.as_pointer()), align=1) for a in addrs]
    return parts[0] if len(parts) == 1 else builder.shuffle_vector(
        parts[0], parts[1], ir.Constant(_lanes(_I32, 2), list(range(2 * VECTOR))))


def _half(builder, addr):
    """The float16 at ``addr`` (an i64), as a float32 (exact)."""
    return builder.fpext(builder.load(builder.inttoptr(addr, ir.HalfType().as_pointer())), _F32)


def _fma(builder, n: int):
    """``llvm.fma`` over ``n`` rows' lanes."""
    kind = _lanes(_F32, n)
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(kind, [kind] * 3),
                                          f"llvm.fma.v{VECTOR * n}f32")


def block_weights(builder, w_addr, row_bytes, js: tuple, b, fmt: int) -> list:
    """Block ``b`` of the weight rows ``js`` (one, or two side by side: row ``js[i]`` in lanes ``8i ..``; GGUF) as
    four float32 vectors (weights ``32b + 8i .. 32b + 8i + 7``), de-quantized as gguf's reference does it in
    float32 (``d * q + m``: multiply, then add; ``q * d``): the bits of the de-quantized file."""
    c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
    n = len(js)
    per = int(STORED[fmt]) // BLOCK  # block steps per stored block (8 for the k-quants)
    inside = builder.mul(builder.udiv(b, c64(per)), c64(int(BLOCK_BYTES[fmt])))
    ats = [builder.add(builder.add(w_addr, builder.mul(row_bytes, c64(j))), inside) for j in js]
    if per > 1:
        return _k_quant(builder, ats, builder.urem(b, c64(per)), fmt)
    at = lambda off: [builder.add(a, c64(off)) for a in ats]  # noqa: E731 - each row's address + off
    halves = lambda off: _spread(builder, [_half(builder, a) for a in at(off)], _F32)  # noqa: E731
    d, vf, vi = halves(0), _lanes(_F32, n), _lanes(_I32, n)
    if fmt == Q8_0:
        return [builder.fmul(builder.sitofp(_eight(builder, at(2 + 8 * i)), vf), d) for i in range(4)]
    first = 6 if fmt == Q5_0 else 4  # the nibbles' first byte
    low = [builder.zext(_eight(builder, at(first + 8 * i)), vi) for i in range(2)]
    q = [builder.and_(v, _constant(15, n)) for v in low]
    q += [builder.lshr(v, _constant(4, n)) for v in low]  # weights 16-31: the high nibbles
    if fmt == Q5_0:  # bit i of the 32 high bits is weight i's fifth bit; q - 16 in -16 .. 15
        high = _spread(builder, [builder.load(builder.inttoptr(a, _I32.as_pointer()), align=1) for a in at(2)], _I32)
        bits = [builder.shl(builder.and_(builder.lshr(high, _constant(list(range(8 * i, 8 * i + 8)), n)),
                                         _constant(1, n)), _constant(4, n)) for i in range(4)]
        return [builder.fmul(d, builder.sitofp(builder.sub(builder.or_(v, hb), _constant(16, n)), vf))
                for v, hb in zip(q, bits)]
    # d * q is exact in float32 (an 11-bit float16 mantissa times a 4-bit integer), so one fused multiply-add
    # rounds d * q + m exactly as gguf's multiply-then-add does: the same bits, one operation fewer
    m = halves(2)
    return [builder.call(_fma(builder, n), [d, builder.uitofp(v, vf), m]) for v in q]


def _k_quant(builder, ats: list, sub, fmt: int) -> list:
    """Sub-block ``sub`` (an i64, 0-7) of the k-quant super-blocks at addresses ``ats`` (one per row), as four
    float32 vectors, de-quantized in gguf's float32 order (:func:`block_weights`)."""
    c64, c32 = (lambda v: ir.Constant(_I64, v)), (lambda v: ir.Constant(_I32, v))  # noqa: E731
    n = len(ats)
    byte = lambda a, off: builder.zext(builder.load(builder.inttoptr(builder.add(a, off),  # noqa: E731
                                                                     ir.IntType(8).as_pointer())), _I32)
    half = lambda a, off: _half(builder, builder.add(a, c64(off)))  # noqa: E731
    eight = lambda off: _eight(builder, [builder.add(a, off) for a in ats])  # noqa: E731
    splat = lambda v: _spread(builder, [v] * n, _I32)  # noqa: E731 - one i32 (the same for every row) in every lane
    vf, vi = _lanes(_F32, n), _lanes(_I32, n)
    sub32 = builder.trunc(sub, _I32)
    if fmt == Q4_K:  # ggml's get_scale_min_k4: sub-blocks 0-3 in bytes 4-11's low 6 bits, 4-7 split over the rest
        j = builder.and_(sub, c64(3))
        low = builder.icmp_unsigned("<", sub, c64(4))
        dsc, minus_dm = [], []
        for a in ats:
            b0, b1, b2 = (byte(a, builder.add(j, c64(off))) for off in (4, 8, 12))
            sc = builder.select(low, builder.and_(b0, c32(63)), builder.or_(
                builder.and_(b2, c32(15)), builder.and_(builder.lshr(b0, c32(2)), c32(48))))
            mn = builder.select(low, builder.and_(b1, c32(63)), builder.or_(
                builder.lshr(b2, c32(4)), builder.and_(builder.lshr(b1, c32(2)), c32(48))))
            dsc.append(builder.fmul(half(a, 0), builder.uitofp(sc, _F32)))
            minus_dm.append(builder.fsub(ir.Constant(_F32, -0.0), builder.fmul(half(a, 2), builder.uitofp(mn, _F32))))
        dsc, minus_dm = _spread(builder, dsc, _F32), _spread(builder, minus_dm, _F32)
        shift = splat(builder.shl(builder.and_(sub32, c32(1)), c32(2)))  # even: low nibbles, odd: high
        first = builder.add(c64(16), builder.mul(builder.lshr(sub, c64(1)), c64(32)))
        q = [builder.and_(builder.lshr(builder.zext(eight(builder.add(first, c64(8 * i))), vi), shift),
                          _constant(15, n)) for i in range(4)]
        # (d * sc) * q is exact in float32 (11 x 6 x 4 bits), so one fused multiply-add rounds it minus dmin * m
        # as gguf's multiply-then-subtract does
        return [builder.call(_fma(builder, n), [dsc, builder.uitofp(v, vf), minus_dm]) for v in q]
    # Q6_K: weights 128 h + 32 t + i (t = sub % 4): low nibble of byte 64 h + 32 (t % 2) + i (shifted 4 (t // 2)),
    # high pair of byte 128 + 32 h + i (shifted 2 t), both offsets in the block; scale 2 sub (i < 16) or 2 sub + 1
    h, t = builder.lshr(sub, c64(2)), builder.and_(sub32, c32(3))
    low_at = builder.add(builder.mul(h, c64(64)), builder.mul(builder.and_(sub, c64(1)), c64(32)))
    high_at = builder.add(c64(128), builder.mul(h, c64(32)))
    low_shift = splat(builder.shl(builder.lshr(t, c32(1)), c32(2)))
    high_shift = splat(builder.shl(t, c32(1)))
    scales = [_spread(builder, [builder.fmul(half(a, 208), builder.sitofp(builder.trunc(
        byte(a, builder.add(builder.mul(sub, c64(2)), c64(192 + s))), ir.IntType(8)), _F32)) for a in ats], _F32)
        for s in (0, 1)]
    out = []
    for i in range(4):
        lo = builder.and_(builder.lshr(builder.zext(eight(builder.add(low_at, c64(8 * i))), vi), low_shift),
                          _constant(15, n))
        hi = builder.and_(builder.lshr(builder.zext(eight(builder.add(high_at, c64(8 * i))), vi), high_shift),
                          _constant(3, n))
        q = builder.sub(builder.or_(lo, builder.shl(hi, _constant(4, n))), _constant(32, n))
        out.append(builder.fmul(scales[i // 2], builder.sitofp(q, vf)))
    return out


def prefetch_blocks(builder, w_addr, row_bytes, b, outs: int, fmt: int):
    """The tiles' prefetch for GGUF blocks: the rows of the tile :data:`AHEAD` tiles on follow this tile's, so ask,
    per block, for as many of their bytes as this tile reads (``outs`` blocks; one tile is ``outs`` short rows,
    too short for the hardware's stream prefetcher)."""
    c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
    per_block = outs * int(BLOCK_BYTES[fmt]) // (int(STORED[fmt]) // BLOCK)  # bytes per block step (k-quants:
    # their average)
    i8p = ir.IntType(8).as_pointer()
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, _I32, _I32, _I32]),
                                        "llvm.prefetch.p0i8")
    at = builder.add(builder.add(w_addr, builder.mul(row_bytes, c64(AHEAD * outs))), builder.mul(b, c64(per_block)))
    for line in range(0, per_block, 64):
        ptr = builder.inttoptr(builder.add(at, c64(line)), i8p)
        builder.call(fn, [ptr, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])

