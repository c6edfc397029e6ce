"""Exact tokenization by cached pieces, for BPE tokenizers whose merges provably stay inside known boundaries.

Most of a datastore build's time is the Rust tokenizer (py-spy: 70% of a build), and most of that is merging the
same words again and again and allocating a string per token. Text can be cut, without changing a single id,
wherever no merge can cross: for a SentencePiece-style BPE with no pre-tokenizer (Gemma, Llama-2, Mistral)
between two characters that no token holds side by side (Gemma-3: about one cut per token on code); for GPT-2's
byte-level pre-tokenizer (SmolLM2) before a space that precedes a letter, which always starts a pre-token. The
cut *pieces* tokenize independently, and they repeat (Zipf).

So each worker keeps a bounded table ``piece -> ids`` in flat arrays (no Python object per piece; compiled
lookups that compare the whole piece, not only its hash), and encodes only the pieces it has not seen: all of a
batch's new pieces in one Rust call, joined by an added token (split off before anything else). When the table
is full it starts again. :func:`piece_rule` derives the rule from the tokenizer's own vocabulary and answers
``None`` for any tokenizer this reasoning does not cover; the build still checks its sample set, and
``tests/test_pieces.py`` compares whole corpora against the plain backend.
"""

from __future__ import annotations

import json
import re

import numpy as np

from .cuts import cut_starts, pair_table
from ...runtime.jit import COMPILED, njit

MAX_ENTRIES = 1 << 20  # pieces held per worker before its table starts again (~60 MB with their text and ids)
CP_PER_ENTRY = 8  # characters stored per entry (pieces average ~4 on code)
IDS_PER_ENTRY = 2
_BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


