"""Where text may be cut for tokenizing by pieces (:mod:`.pieces`): one compiled scan over a text's code points
(:func:`cut_starts`). The rules, and why they are exact: :func:`.pieces.piece_rule`.
"""

from __future__ import annotations

import numpy as np

from ...runtime.jit import njit


def pair_table(pairs: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """An open-addressing set of the pair keys (-1: empty), and a dense matrix for ASCII pairs."""
    size = 1 << max(4, int(np.ceil(np.log2(4 * max(1, len(pairs))))))
    table = np.full(size, -1, dtype=np.int64)
    ascii_pairs = np.zeros((128, 128), dtype=np.uint8)
    for key in pairs:
        a, b = key >> 21, key & ((1 << 21) - 1)
        if a < 128 and b < 128:
            ascii_pairs[a, b] = 1
        j = _slot(np.int64(key), size - 1)
        while table[j] >= 0:
            j = (j + 1) & (size - 1)
        table[j] = key
    return table, ascii_pairs


@njit(cache=True, nogil=True)
def _slot(key, mask):
    return np.int64((np.uint64(key) * np.uint64(11400714819323198485)) >> np.uint64(40)) & mask


@njit(cache=True, nogil=True)
def _joined(a, b, table, ascii_pairs):
    """Whether some token holds characters ``a``, ``b`` side by side."""
    if a < 128 and b < 128:
        return ascii_pairs[a, b] != 0
    key = (np.int64(a) << 21) | np.int64(b)
    mask = table.size - 1
    j = _slot(key, mask)
    while table[j] >= 0:
        if table[j] == key:
            return True
        j = (j + 1) & mask
    return False


@njit(cache=True, nogil=True)
def _ascii_class(c):
    """0: not ASCII; 1: letter; 2: digit; 3: whitespace; 4: punctuation."""
    if c >= 128:
        return 0
    if 97 <= (c | 32) <= 122:
        return 1
    if 48 <= c <= 57:
        return 2
    if c == 32 or 9 <= c <= 13:
        return 3
    return 4


@njit(cache=True, nogil=True)
def _space_word_cut(prev, c, after):
    """Whether GPT-2's pre-tokenizer regex starts a pre-token at ``c`` (between ``prev`` and it; ``after``
    follows it, -1 at the end) whatever else surrounds them (see :func:`piece_rule`)."""
    kp, kc = _ascii_class(prev), _ascii_class(c)
    if c == 32:  # a space before a letter: `` ?\p{L}+`` starts there, whatever precedes it
        return after >= 0 and _ascii_class(after) == 1
    if c == 10:  # a newline after a non-space: every run before it (letters, digits, punctuation) stops there
        return kp == 1 or kp == 2 or kp == 4
    if (kp == 1 or kp == 2) and kc == 4:  # a letter or digit run stops at punctuation
        return True
    return kp == 4 and prev != 39 and (kc == 1 or kc == 2)  # a punctuation run stops (not a contraction's ')


@njit(cache=True, nogil=True)
def cut_starts(cp, doc_ends, space_word, table, ascii_pairs):
    """Start of every piece (int64, then the end of the text), and each document's number of pieces; a cut at
    every document start and, within one:

    * ``"pairs"`` rule (``space_word`` false): between two characters that no token holds side by side
      (``table``, ``ascii_pairs``: every pair that some token holds);
    * ``"space-word"`` rule: where GPT-2's pre-tokenizer regex starts a pre-token in any context
      (:func:`_space_word_cut`), except between two characters side by side in an added token (the pairs)."""
    starts = np.empty(cp.size + 1, dtype=np.int64)
    per_doc = np.zeros(doc_ends.size, dtype=np.int64)
    n = 0
    begin = 0
    for d in range(doc_ends.size):
        end = doc_ends[d]
        for i in range(begin, end):
            if i == begin:
                cut = True
            elif space_word:
                cut = (_space_word_cut(cp[i - 1], cp[i], cp[i + 1] if i + 1 < end else -1)
                       and not _joined(cp[i - 1], cp[i], table, ascii_pairs))
            else:
                cut = not _joined(cp[i - 1], cp[i], table, ascii_pairs)
            if cut:
                starts[n] = i
                n += 1
                per_doc[d] += 1
        begin = end
    starts[n] = cp.size
    return starts[: n + 1], per_doc
