"""The linear kernels of the engine's compared forwards: ``y = x @ W.T`` for a few float32 rows ``x``, the weight
``W`` streamed as stored (float32, bfloat16 or float16 bits) and widened to float32 in registers.

Why (docs/profiling.md, "Verification rows"): a verification forward pushes a handful of rows through every weight.
One row is memory-bound; from about four rows on, the per-row kernels that loaded each weight vector once per row
(:mod:`specdec_cli.runtime.dot16`'s blocks, ``dot_rows``) became compute-bound, and MKL, which the float32 plans
then picked, streams these shapes far below the bandwidth: a SmolLM2 forward's float32 products took 1.9x one row's
time at 4 rows and 3.5x at 8 (docs/profiling.md, "Verification rows"). Here a *tile* of :data:`PAIR` rows x
:data:`OUTS` outputs keeps their accumulators in registers, so each weight vector loaded serves every row of the
tile and each input vector every output of it: 1.2x at 4 rows and 1.6x at 8, with one row as fast as before.

**Row invariance by construction.** Every output is one sum in one fixed order, written out in LLVM IR without
fast-math flags (LLVM may not reorder it): lane ``l`` of one :data:`VECTOR`-wide accumulator takes the products of
``k = l, l + 8, ...`` by fused multiply-adds (``llvm.fma``), the lanes are added in a fixed tree (4 + 4, 2 + 2,
1 + 1), then the ``K mod 8`` leftover products one by one (multiply, then add). Every tile shape runs exactly
these operations for each of its (row, output) pairs, so a row's result does not depend on the rows or the tile
beside it: a verified draft row's logits are those of a one-row forward. On AVX-512 the GGUF blocks' tiles hold two
outputs' accumulators in one 16-lane register (8 lanes each: the same operations) and come 4 and 8 rows tall too;
so do float32's, from 4 rows on: the products of SmolLM2's forward took 19.5 ms for 8 rows against 26.3 for four
2-row passes, and 52 against 94 for 32 rows (one thread, AMD EPYC VM; docs/profiling.md, "Tall float32 tiles").
"""

from __future__ import annotations

import numpy as np

from .ggml_blocks import (BLOCK, BLOCK_BYTES, BLOCK_FORMATS, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0, STORED,  # noqa: F401
                          block_weights, dequantize, prefetch_blocks)
from .jit import COMPILED, njit

VECTOR = 8  # float32 lanes of one AVX2 register: one accumulator per (row, output) (two outputs per AVX-512 one)
OUTS = 4  # outputs per tile: 2 rows x 4 outputs = 8 accumulators + 4 weight vectors + 1 input: AVX2's 16 registers
PAIR = 2  # rows per AVX2 tile (3 rows x 4 outputs measured slower: 12 accumulators leave too few registers)
F32, BF16, FP16 = 0, 1, 2  # weight formats (an int: one compiled driver serves them all; GGUF blocks: 3-7)
ITEM_BYTES = np.array([4, 2, 2, 0, 0, 0, 0, 0], np.int64)  # bytes of one stored weight, per format (0: GGUF blocks)

