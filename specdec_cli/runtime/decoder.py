"""A lean decoding forward for the architectures it knows (Llama family, Gemma-3): the model's own weights and
modules, without transformers' per-call machinery.

Why (docs/profiling.md): a decoding step pushes one to a few dozen tokens through every layer, so the matrix
products are small and the time between them counts. In transformers' module code each step builds masks and
rotary tables, walks ``**kwargs`` and decorators through every layer and calls ~15 modules per layer; on the CPU
that was a third of SmolLM2-135M's step (30 thin layers). This forward does per layer only the tensor work:

* the norms with the same float32 operations as transformers' ``RMSNorm`` modules (Llama: ``w * x_normed``;
  Gemma: ``x_normed * (1 + w)``), computed on the weights the modules hold;
* the linear layers by calling their own ``forward`` (so :class:`~specdec_cli.runtime.kernels.FastLinear`'s
  measured kernels, int8 dynamic quantization, biases all apply as they do in the model);
* rotary embeddings from tables made once by the model's own rotary module over positions ``0..capacity``
  (the same float32 values it computes per step), gathered once per forward per layer type;
* the keys/values written by the cache's own layers (``update``: growing buffers, sliding-window views);
* attention by ``scaled_dot_product_attention`` with grouped-query heads given as they are (``enable_gqa``, no
  ``repeat_kv`` copy): one query row attends every entry its layer shows with no mask; more rows take the cache's
  4-D tree/chain mask.

Only forwards of at most :data:`MAX_ROWS` query rows of one sequence use it (decoding and verification); a prefill
runs the model's own forward, where the products dominate. A batch's step (:func:`run_rows`) runs here whatever its
``rows x width``: its products are many rows, but its per-layer calls are as many as one sequence's (a greedy
batch's attention: each row's own columns, :func:`~.attend.batch_rows`: module code's up to rounding). A 16-bit model
(:mod:`specdec_cli.runtime.kernels16`) is the exception, *wide*: the float32 model with 16-bit weights, so every
forward of it, prefills included, runs here with float32 activations, norms, rotary tables, masks and KV cache (the
embedding rows and norm weights widened exactly; a prefill's products may round their rows to 16 bits where the CPU
multiplies 16-bit matrices faster: ``kernels16``'s ``native``). Its compared forwards, and a GGUF blocks model's, run
:mod:`specdec_cli.runtime.fused`'s compiled layers. Otherwise the numbers are the module code's: on SmolLM2-135M and
Gemma-3-270M the logits are bitwise those of transformers' forward with the same linear kernels (1-16 rows; float32,
and the bfloat16 and int8 copies); the tests compare logits on tiny models and require greedy output identical to
transformers' ``generate``.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from . import attend, blocks, fused, kernels
from .head_screen import GreedyRows, screen_for
from .kernels16 import any_order, is_wide
from .layer_ops import Layer, gemma_norm, llama_norm, norm_weights, rotate
from .lean_models import ARCHS, supported, text_config as _text_config
from .masks import CAUSAL, causal_full_layers, layer_windows, masks_to, plain_causal
from .positions import chain_parents, is_chain

MAX_ROWS = 64


class Decoder:
    """The lean forward of one model (made by :func:`decoder_for`). It holds the model's modules and weights, never
    the model itself (the cache of decoders is keyed weakly by the model)."""

    def __init__(self, model):
        self.kind = ARCHS[type(model).__name__]
        self.wide = is_wide(model)
        cfg = _text_config(model)
        inner = model.model
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers)
        layers = list(inner.layers[: cfg.num_hidden_layers])
        rope_of = (lambda t: t) if self.kind == "gemma3" else (lambda t: "full_attention")
        self.layers = [Layer(layer, self.kind, rope_of(t), self.wide) for layer, t in zip(layers, types)]
        self.types = types
        self.windows = layer_windows(model.config)  # per layer: its sliding window, or None
        self.scale = layers[0].self_attn.scaling
        self.embed = inner.embed_tokens
        self.final_norm = norm_weights(inner.norm, self.kind == "gemma3", self.wide)
        # a wide model's embedding: rows widened, then Gemma's float32 scale (the float32 model's own product)
        self.embed_scale = torch.tensor(float(getattr(self.embed, "scalar_embed_scale", 1.0)))
        self.lm_head = model.lm_head.forward
        self.vocab = model.lm_head.out_features
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        self.norm = llama_norm if self.kind == "llama" else gemma_norm
        self.rotary = inner.rotary_emb
        self.stamp = _stamp(model)
        self.tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.capacity = 0
        # compiled layers (runtime.fused): a wide or GGUF blocks model's (SmolLM2's blocks step 19.1 -> 10.9 ms)
        self.fused = fused.fused_for(self, model) if self.wide or (fused.COMPILED and blocks.attached(model)) else None

    def windows_shown_by(self, cache) -> bool:
        """Whether each sliding-window layer's cache shows only its window (then one query row needs no mask)."""
        return all(w is None or getattr(layer, "window", None) == w for w, layer in zip(self.windows, cache.layers))

    @torch.inference_mode()
    def _rope_tables(self, needed: int) -> None:
        """cos/sin ``[capacity, head_dim]`` per rope kind, by the model's own rotary module."""
        if needed <= self.capacity:
            return
        capacity = max(needed, 2 * self.capacity, 1024)
        w = self.embed.weight
        pos = torch.arange(capacity, device=w.device).unsqueeze(0)
        probe = torch.empty(1, 1, 1, dtype=torch.float32 if self.wide else w.dtype, device=w.device)
        for kind in set(layer.rope for layer in self.layers):
            cos, sin = self.rotary(probe, pos, kind) if self.kind == "gemma3" else self.rotary(probe, pos)
            half = sin.shape[-1] // 2
            self.tables[kind] = (cos[0], torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1))
        self.capacity = capacity

    @torch.inference_mode()
    def forward(self, cache, ids: torch.Tensor, positions: torch.Tensor, mask, keep: int | None,
                real: torch.Tensor | None = None, greedy: bool = False) -> torch.Tensor | GreedyRows:
        """Logits ``[rows, V]`` (float32) for ``ids`` ``[n]`` at ``positions`` ``[n]`` after the cached prefix;
        ``mask``: None (one row, or rows that may see every visible entry) or the cache's 4-D additive mask (a
        dict per layer type where full and sliding-window layers mix); ``keep``: the last rows to return;
        ``greedy``: only argmaxes are read, so the rows' tokens come back where :mod:`.head_screen` proves them.

        Batched (a :class:`~specdec_cli.runtime.batch_cache.BatchCache`, not a wide model): ``ids`` and
        ``positions`` ``[B, n]``, one row per sequence padded to the widest, the mask ``[B, 1, n, end]``, and
        ``real`` ``[B, n]`` the positions that hold tokens: their logits alone, in row order (``[sum(real), V]``),
        or with ``greedy`` (only argmaxes are read) their tokens where :mod:`.head_screen` proves them.
        Every product runs once over all ``B * n`` positions, attention once per layer over the batch."""
        ids, positions = (ids, positions) if ids.dim() == 2 else (ids.unsqueeze(0), positions.unsqueeze(0))
        assert ids.shape == positions.shape and (ids.shape[0] == 1 or not self.wide), "wide models: one sequence"
        self._rope_tables(int(positions.max()) + 1)
        # rows whose logits are read: row-invariant attention (runtime.attend), compiled layers where there are
        exact = keep != 0 and real is None and (self.wide or self.fused is not None)
        # [B, n, hidden]; Gemma's module scales by sqrt(hidden) itself
        x = F.embedding(ids, self.embed.weight).float() * self.embed_scale if self.wide else self.embed.forward(ids)
        seen = attend.visible(mask) if exact else mask
        if exact and self.fused is not None:
            rows = {k: (cos[positions[0]].numpy(), sin[positions[0]].numpy()) for k, (cos, sin) in self.tables.items()}
            logits = self.fused.forward(cache, x, rows, seen, keep)
            return torch.tanh(logits / self.softcap) * self.softcap if self.softcap is not None else logits
        at = (lambda t: t[:, :, None]) if exact else (lambda t: t[:, None])  # [1, n, 1, hd] / [B, 1, n, hd]
        rope = {k: (at(cos[positions]), at(sin[positions])) for k, (cos, sin) in self.tables.items()}
        norm, gemma = self.norm, self.kind == "gemma3"
        for i, (layer, cache_layer) in enumerate(zip(self.layers, cache.layers)):
            h = norm(x, layer.norms[0])
            m = seen if seen is None or not isinstance(seen, dict) else seen[self.types[i]]
            a = layer.o(self._attention(layer, cache_layer, h, rope[layer.rope], m, exact))
            if gemma:
                x = x + norm(a, layer.norms[1])
                h = norm(x, layer.norms[2])
                x = x + norm(layer.down(layer.act(layer.gate(h)) * layer.up(h)), layer.norms[3])
            else:
                x = x + a
                h = norm(x, layer.norms[1])
                x = x + layer.down(layer.act(layer.gate(h)) * layer.up(h))
        if real is not None:
            x = x[real].unsqueeze(0)  # [1, sum(real), hidden]: the positions whose logits are read, in row order
        elif keep is not None:
            if keep == 0:
                return x.new_empty(0, self.vocab, dtype=torch.float32)
            x = x[:, -keep:]
        x = norm(x, self.final_norm)
        if greedy and (screen := screen_for(self)) is not None:
            tokens, settled = screen.rows(x[0])
            if bool(settled.all()):
                return GreedyRows(tokens)
            if bool(settled.any()):  # the others' float32 logits when a reader reaches one of them
                return GreedyRows(tokens, (~settled, lambda rows, h=x[0]: self._head_argmax(h[rows])))
        logits = self.lm_head(x)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits[0].float()

    def _head_argmax(self, h: torch.Tensor) -> torch.Tensor:
        """The float32 head's argmax ``[R]`` of rows ``h`` ``[R, hidden]`` (after the final norm; no soft-capping:
        a screened head has none)."""
        return self.lm_head(h[None])[0].float().argmax(-1)

    def _attention(self, layer, cache_layer, h, rope, mask, exact: bool) -> torch.Tensor:
        """One layer's attention output ``[B, n, heads * hd]`` (keys and values appended to the cache): by SDPA, or
        ``exact``ly by :func:`specdec_cli.runtime.attend.attention` (``mask``: then the rows' visible columns)."""
        b, n, hd, heads, kv_heads = h.shape[0], h.shape[1], self.head_dim, self.heads, self.kv_heads
        q = layer.q(h).view(b, n, heads, hd)
        k = layer.k(h).view(b, n, kv_heads, hd)
        v = layer.v(h).view(b, n, kv_heads, hd)
        if not exact:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if layer.q_norm is not None:
            q, k = self.norm(q, layer.q_norm), self.norm(k, layer.k_norm)
        q, k = rotate(q, *rope), rotate(k, *rope)
        if exact:
            past = cache_layer.length
            cache_layer.update(k.transpose(1, 2), v.transpose(1, 2))
            return attend.attention(q, cache_layer, past, mask, self.scale).view(1, n, heads * hd)
        k, v = cache_layer.update(k, v)
        causal = mask is CAUSAL
        if causal and k.shape[-2] != n:
            raise RuntimeError("a causal prefill starts from an empty cache")
        mask = None if causal else mask
        if b > 1 and (rows := attend.batch_rows(q, cache_layer, mask, self.scale)) is not None:
            return rows  # a batch's rows, each over its own columns (runtime/attend.py)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, is_causal=causal,
                                           enable_gqa=heads > kv_heads)
        return a.transpose(1, 2).reshape(b, n, heads * hd)


_DECODERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> Decoder, or None: not used


def decoder_for(model) -> Decoder | None:
    """The model's lean forward, or None when its architecture or setup is not one this module knows (or
    :func:`disable` was called). Made once per model object -- a copy of a model (a quantized draft) gets its
    own -- and again after :func:`specdec_cli.runtime.kernels.install` swapped its linear layers."""
    dec = _DECODERS.get(model, False)
    if dec is False or (dec is not None and dec.stamp != _stamp(model)):
        dec = _DECODERS[model] = Decoder(model) if supported(model) else None
    return dec


def _stamp(model) -> tuple:
    """What the handles were made from: kernel installs, and the weights' dtype and device (``model.to(...)``)."""
    weight = model.model.embed_tokens.weight
    return getattr(model, kernels.SWAPS, 0), weight.dtype, weight.device


def _growing_layers(cache, count: int) -> bool:
    """Whether ``cache`` has ``count`` layers that grow by ``update`` (made now if the cache makes them lazily)."""
    make = getattr(cache, "layer_class_to_replicate", None)
    if make is not None and len(cache.layers) < count:
        first = make()
        if not getattr(first, "grows", False):  # another cache's layers: leave the cache as it is
            return False
        cache.layers.append(first)
        while len(cache.layers) < count:
            cache.layers.append(make())
    return len(cache.layers) == count and all(getattr(layer, "grows", False) for layer in cache.layers)


