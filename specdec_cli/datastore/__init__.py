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

from .suffix_array.build import build_suffix_array_datastore
from .format import FORMAT_VERSION, token_width
from .suffix_array.retrieval import SuffixArrayDatastore
from .trigram.store import build_trigram_datastore
from .trigram.matrix import TrigramMatrix


@dataclass(frozen=True)
class Kind:
    build: Callable  # (token_docs, out, *, fingerprint, vocab_size, progress, meta, **options) -> manifest/stats
    load: Callable  # (folder, fingerprint=None, verify=False) -> the opened store
    method: str  # the method that drafts from it


KINDS = {
    "suffix-array": Kind(build_suffix_array_datastore, SuffixArrayDatastore.load, "rest"),
    "trigram": Kind(build_trigram_datastore, TrigramMatrix.load, "aded"),
}

def store_kind(folder) -> str:
    """The kind of the datastore in ``folder``, from its manifest (one clear error when it is none)."""
    import json
    from pathlib import Path

    from ..errors import SpecdecError
    from .format import FORMAT, MANIFEST

    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("kind") not in KINDS:
        raise SpecdecError(f"datastore {folder}: no readable specdec datastore manifest ({MANIFEST}); build one with "
                           "`specdec build-datastore`")
    return manifest["kind"]


def check_stores_tokenizer(folders, model: str) -> None:
    """Each store was built with ``model``'s tokenizer: checked with the tokenizer alone, before weights load."""
    import json
    from pathlib import Path

    from ..io.models import load_tokenizer, tokenizer_fingerprint
    from .format import MANIFEST, check_tokenizer

    fingerprint = tokenizer_fingerprint(load_tokenizer(model))
    for folder in folders:
        manifest = json.loads((Path(folder) / MANIFEST).read_text())  # read and checked by the pre-check
        check_tokenizer(Path(folder), manifest, fingerprint)


def open_store(folder, fingerprint: str | None = None, verify: bool = False):
    """``(kind, store)`` for a datastore of any kind."""
    kind = store_kind(folder)
    return kind, KINDS[kind].load(folder, fingerprint=fingerprint, verify=verify)


__all__ = ["store_kind", "open_store", "check_stores_tokenizer", "KINDS", "Kind", "build_suffix_array_datastore", "build_trigram_datastore", "SuffixArrayDatastore",
           "TrigramMatrix", "FORMAT_VERSION", "token_width"]