def piece_rule(backend_json: str) -> dict | None:
    r"""Where this backend's text can be cut without changing its tokens, or ``None``.

    Two kinds of tokenizer are covered; anything else answers ``None`` (the plain backend is used):

    * ``"pairs"`` -- SentencePiece-style BPE with no pre-tokenizer (Gemma, Llama-2, Mistral; the space
      replacement done in Python, see ``python_normalized``). ``pairs`` holds every two characters that stand
      side by side inside some token or added token (int64 keys ``a << 21 | b``); the text is cut between any
      other two, since no merge can produce a token spanning them. Requires no ``ignore_merges`` or word
      prefixes/suffixes, and no merge of byte-fallback tokens.
    * ``"space-word"`` -- GPT-2's byte-level pre-tokenizer (``ByteLevel``, its built-in regex, no prefix space:
      SmolLM2, GPT-2, StarCoder). Merges never leave a pre-token, and with that regex these always start one,
      whatever surrounds them (:func:`.cuts._space_word_cut`): a space before an ASCII letter (a letter, digit or
      punctuation run before it stops at the space; a whitespace run before it is matched without its last
      character, ``\s+(?!\S)``); a newline after an ASCII letter, digit or punctuation character; ASCII
      punctuation after a letter or digit; a letter or digit after punctuation other than ``'`` (the
      contractions ``'s``, ``'t``... start with it). Each piece, alone, splits into the same pre-tokens as in
      place: its last pre-token ends at the cut either way (a whitespace run at the end of the string is matched
      whole, as ``\s+(?!\S)`` matched it before a space). ``pairs`` here holds the added tokens' adjacent
      characters: no cut between those (added tokens are split off before the pre-tokenizer runs).

    Both require a BPE model without dropout, no normalizer, and added tokens without strip or single-word rules.
    ``separator`` is an added token (``"\n"`` where it is one): added tokens are split off before anything
    else, so new pieces are encoded in one call joined by it, and split again at ``separator_id``."""
    spec = json.loads(backend_json)
    model = spec.get("model") or {}
    added = spec.get("added_tokens") or []
    if (model.get("type") != "BPE" or model.get("dropout") or spec.get("normalizer")
            or any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") for t in added)):
        return None
    contents = [t.get("content") or "" for t in added]
    separator = _separator(added, contents)
    if separator is None:
        return None
    rule = {"separator": separator["content"], "separator_id": int(separator["id"])}
    pre = spec.get("pre_tokenizer")
    if pre is None:
        return _pairs_rule(model, added, rule)
    if pre == {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": pre.get("trim_offsets"),
               "use_regex": True}:
        return dict(rule, kind="space-word", pairs=_adjacent_pairs(contents))
    return None


def _separator(added: list[dict], contents: list[str]) -> dict | None:
    """The added token ``"\n"``, else the first added token that no other added token contains."""
    newline = next((t for t in added if t.get("content") == "\n"), None)
    if newline is not None:
        return newline
    return next((t for t in added if t.get("content") and sum(t["content"] in c for c in contents) == 1), None)


def _pairs_rule(model: dict, added: list[dict], rule: dict) -> dict | None:
    if model.get("ignore_merges") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None
    for merge in model.get("merges") or []:
        if any(_BYTE_TOKEN.match(side) for side in (merge if isinstance(merge, list) else merge.split(" ", 1))):
            return None
    strings = [t for t in model.get("vocab", {}) if not _BYTE_TOKEN.match(t)] + [t["content"] for t in added]
    return dict(rule, kind="pairs", pairs=_adjacent_pairs(strings))


def _adjacent_pairs(strings: list[str]) -> list[int]:
    """Keys ``a << 21 | b`` of every two characters side by side in one of ``strings``."""
    pairs: set[int] = set()
    for s in strings:
        codes = [ord(c) for c in s]
        pairs.update((a << 21) | b for a, b in zip(codes, codes[1:]))
    return sorted(pairs)


@njit(cache=True, nogil=True)
def _hash(cp, s, e):
    h = np.uint64(14695981039346656037)
    for i in range(s, e):
        h = (h ^ np.uint64(cp[i])) * np.uint64(1099511628211)
    return h ^ (h >> np.uint64(29))


@njit(cache=True, nogil=True)
def _lookup(cp, starts, slots, e_hash, e_cp, e_len, e_ids, cp_store, state):
    """Entry of every piece; new pieces get an entry whose ids are pending (``e_ids[entry, 1] == -1``).
    ``state``: [entries used, characters stored, ids stored]. Returns (entry per piece, new entries, the piece
    that created each, whether all fitted: if not, the caller clears the table and asks again)."""
    n = starts.size - 1
    entries = np.empty(n, dtype=np.int64)
    fresh = np.empty(n, dtype=np.int64)
    first = np.empty(n, dtype=np.int64)
    nf = 0
    mask = slots.size - 1
    for p in range(n):
        s, e = starts[p], starts[p + 1]
        h = _hash(cp, s, e)
        j = np.int64(h & np.uint64(mask))
        while True:
            k = slots[j]
            if k < 0:
                if state[0] >= e_hash.size or state[1] + e - s > cp_store.size:
                    return entries, fresh[:nf], first[:nf], False
                k = state[0]
                state[0] += 1
                slots[j] = k
                e_hash[k] = h
                e_cp[k] = state[1]
                e_len[k] = e - s
                cp_store[state[1]: state[1] + e - s] = cp[s:e]
                state[1] += e - s
                e_ids[k, 0] = 0
                e_ids[k, 1] = -1
                fresh[nf] = k
                first[nf] = p
                nf += 1
                break
            if e_hash[k] == h and e_len[k] == e - s:
                o = e_cp[k]
                same = True
                for i in range(e - s):
                    if cp_store[o + i] != cp[s + i]:
                        same = False
                        break
                if same:
                    break
            j = (j + 1) & mask
        entries[p] = k
    return entries, fresh[:nf], first[:nf], True


@njit(cache=True, nogil=True)
def _fill(fresh, ids, offsets, e_ids, id_store, state):
    for f in range(fresh.size):
        k = fresh[f]
        a, b = offsets[f], offsets[f + 1]
        e_ids[k, 0] = state[2]
        e_ids[k, 1] = b - a
        id_store[state[2]: state[2] + b - a] = ids[a:b]
        state[2] += b - a


@njit(cache=True, nogil=True)
def _assemble(entries, e_ids, id_store):
    total = 0
    for p in range(entries.size):
        total += e_ids[entries[p], 1]
    out = np.empty(total, dtype=np.uint32)
    ends = np.empty(entries.size, dtype=np.int64)
    n = 0
    for p in range(entries.size):
        a, m = e_ids[entries[p], 0], e_ids[entries[p], 1]
        out[n: n + m] = id_store[a: a + m]
        n += m
        ends[p] = n
    return out, ends


class PieceEncoder:
    """Token ids of texts, by cached pieces (see the module's doc); ``tokenizer`` is the plain Rust backend
    (``tokenizers.Tokenizer``) that encodes the pieces not seen yet."""

    def __init__(self, tokenizer, rule: dict, max_entries: int = MAX_ENTRIES):
        self.tokenizer, self.separator, self.separator_id = tokenizer, rule["separator"], rule["separator_id"]
        self._encode_batch = batch_encoder(tokenizer)
        self.space_word = rule["kind"] == "space-word"
        self.pairs = pair_table(rule["pairs"])
        self.max_entries = max_entries
        self.slots = np.empty(1 << int(np.ceil(np.log2(2 * max_entries))), dtype=np.int32)
        self.e_hash = np.empty(max_entries, dtype=np.uint64)
        self.e_cp = np.empty(max_entries, dtype=np.int32)
        self.e_len = np.empty(max_entries, dtype=np.int32)
        self.e_ids = np.empty((max_entries, 2), dtype=np.int32)
        self.cp_store = np.empty(max_entries * CP_PER_ENTRY, dtype=np.uint32)
        self.id_store = np.empty(max_entries * IDS_PER_ENTRY, dtype=np.uint32)
        self.state = np.zeros(3, dtype=np.int64)
        self.clear()

    def clear(self) -> None:
        """Start the table again (when a batch might not fit in what is left)."""
        self.slots.fill(-1)
        self.state[:] = 0
        if self.id_store.size > self.max_entries * IDS_PER_ENTRY:  # grown for an unusual batch: back to size
            self.id_store = np.empty(self.max_entries * IDS_PER_ENTRY, dtype=np.uint32)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        if not texts:
            return []
        big = "".join(texts)
        cp = np.frombuffer(big.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        doc_ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
        starts, per_doc = cut_starts(cp, doc_ends, self.space_word, *self.pairs)
        pieces, st = starts.size - 1, self.state
        if pieces > self.max_entries or cp.size > self.cp_store.size:  # larger than the whole table: in halves
            half = len(texts) // 2
            if half == 0:
                return [np.asarray(self._encode_batch(texts, add_special_tokens=False)[0].ids, dtype=np.uint32)]
            return self.encode(texts[:half]) + self.encode(texts[half:])
        args = (cp, starts, self.slots, self.e_hash, self.e_cp, self.e_len, self.e_ids, self.cp_store, st)
        entries, fresh, first, fitted = _lookup(*args)
        if not fitted:  # the table is full: it starts again (frequent pieces come back at once)
            self.clear()
            entries, fresh, first, fitted = _lookup(*args)
        if fresh.size:
            ids, offsets = self._encode_fresh([big[starts[p]: starts[p + 1]] for p in first])
            if st[2] + ids.size > self.id_store.size:
                self.id_store = np.concatenate((self.id_store[: st[2]], np.empty(max(ids.size, self.id_store.size),
                                                                                 dtype=np.uint32)))
            _fill(fresh, ids, offsets, self.e_ids, self.id_store, st)
        out, ends = _assemble(entries, self.e_ids, self.id_store)
        bounds = np.concatenate(([0], ends))[np.cumsum(per_doc)]
        return np.split(out, bounds[:-1])

    def _encode_fresh(self, pieces: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Ids of the new pieces, flat, with offsets: in one Rust call, joined by the separator (an added token,
        split off before anything else) and split again at its id; pieces holding it (newline runs for
        Gemma-3) on their own."""
        sep = self.separator
        plain = [i for i, p in enumerate(pieces) if sep not in p]
        alone = [i for i, p in enumerate(pieces) if sep in p]
        parts: list = [None] * len(pieces)
        if plain:
            joined = sep.join(pieces[i] for i in plain)
            joined = np.asarray(self._encode_batch([joined], add_special_tokens=False)[0].ids, dtype=np.uint32)
            seps = np.flatnonzero(joined == self.separator_id)
            if seps.size == len(plain) - 1:
                for i, part in zip(plain, np.split(joined, seps)):
                    parts[i] = part[1:] if part.size and part[0] == self.separator_id else part
            else:  # an added token across a piece and the separator: not expected, but stay exact
                alone = list(range(len(pieces)))
        if alone:
            encoded = self._encode_batch([pieces[i] for i in alone], add_special_tokens=False)
            for i, e in zip(alone, encoded):
                parts[i] = np.asarray(e.ids, dtype=np.uint32)
        lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
        offsets = np.concatenate(([0], np.cumsum(lengths)))
        return np.concatenate(parts) if parts else np.empty(0, np.uint32), offsets


def batch_encoder(tokenizer):
    """The backend's ``encode_batch_fast`` (tokenizers >= 0.21: no offsets, which cost a byte-to-character map
    per text), else its ``encode_batch``."""
    return getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)


def usable() -> bool:
    """Only worth it compiled: as plain Python the table costs more than the merges it saves."""
    return COMPILED