def run(cache, model, tokens: list[int], parents: list[int] | None, keep: int | None) -> torch.Tensor | None:
    """One forward of ``tokens`` (a chain, or a tree by ``parents``) after ``cache``'s prefix by the lean path;
    None when ``model`` has none. One row needs no mask; more rows take the cache's tree mask (a chain is the tree
    ``-1, 0, 1, ...``) and only a chain returns fewer than all rows."""
    dec = decoder_for(model)
    if dec is None or not _growing_layers(cache, len(dec.layers)):
        return None
    dev = dec.embed.weight.device
    ids = torch.tensor(tokens, dtype=torch.long, device=dev)
    chain = parents is None or is_chain(parents)
    keep = keep if chain else None
    prefill = keep == 0 and cache.length == 0  # a prompt's prefill: the one forward whose rows may take any order
    if len(tokens) == 1 and dec.windows_shown_by(cache):
        mask, pos = None, torch.tensor([cache.length], device=dev)
    elif prefill and plain_causal(len(tokens), dec.windows):  # SDPA's own rule in every layer: no mask to build
        mask, pos = CAUSAL, torch.arange(len(tokens), device=dev)
    else:
        mask, pos = cache.tree_inputs(model, chain_parents(len(tokens) - 1) if chain else parents)
        pos = pos[0].to(dev)
        mask = masks_to(mask, dev, torch.float32 if dec.wide else None)
        mask = causal_full_layers(mask) if prefill else mask
    # tokens a wide or compiled blocks model is fed after a prefix (keep=0, a non-empty cache) run as rows that are
    # read (one is), so their keys and values are bit for bit those of the same tokens verified or decoded one by one
    fed = (dec.wide or dec.fused is not None) and keep == 0 and not prefill
    with kernels.active(), any_order(prefill):
        logits = dec.forward(cache, ids, pos, mask, 1 if fed else keep,
                             greedy=bool(getattr(cache, "greedy", False)) and not fed and keep != 0)
    return logits[:0] if fed else logits