if COMPILED:  # pragma: no branch - without numba the plans never pick these kernels
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    _F32, _I16, _I32, _I64 = ir.FloatType(), ir.IntType(16), ir.IntType(32), ir.IntType(64)
    try:  # AVX-512: a GGUF tile de-quantizes two outputs' blocks in one 16-lane register (each output keeps its own
        # 8 lanes, so the same sums); SmolLM2's one-row blocks step, Intel Xeon VM: see docs/profiling.md
        from llvmlite import binding as _llvm

        OUT_PAIRS = bool(_llvm.get_host_cpu_features().get("avx512f"))
    except RuntimeError:  # pragma: no cover - a host LLVM cannot describe
        OUT_PAIRS = False
    # ... and with its 32 registers a tile of up to 8 rows x 4 outputs (16 accumulators, 8 de-quantized vectors)
    # de-quantizes each block once for 8 rows instead of once per row pair (float32: loads each weight once for 8)
    TALL = OUT_PAIRS
    TALL_HEIGHTS = (8, 4)  # the tall tiles' heights, tallest first
    _VF, _VI16, _VI32 = ir.VectorType(_F32, VECTOR), ir.VectorType(_I16, VECTOR), ir.VectorType(_I32, VECTOR)

    def _widen(builder, bits, fmt: int, vector: bool):
        """Stored 16-bit weights as float32: bf16 -> bits << 16 (exact); fp16 -> ``fpext`` (exact)."""
        wide, shift = (_VI32, ir.Constant(_VI32, [16] * VECTOR)) if vector else (_I32, ir.Constant(_I32, 16))
        if fmt == BF16:
            return builder.bitcast(builder.shl(builder.zext(bits, wide), shift), _VF if vector else _F32)
        half = ir.VectorType(ir.HalfType(), VECTOR) if vector else ir.HalfType()
        return builder.fpext(builder.bitcast(bits, half), _VF if vector else _F32)

    def _load(builder, wp, at, fmt: int, vector: bool):
        """The weight(s) at element ``at``: 8 as a float32 vector, or one float32."""
        if fmt == F32:
            kind = _VF if vector else _F32
            return builder.load(builder.bitcast(builder.gep(wp, [at]), kind.as_pointer()), align=4)
        kind = _VI16 if vector else _I16
        return _widen(builder, builder.load(builder.bitcast(builder.gep(wp, [at]), kind.as_pointer()), align=2),
                      fmt, vector)

    def fma_sums(builder, trip, count: int, body, lanes: int = VECTOR):
        """A counted loop of ``trip`` iterations (an i64 value; none when it is <= 0) carrying ``count`` ``lanes``-wide
        accumulators that start at zero: ``body(c, accs)`` emits iteration ``c``'s work (in one basic block) and
        returns the new accumulators. Returns their values after the loop (zeros when it did not run), in the block
        where the loop exits. The loop skeleton of these tiles and of :mod:`specdec_cli.runtime.dot16`'s blocks."""
        c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731 - an i64 constant
        kind = ir.VectorType(_F32, lanes)
        zero = ir.Constant(kind, [0.0] * lanes)
        entry = builder.block
        loop, done = builder.append_basic_block("sums.loop"), builder.append_basic_block("sums.done")
        builder.cbranch(builder.icmp_signed(">", trip, c64(0)), loop, done)
        builder.position_at_end(loop)
        c = builder.phi(_I64)
        accs = [builder.phi(kind) for _ in range(count)]
        new = body(c, accs)
        step, tail = builder.add(c, c64(1)), builder.block
        c.add_incoming(c64(0), entry)
        c.add_incoming(step, tail)
        for acc, value in zip(accs, new):
            acc.add_incoming(zero, entry)
            acc.add_incoming(value, tail)
        builder.cbranch(builder.icmp_signed("<", step, trip), loop, done)
        builder.position_at_end(done)
        finals = [builder.phi(kind) for _ in range(count)]  # every phi first: LLVM's rule
        for phi, value in zip(finals, new):
            phi.add_incoming(zero, entry)
            phi.add_incoming(value, tail)
        return finals

    def lane_tree(builder, s):
        """The lanes of ``s`` added in the fixed tree: halves 4 + 4, 2 + 2, 1 + 1."""
        width = VECTOR // 2
        while width:
            lo = builder.shuffle_vector(s, s, ir.Constant(ir.VectorType(_I32, width), list(range(width))))
            hi = builder.shuffle_vector(s, s, ir.Constant(ir.VectorType(_I32, width), list(range(width, 2 * width))))
            s, width = builder.fadd(lo, hi), width // 2
        return builder.extract_element(s, ir.Constant(_I32, 0))

    def _emit(builder, args, rows: int, outs: int, fmt: int):
        x_addr, w_addr, k_dim, y_addr, y_stride = args
        c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731 - an i64 constant
        xp = builder.inttoptr(x_addr, _F32.as_pointer())
        wp = builder.inttoptr(w_addr, (_F32 if fmt == F32 else _I16).as_pointer())
        chunks = builder.sdiv(k_dim, c64(VECTOR))
        blocks = fmt in BLOCK_FORMATS  # K is then a multiple of 32 (k-quants: 256): no leftovers
        row_bytes = builder.mul(builder.sdiv(k_dim, c64(int(STORED[fmt]))), c64(int(BLOCK_BYTES[fmt])))

        pairs = (blocks or (fmt == F32 and rows > PAIR)) and OUT_PAIRS and outs % 2 == 0  # 2 outputs per register
        groups = [(j, j + 1) for j in range(0, outs, 2)] if pairs else [(j,) for j in range(outs)]
        width = 2 if pairs else 1  # rows of lanes per accumulator
        wide = ir.VectorType(_F32, VECTOR * width)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(wide, [wide] * 3),
                                             f"llvm.fma.v{VECTOR * width}f32")

        def products(k, ws, accs):  # 8 products for every (row, output) pair; accumulator r * len(ws) + group
            new = []
            for r in range(rows):
                xv = builder.load(builder.bitcast(builder.gep(xp, [builder.add(builder.mul(k_dim, c64(r)), k)]),
                                                  _VF.as_pointer()), align=4)
                if width == 2:  # the same 8 inputs in both halves
                    xv = builder.shuffle_vector(xv, xv, ir.Constant(ir.VectorType(_I32, 2 * VECTOR),
                                                                    list(range(VECTOR)) * 2))
                new += [builder.call(fma, [xv, w, accs[r * len(ws) + g]]) for g, w in enumerate(ws)]
            return new

        def chunk(c, accs):
            k = builder.mul(c, c64(VECTOR))
            _prefetch(builder, w_addr, k_dim, c, outs, fmt)
            ws = [_load(builder, wp, builder.add(builder.mul(k_dim, c64(j)), k), fmt, True) for j in range(outs)]
            return products(k, _side_by_side(builder, ws, groups) if pairs else ws, accs)

        def block(b, accs):  # a GGUF block per iteration: its four chunks in chunk order (the same sums as chunk's)
            prefetch_blocks(builder, w_addr, row_bytes, b, outs, fmt)
            ws = [block_weights(builder, w_addr, row_bytes, js, b, fmt) for js in groups]
            for i in range(BLOCK // VECTOR):
                accs = products(builder.add(builder.mul(b, c64(BLOCK)), c64(i * VECTOR)), [w[i] for w in ws], accs)
            return accs

        if blocks:
            finals = fma_sums(builder, builder.sdiv(k_dim, c64(BLOCK)), rows * len(groups), block, VECTOR * width)
        else:
            finals = fma_sums(builder, chunks, rows * len(groups), chunk, VECTOR * width)
        sums = [[None] * outs for _ in range(rows)]
        for r in range(rows):
            for g, js in enumerate(groups):
                for h, j in enumerate(js):  # each output's own 8 lanes, then the fixed tree
                    acc = finals[r * len(groups) + g]
                    if width == 2:
                        lanes = list(range(h * VECTOR, (h + 1) * VECTOR))
                        acc = builder.shuffle_vector(acc, acc, ir.Constant(_VI32, lanes))
                    sums[r][j] = lane_tree(builder, acc)
        for r in range(rows if not blocks else 0):  # the K mod 8 leftovers, one by one, in order
            for j in range(outs):
                sums[r][j] = _leftovers(builder, xp, wp, k_dim, chunks, r, j, sums[r][j], fmt)
        yp = builder.inttoptr(y_addr, _F32.as_pointer())
        for r in range(rows):
            for j in range(outs):
                builder.store(sums[r][j], builder.gep(yp, [builder.add(builder.mul(y_stride, c64(r)), c64(j))]))

    def _side_by_side(builder, ws, groups):
        """Float32 tall tiles: outputs ``j`` and ``j + 1``'s 8-lane weight vectors as one 16-lane vector (low and
        high lanes), each output keeping its own lanes and so its own sums."""
        both = ir.Constant(ir.VectorType(_I32, 2 * VECTOR), list(range(2 * VECTOR)))
        return [builder.shuffle_vector(ws[a], ws[b], both) for a, b in groups]

    def _prefetch(builder, w_addr, k_dim, c, outs: int, fmt: int):
        """Ask for the next tile's weights while this one runs, at the rate this one reads its own: a tile reads
        ``outs`` short rows side by side (1-2 KB each), too short for the hardware's stream prefetcher to catch."""
        c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
        item = int(ITEM_BYTES[fmt])
        per_chunk = outs * VECTOR * item  # bytes this tile reads per chunk = bytes of the next block to ask for
        i8p = ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, _I32, _I32, _I32]),
                                            "llvm.prefetch.p0i8")
        at = builder.add(builder.add(w_addr, builder.mul(k_dim, c64(outs * item))), builder.mul(c, c64(per_chunk)))
        for line in range(0, per_chunk, 64):  # one prefetch per 64-byte cache line
            ptr = builder.inttoptr(builder.add(at, c64(line)), i8p)
            builder.call(fn, [ptr, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])

    def _leftovers(builder, xp, wp, k_dim, chunks, r: int, j: int, s, fmt: int):
        """``s + x[r, k] * w[j, k]`` for ``k`` from ``chunks * 8`` to ``K``, one multiply and one add each."""
        c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
        before = builder.block
        body, after = builder.append_basic_block("tile.left"), builder.append_basic_block("tile.end")
        first = builder.mul(chunks, c64(VECTOR))
        builder.cbranch(builder.icmp_signed("<", first, k_dim), body, after)
        builder.position_at_end(body)
        k, acc = builder.phi(_I64), builder.phi(_F32)
        x = builder.load(builder.gep(xp, [builder.add(builder.mul(k_dim, c64(r)), k)]))
        w = _load(builder, wp, builder.add(builder.mul(k_dim, c64(j)), k), fmt, False)
        more, nxt = builder.fadd(acc, builder.fmul(x, w)), builder.add(k, c64(1))
        k.add_incoming(first, before)
        k.add_incoming(nxt, body)
        acc.add_incoming(s, before)
        acc.add_incoming(more, body)
        builder.cbranch(builder.icmp_signed("<", nxt, k_dim), body, after)
        builder.position_at_end(after)
        out = builder.phi(_F32)
        out.add_incoming(s, before)
        out.add_incoming(more, body)
        return out

    def _tile(rows: int, outs: int):
        """An intrinsic ``tile(fmt, x_addr, w_addr, K, y_addr, y_stride)``: rows ``x[0:rows]`` (``K`` floats apart)
        times weight rows ``w[0:outs]`` (``K`` elements, or ``K / STORED`` blocks, apart) in format ``fmt``, stored at
        ``y[r * y_stride + j]``. One switch on ``fmt`` per tile, then that format's loop."""

        @intrinsic
        def tile(typingctx, fmt, x_addr, w_addr, k_dim, y_addr, y_stride):
            def codegen(context, builder, signature, args):
                done, unknown = builder.append_basic_block("tile.done"), builder.append_basic_block("tile.unknown")
                switch = builder.switch(args[0], unknown)
                builder.position_at_end(unknown)  # a format this tile does not emit: stop, never leave y unwritten
                builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                            "llvm.trap"), [])
                builder.unreachable()
                for f in range(len(ITEM_BYTES)) if rows <= PAIR else (F32,) + BLOCK_FORMATS:  # tall: no 16-bit
                    case = builder.append_basic_block(f"tile.fmt{f}")
                    switch.add_case(ir.Constant(args[0].type, f), case)
                    builder.position_at_end(case)
                    _emit(builder, args[1:], rows, outs, f)
                    builder.branch(done)
                builder.position_at_end(done)
                return context.get_dummy_value()

            return types.void(*[types.intp] * 6), codegen

        return tile

    tile_2x4, tile_1x4, tile_2x1, tile_1x1 = _tile(2, 4), _tile(1, 4), _tile(2, 1), _tile(1, 1)
    # AVX-512 (TALL): float32 weights or a GGUF block loaded once per 8 rows; elsewhere never called (no code emitted)
    tile_8x4, tile_4x4 = (_tile(8, 4), _tile(4, 4)) if TALL else (tile_2x4, tile_2x4)

    @njit(cache=True, nogil=True, boundscheck=False, inline="always")
    def _tile_at(fmt, rows, outs, xa, wa, k_dim, ya, n_out):  # pragma: no cover - compiled
        """One tile call, the intrinsic picked by shape (well-predicted branches, once per tile)."""
        if rows == 8:
            tile_8x4(fmt, xa, wa, k_dim, ya, n_out)
        elif rows == 4:
            tile_4x4(fmt, xa, wa, k_dim, ya, n_out)
        elif rows == 2:
            tile_2x4(fmt, xa, wa, k_dim, ya, n_out) if outs == 4 else tile_2x1(fmt, xa, wa, k_dim, ya, n_out)
        else:
            tile_1x4(fmt, xa, wa, k_dim, ya, n_out) if outs == 4 else tile_1x1(fmt, xa, wa, k_dim, ya, n_out)

    @njit(cache=True, nogil=True, boundscheck=False)
    def dot_tiled(x, w, y, fmt, pair):  # pragma: no cover - compiled
        """``y[r, j] = x[r] . widen(w[j])``: float32 ``x [n, K]``, ``w [N, K]`` (float32, or ``uint16`` bits of
        bfloat16/float16 as ``fmt`` says), float32 ``y [n, N]``, all C-contiguous. Outputs in groups of
        :data:`OUTS` (each group's weights stay in L1 while every row pair passes); ``pair``: rows two at a time
        (same bits either way)."""
        dot_tiled_span(x, w, y, fmt, pair, 0, w.shape[0])

    @njit(cache=True, nogil=True, boundscheck=False)
    def dot_tiled_span(x, w, y, fmt, pair, j0, j1):  # pragma: no cover - compiled
        """:func:`dot_tiled` for the outputs ``j0 <= j < j1`` only (``j0`` a multiple of :data:`OUTS`, ``j1`` one
        too or ``N``: every output is then computed by the tile it gets over all of ``[0, N)``, so threads that
        split the outputs at such points give the one-thread bits)."""
        n, k_dim = x.shape
        n_out = w.shape[0]
        xa, wa, ya = x.ctypes.data, w.ctypes.data, y.ctypes.data
        row_bytes = k_dim * ITEM_BYTES[fmt] if ITEM_BYTES[fmt] else k_dim // STORED[fmt] * BLOCK_BYTES[fmt]
        j = j0
        while j < j1:
            outs = OUTS if j + OUTS <= j1 else 1
            r = 0
            while r < n:
                rows = PAIR if pair and r + PAIR <= n else 1
                if TALL and pair and outs == OUTS and (ITEM_BYTES[fmt] == 0 or fmt == F32) and r + TALL_HEIGHTS[1] <= n:
                    rows = TALL_HEIGHTS[0] if r + TALL_HEIGHTS[0] <= n else TALL_HEIGHTS[1]
                _tile_at(fmt, rows, outs, xa + r * k_dim * 4, wa + j * row_bytes, k_dim, ya + (r * n_out + j) * 4,
                         n_out)
                r += rows
            j += outs
else:  # pragma: no cover - numba is a dependency; without it the plans never pick these, imports still work
    def dot_tiled_span(x, w, y, fmt, pair, j0, j1):
        w = w[j0:j1]
        if fmt in BLOCK_FORMATS:  # gguf's reference de-quantization, in float32
            w = dequantize(w, fmt)
        elif fmt != F32:
            w = (w.astype(np.uint32) << 16).view(np.float32) if fmt == BF16 else w.view(np.float16).astype(np.float32)
        y[:, j0:j1] = x @ w.T

    def dot_tiled(x, w, y, fmt, pair):
        dot_tiled_span(x, w, y, fmt, pair, 0, w.shape[0])
