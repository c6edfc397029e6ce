"""Drafting with a model whose tokenizer is not the target's: its text carried across exactly, at the byte level.

Every token of either vocabulary is a byte string (:class:`ByteVocab`): byte-level BPE pieces map through GPT-2's
byte alphabet, SentencePiece pieces turn ``▁`` into a space and ``<0xNN>`` byte-fallback tokens into their byte;
special and control tokens are empty (they are markup, not text). The target's sequence is then a byte string, and
:class:`TokenBridge` keeps the draft's view of it in step:

* :meth:`TokenBridge.draft_context` -- the draft's token ids for the target's text so far. Only the unsettled tail
  is re-tokenized with the draft's tokenizer (the last few draft tokens and the new text), so the draft's cache
  keeps everything before it; bytes that do not yet form a whole UTF-8 character wait for the next step.
* :meth:`TokenBridge.to_target` -- the draft's continuation as target token ids: its bytes after the target's
  text, tokenized with the target's tokenizer together with the target's last token (so a token that merges across
  the boundary is seen), cut before the first token that may still change with the text that follows.

Nothing here decides what is emitted: the translated draft is a fixed candidate that the target verifies with the
exact tree walk, so greedy output is identical to ``ar`` and sampled output is distributed as ``p_target`` whatever
the translation gets wrong -- it can only cost acceptance.
"""

from __future__ import annotations

import json
import re

_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
SETTLE_TOKENS = 2  # draft tokens re-tokenized with every new text (a merge rarely reaches further back)


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's reversible byte <-> printable character map, reversed."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _decoder_kinds(tokenizer) -> set[str]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return set()
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    return {p.get("type", "") for p in parts if p}


class ByteVocab:
    """The bytes of every token id of a tokenizer (special tokens: ``b""``)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        kinds = _decoder_kinds(tokenizer)
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        special = set(tokenizer.all_special_ids)
        special |= {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special}
        if "ByteLevel" in kinds:
            table = _gpt2_byte_decoder()
            convert = lambda piece: bytes(table[c] for c in piece) if all(c in table for c in piece) else None  # noqa: E731
        elif "ByteFallback" in kinds or "Metaspace" in kinds or "Replace" in kinds:
            def convert(piece):
                m = _BYTE_PIECE.match(piece)
                return bytes([int(m.group(1), 16)]) if m else piece.replace("\u2581", " ").encode("utf-8")
        else:
            convert = None
        self.bytes: list[bytes] = []
        for i, piece in enumerate(pieces):
            b = None if i in special or piece is None else (convert(piece) if convert else None)
            if b is None and i not in special and piece is not None:
                b = tokenizer.decode([i]).encode("utf-8")  # a tokenizer family not covered above: its own decoding
            self.bytes.append(b or b"")

    def text(self, ids) -> bytes:
        table, n = self.bytes, len(self.bytes)
        return b"".join(table[i] for i in ids if 0 <= i < n)

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text: special-token markup in it stays text (it never becomes a control token)."""
        return list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def leading_ids(self) -> list[int]:
        """What the tokenizer puts before every text it encodes (a BOS token), for a draft's context."""
        ids = list(self.tokenizer("a", add_special_tokens=True)["input_ids"])
        return ids[:1] if len(ids) > 1 and not self.bytes[ids[0]] else []


def _ends(vocab: ByteVocab, ids: list[int], start: int, end: int, chunk: bytes) -> list[int]:
    """Byte offset after each of ``ids`` (the tokens of ``chunk = text[start:end]``). When their bytes are not the
    chunk's (invalid UTF-8 replaced, a tokenizer that prepends a space marker or normalises), every token ends at
    ``end``: the chunk then stays whole and is never cut where its bytes do not line up."""
    if vocab.text(ids) != chunk:
        return [end] * len(ids)
    out, pos = [], start
    for i in ids:
        pos += len(vocab.bytes[i])
        out.append(pos)
    return out


_VOCABS: dict[int, tuple[object, ByteVocab]] = {}


def byte_vocab(tokenizer) -> ByteVocab:
    """The :class:`ByteVocab` of ``tokenizer``, built once per tokenizer object (a 262k vocabulary takes ~1 s)."""
    entry = _VOCABS.get(id(tokenizer))
    if entry is None or entry[0] is not tokenizer:
        entry = _VOCABS[id(tokenizer)] = (tokenizer, ByteVocab(tokenizer))
    return entry[1]


def _whole(data: bytes) -> str:
    return data[: whole_chars(data)].decode("utf-8", errors="replace")