def run_rows(cache, model, ids: torch.Tensor, positions: torch.Tensor, masks, real: torch.Tensor,
             greedy: bool = False) -> torch.Tensor | GreedyRows | None:
    """One forward of a batch (:meth:`specdec_cli.runtime.batch_cache.BatchCache.forward_rows`: ``ids``, ``positions``
    and ``real`` ``[B, n]``, ``masks`` its additive masks) by the lean path: logits ``[sum(real), V]`` of the real
    positions in row order, or None when ``model`` has no lean path or is wide (its exact attention and compiled
    layers serve one sequence). The same products, masks and attention as the module code, without its per-call
    machinery (a forward of ``B`` rows calls each module once, as one sequence's does). ``greedy``: the tokens
    instead where the head's screen proves them (:mod:`.head_screen`)."""
    dec = decoder_for(model)
    if dec is None or dec.wide:
        return None
    with kernels.active():
        return dec.forward(cache, ids, positions, masks, None, real=real, greedy=greedy)


def takes_every_forward(model) -> bool:
    """Whether every forward of ``model``, whatever its row count, runs here (a wide or compiled blocks model)."""
    dec = decoder_for(model)
    return dec is not None and (dec.wide or dec.fused is not None)


def disable(model) -> None:
    """Run this model's forwards through transformers' own module code (``--kernels torch``)."""
    _DECODERS[model] = None
