"""Retrieval datastores, one registry of kinds: REST's suffix arrays and ADED's tri-gram matrices.

Both kinds share the on-disk conventions of ``format.py`` (manifest written last, temp-dir builds, size and
structure checks at load) and one signature each for building and loading::

    KINDS[kind].build(token_docs, out, *, fingerprint, vocab_size, progress=True, meta=None, **kind_options)
    KINDS[kind].load(folder, fingerprint=None, verify=False)

Modules: ``format`` (coding, manifest, integrity), ``build`` / ``search`` / ``retrieval`` (suffix arrays),
``trigram`` / ``trigram_matrix`` (tri-grams), ``tokenize`` (tokenizer worker processes) and ``pipeline``
(corpus -> datastore, the library side of ``specdec build-datastore``). Format: docs/datastore-format.md.
"""

from dataclasses import dataclass
from typing import Callable

from .build import build_suffix_array_datastore
from .format import FORMAT_VERSION, token_width
from .retrieval import SuffixArrayDatastore
from .trigram import build_trigram_datastore
from .trigram_matrix import TrigramMatrix


@dataclass(frozen=True)
class Kind:
    build: Callable  # (token_docs, out, *, fingerprint, vocab_size, progress, meta, **options) -> manifest/stats
    load: Callable  # (folder, fingerprint=None, verify=False) -> the opened store
    method: str  # the method that drafts from it


KINDS = {
    "suffix-array": Kind(build_suffix_array_datastore, SuffixArrayDatastore.load, "rest"),
    "trigram": Kind(build_trigram_datastore, TrigramMatrix.load, "aded"),
}

__all__ = ["KINDS", "Kind", "build_suffix_array_datastore", "build_trigram_datastore", "SuffixArrayDatastore",
           "TrigramMatrix", "FORMAT_VERSION", "token_width"]