def whole_chars(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that is whole UTF-8 characters."""
    end = len(data)
    for back in range(1, min(4, end) + 1):
        b = data[end - back]
        if b < 0x80:
            return end if back == 1 else end - back + 1
        if b >= 0xC0:  # a lead byte: is its character complete?
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return end if back >= need else end - back
    return end


class TokenBridge:
    """The draft's token ids for the target's sequence, kept incrementally, and draft continuations as target ids."""

    def __init__(self, target: ByteVocab, draft: ByteVocab):
        self.target, self.draft = target, draft
        self.lead = draft.leading_ids()  # the draft's BOS, when its tokenizer starts every text with one
        self.reset()

    def reset(self) -> None:
        self.target_ids: list[int] = []
        self.target_ends: list[int] = []  # byte offset after each target token
        self.text = b""  # the target's sequence as bytes
        self.draft_ids: list[int] = []  # the draft's tokens for text[:settled]
        self.ends: list[int] = []  # byte offset after each draft token
        self.settled = 0

    def draft_context(self, target_ids: list[int]) -> list[int]:
        """The draft's token ids for ``target_ids``'s text (whole characters only), after the draft's BOS."""
        n = self.common_prefix(target_ids)
        if not (n == len(target_ids) == len(self.target_ids) and self.draft_ids):
            self._extend(target_ids, n)
        return self.lead + self.draft_ids if self.draft_ids else []

    def _extend(self, target_ids: list[int], n: int) -> None:
        if n < len(self.target_ids):  # a path the target did not take (auto grows chains from tree nodes)
            self.roll_back(n)
        for i in target_ids[n:]:
            self.text += self.target.text([i])
            self.target_ends.append(len(self.text))
        self.target_ids = list(target_ids)
        keep = max(0, len(self.draft_ids) - SETTLE_TOKENS)
        while keep and (self.ends[keep - 1] == self.ends[keep] or 0x80 <= self.text[self.ends[keep - 1]] < 0xC0):
            keep -= 1  # never cut inside a block of tokens that share their end, nor inside a character
        start = self.ends[keep - 1] if keep else 0
        end = whole_chars(self.text)
        chunk = self.text[start:end]
        tail = self.draft.encode(chunk.decode("utf-8", errors="replace")) if end > start else []
        self.draft_ids = self.draft_ids[:keep] + tail
        self.ends = self.ends[:keep] + _ends(self.draft, tail, start, end, chunk)
        self.settled = end
    def common_prefix(self, target_ids: list[int]) -> int:
        old, n = self.target_ids, min(len(self.target_ids), len(target_ids))
        if old[:n] == target_ids[:n]:
            return n
        i = 0
        while old[i] == target_ids[i]:
            i += 1
        return i

    def roll_back(self, n: int) -> None:
        """Forget the target tokens after the first ``n`` and the draft tokens that reach past their text."""
        size = self.target_ends[n - 1] if n else 0
        self.target_ids, self.target_ends, self.text = self.target_ids[:n], self.target_ends[:n], self.text[:size]
        keep = len(self.ends)
        while keep and self.ends[keep - 1] > size:
            keep -= 1
        self.draft_ids, self.ends = self.draft_ids[:keep], self.ends[:keep]
        self.settled = self.ends[-1] if self.ends else 0

    def to_target(self, continuation: list[int], final: bool = False) -> tuple[list[int], list[int]]:
        """Target token ids for the draft's ``continuation`` (draft ids after :meth:`draft_context`'s), and for each
        the index of the draft token that holds its last byte (for the draft's per-token scores). The last target
        token is dropped unless ``final`` (the draft reached its end of sequence): it may still grow with the text
        that follows."""
        new = self.draft.text(continuation)
        pending = self.text[self.settled:]  # bytes of a character the target has begun and the draft has not seen
        if not new.startswith(pending):
            return [], []
        new = new[len(pending):]
        last = self.target_ids[-1] if self.target_ids else None
        anchor = self.target.bytes[last] if last is not None and not pending else b""
        ids = self.target.encode(_whole(anchor + new)) if anchor else []
        if ids[:1] == [last]:
            ids = ids[1:]  # the target's tokenizer keeps its last token: the rest follows it
        else:  # no anchor, or the text merges into the target's last token, which is already emitted
            ids = self.target.encode(_whole(new))
        ids = ids if final else ids[:-1]
        return ids, _covering(self.draft, continuation, self.target, ids, len(pending))


def _covering(draft: ByteVocab, continuation: list[int], target: ByteVocab, ids: list[int], skip: int) -> list[int]:
    """For each target token of ``ids``, the index of the draft token of ``continuation`` holding its last byte."""
    draft_ends, pos = [], -skip
    for i in continuation:
        pos += len(draft.bytes[i])
        draft_ends.append(pos)
    out, pos, j = [], 0, 0
    for i in ids:
        pos += len(target.bytes[i])
        while j < len(draft_ends) - 1 and draft_ends[j] < pos:
            j += 1
        out.append(j)
    return out
