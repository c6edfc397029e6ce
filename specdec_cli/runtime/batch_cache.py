"""One KV cache for several sequences that decode together: per-row lengths, one forward per step.

Row ``b`` of every layer's buffer (``[rows, heads, capacity, dim]``) holds sequence ``b``'s keys and values; the
rows' lengths differ (ragged batches). A batched forward feeds ``S`` query positions per row -- the root and that
row's draft tree, padded to the widest row -- and each row's new entries are written at *its own* length
(``positions[b] = length[b] + 0..S-1``), so nothing is ever shifted or re-padded. Attention reads the columns
``[0, max length + S)`` of every row; :func:`~specdec_cli.runtime.masks.batch_mask` shows each query the columns of
its own prefix and its own tree ancestors (and, in sliding-window layers, only those within the window), so the
stale or padding entries beyond a row's length are never seen. Buffers start zeroed: a masked entry is always a finite number.

Rows come and go (:meth:`BatchCache.load_row` copies a prompt's prefill from a one-sequence cache into a free row;
:meth:`BatchCache.drop_rows` drops finished rows when no prompt is waiting: the last rows move into the holes),
and an accepted tree path is kept per row with one indexed copy per layer for the whole batch
(:meth:`BatchCache.keep_paths`).

:class:`BatchCache` is a :class:`~specdec_cli.runtime.cache.KVCache`: the loops ask it what they ask a one-sequence
cache (``forward_rows``, ``keep_paths``, ``prefill_row``, ``drop_rows``, ``row_view``). A row's
:class:`~specdec_cli.runtime.cache.RowView` (for the drafters that read the target's cache: draft models that are
copies of the target) reads it through :meth:`BatchLayer.row`.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers.cache_utils import DynamicLayer

from . import decoder, forward as engine_forward, kernels
from .cache import CACHE_SLACK, MIN_CAPACITY, KVCache, RowView
from .cache_mode import CacheMode
from .masks import batch_mask, layer_windows
from .positions import ancestor_matrix, depths


class BatchLayer(DynamicLayer):
    """One decoder layer's keys and values for every row; writes land at each row's own length."""

    MASK_COLUMNS = True  # buffer column c is column c of the batch's masks (runtime/attend.batch_rows reads them so)

    def __init__(self, owner: "BatchCache"):
        super().__init__()
        self.owner = owner
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def allocate(self, heads: int, dim: int, dtype: torch.dtype, device) -> None:
        shape = (self.owner.rows, heads, self.owner.capacity, dim)
        self._k = torch.zeros(shape, dtype=dtype, device=device)
        self._v = torch.zeros(shape, dtype=dtype, device=device)
        self.dtype, self.device, self.is_initialized = dtype, device, True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.allocate(key_states.shape[1], key_states.shape[-1], key_states.dtype, key_states.device)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self._k is None:
            self.lazy_initialization(key_states, value_states)
        self.fit()
        rows, pos = self.owner.write_index
        self._k[rows, :, pos] = key_states.transpose(1, 2).to(self._k.dtype)
        self._v[rows, :, pos] = value_states.transpose(1, 2).to(self._v.dtype)
        end = self.owner.write_end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values

    def fit(self) -> None:
        """Grow the buffers (zero-filled) to the owner's capacity."""
        if self._k is not None and self._k.shape[2] < self.owner.capacity:
            for name in ("_k", "_v"):
                old = getattr(self, name)
                new = old.new_zeros((*old.shape[:2], self.owner.capacity, old.shape[-1]))
                new[:, :, : old.shape[2]] = old
                setattr(self, name, new)

    def row(self, b: int, length: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Row ``b``'s first ``length`` keys and values, ``[1, heads, length, dim]`` views (None before any write)."""
        if self._k is None:
            return None, None
        return self._k[b: b + 1, :, :length], self._v[b: b + 1, :, :length]

    def nbytes(self) -> int:
        return 0 if self._k is None else 2 * self._k.numel() * self._k.element_size()

    def move_rows(self, moves: list[tuple[int, int, int]], rows: int) -> None:
        """Copy row ``src`` into row ``dst`` (its first ``length`` entries) for each move, then keep the first
        ``rows`` rows (a view: no copy)."""
        if self._k is None:
            return
        for src, dst, length in moves:
            self._k[dst, :, :length] = self._k[src, :, :length]
            self._v[dst, :, :length] = self._v[src, :, :length]
        self._k, self._v = self._k[:rows], self._v[:rows]

    def get_seq_length(self) -> int:
        return self.owner.max_length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.max_length + query_length, 0

    def get_max_length(self) -> int:
        return -1


def one_sequence_only(name: str) -> NotImplementedError:
    return NotImplementedError(f"BatchCache.{name}: a one-sequence operation; a cache of many rows takes "
                               "forward_rows, keep_paths, prefill_row, drop_rows and row_view (a row as one sequence)")


class BatchCache(KVCache):
    """KV cache of ``rows`` sequences (see the module doc). ``lengths[b]``: entries row ``b`` holds. It takes the
    interface's row-shaped methods; its one-sequence operations raise (a row is read as one sequence through
    :meth:`row_view`, and a batch of one row decodes in a one-sequence cache instead)."""

    mode = CacheMode.EAGER

    def __init__(self, model, rows: int, capacity: int, *, own_columns: bool = True, greedy: bool = False):
        self.rows, self.capacity = int(rows), int(capacity)
        # True: each row may attend its own columns alone (runtime/attend.batch_rows: faster, SDPA's values up to
        # rounding); False: SDPA's bits, the module code's exactly (a sampled batch, or one whose draft model copies
        # the target's keys and values: its draws and drafts then never move with attention's rounding, so its
        # counts match the code before batch_rows at B = 1 and 4, scripts/counts.sh)
        self.own_columns = own_columns
        self.greedy = greedy  # only the rows' argmaxes are read: forward_rows may return tokens (runtime/head_screen)
        self.lengths = [0] * self.rows
        self.write_index: tuple[torch.Tensor, torch.Tensor] | None = None
        self.write_end = 0
        n_layers = len(layer_windows(model.config)) or model.config.get_text_config().num_hidden_layers
        super().__init__(layers=[BatchLayer(self) for _ in range(n_layers)])

    def keep_module_bits(self) -> None:
        self.own_columns = False

    @property
    def max_length(self) -> int:
        return max(self.lengths, default=0)

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)

    def reserve(self, needed: int) -> None:
        if needed > self.capacity:
            self.capacity = max(needed, 2 * self.capacity)

    # -- rows come and go ----------------------------------------------------------------------------------------

    @torch.inference_mode()
    def load_row(self, row: int, src: KVCache, length: int) -> None:
        """Row ``row`` becomes the first ``length`` entries of the one-sequence cache ``src`` (a prompt's prefill)."""
        self.reserve(length + 1)
        for dst, layer in zip(self.layers, src.layers):
            if length == 0:
                break
            keys, values = layer.keys[0, :, :length], layer.values[0, :, :length]
            if dst._k is None:
                dst.allocate(keys.shape[0], keys.shape[-1], keys.dtype, keys.device)
            dst.fit()
            dst._k[row, :, :length] = keys
            dst._v[row, :, :length] = values
        self.lengths[row] = length

    def prefill_row(self, model, row: int, tokens: list[int]) -> None:
        """Prefill ``tokens`` on their own (a one-sequence cache: one forward of the whole prompt) and move them
        into row ``row``."""
        single = engine_forward.new_cache(model, len(tokens) + 1 + CACHE_SLACK)  # + the root, as the loops size one
        single.prefill_row(model, 0, tokens)
        self.load_row(row, single, len(tokens))

    def row_view(self, row: int) -> RowView:
        return RowView(self, row)

    @torch.inference_mode()
    def drop_rows(self, free: list[int]) -> list[int]:
        """Rows ``free`` leave (finished sequences no prompt waits for): the last live rows move into the holes
        (one row copy each), the buffers' first dimension shrinks by a view. Returns the new order: for each new
        row, the old row it holds."""
        gone = set(free)
        keep = [r for r in range(self.rows) if r not in gone]
        size = len(keep)
        holes = [r for r in free if r < size]
        movers = [r for r in keep if r >= size]
        order = list(range(size))
        for hole, mover in zip(sorted(holes), movers):
            order[hole] = mover
        moves = [(mover, hole, self.lengths[mover]) for hole, mover in zip(sorted(holes), movers)]
        for layer in self.layers:
            layer.move_rows(moves, size)
        self.lengths = [self.lengths[r] for r in order]
        self.rows = size
        return order

    # -- a step ----------------------------------------------------------------------------------------------------

    def forward(self, model, tokens, parents=None, keep=None):
        raise one_sequence_only("forward")

    def crop_to(self, length: int) -> None:
        raise one_sequence_only("crop_to")

    def keep_tree_rows(self, prefix_len: int, rows: list[int]) -> None:
        raise one_sequence_only("keep_tree_rows")

    def copy_prefix(self, src, start: int, end: int, dtype=None) -> bool:
        raise one_sequence_only("copy_prefix")

    def companion_capacity(self) -> int:
        return MIN_CAPACITY

    @torch.inference_mode()
    def forward_rows(self, model, drafts: list[tuple[list[int], list[int]]]) -> list:
        """One forward over every row, each at its own length (module doc); logits ``[len(tokens), V]`` per row
        (a greedy cache: their argmaxes, :class:`~specdec_cli.runtime.head_screen.GreedyRows`, where proven)."""
        if len(drafts) != self.rows:
            raise ValueError(f"a batched forward takes one draft per row: {len(drafts)} for {self.rows} rows")
        width = max(len(tokens) for tokens, _ in drafts)
        dev = model.get_input_embeddings().weight.device
        starts = torch.tensor(self.lengths, dtype=torch.long)
        ids = torch.zeros((self.rows, width), dtype=torch.long)
        real = torch.zeros((self.rows, width), dtype=torch.bool)
        anc = torch.eye(width, dtype=torch.bool).repeat(self.rows, 1, 1)  # padding rows see themselves
        depth = torch.arange(width).repeat(self.rows, 1)
        for b, (tokens, parents) in enumerate(drafts):
            n = len(tokens)
            ids[b, :n] = torch.tensor(tokens)
            real[b, :n] = True
            anc[b, :n, :n] = ancestor_matrix(parents)
            depth[b, 1:n] = torch.tensor(depths(parents), dtype=torch.long)
        self.reserve(self.max_length + width)
        q_pos = starts[:, None] + depth
        self.write_index = (torch.arange(self.rows)[:, None].to(dev), (starts[:, None] + torch.arange(width)).to(dev))
        self.write_end = self.max_length + width
        masks = self.masks(model, starts, anc, q_pos, self.write_end)
        logits = decoder.run_rows(self, model, ids.to(dev), q_pos.to(dev), masks, real.to(dev), self.greedy)
        if logits is None:  # no lean path for this model: transformers' module code, cut to the real positions
            with kernels.active(), real_rows_only(model, real.to(dev)):
                logits = model(input_ids=ids.to(dev), past_key_values=self, use_cache=True,
                               position_ids=q_pos.to(dev), attention_mask=masks, logits_to_keep=0).logits[0]
        for b, (tokens, _) in enumerate(drafts):
            self.lengths[b] += width  # every row wrote ``width`` entries; keep_paths cuts them back
        self.pending = starts.tolist()
        return list(logits.float().split(real.sum(1).tolist()))

    def masks(self, model, starts, anc, q_pos, end: int):
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        types, window = getattr(cfg, "layer_types", None), getattr(cfg, "sliding_window", None)
        dev = model.get_input_embeddings().weight.device
        if not (types and window and "sliding_attention" in types):
            return batch_mask(starts, anc, q_pos, end, None, model.dtype).to(dev)
        return {kind: batch_mask(starts, anc, q_pos, end, window if kind == "sliding_attention" else None,
                                 model.dtype).to(dev) for kind in sorted(set(types))}

    @torch.inference_mode()
    def keep_paths(self, paths: list[list[int]]) -> None:
        """After :meth:`forward_rows`: row ``b`` keeps its prefix plus its query rows ``paths[b]`` (ascending; 0 is the
        root), moved down to follow the prefix -- one indexed copy per layer for the whole batch."""
        moved = [(b, start + i, start + r) for b, (start, rows) in enumerate(zip(self.pending, paths))
                 for i, r in enumerate(rows) if r != i]
        self.lengths = [start + len(rows) for start, rows in zip(self.pending, paths)]
        if not moved:
            return
        b, dst, src = (torch.tensor(col, dtype=torch.long) for col in zip(*moved))
        for layer in self.layers:
            if layer._k is None:
                continue
            for buf in (layer._k, layer._v):
                buf[b, :, dst] = buf[b, :, src]


@contextmanager
def real_rows_only(model, real: torch.Tensor):
    """Inside: the decoder's hidden states are cut to the query positions that hold tokens (``real``, rows x width,
    in row order) before the model's head, so logits are computed for those alone -- ``[1, N, V]`` with
    ``logits_to_keep=0``, every step of the head (a final soft-cap) as the model's own forward does it.
    (transformers indexes ``hidden[:, logits_to_keep, :]``: a per-row mask cannot be given there.)"""

    def cut(module, args, output):
        output.last_hidden_state = output.last_hidden_state[real].unsqueeze(0)
        return output

    handle = model.get_decoder().register_forward_hook(cut)
    try:
        yield
    finally:
        handle.remove()
