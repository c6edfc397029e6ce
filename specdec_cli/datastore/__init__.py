"""Retrieval datastores, one registry of kinds: REST's suffix arrays and ADED's tri-gram matrices.

``KINDS`` is the one place that knows the kinds: their names, builders, store classes and build options. Both
kinds share the on-disk conventions of ``format.py`` (manifest written last, temp-dir builds, size and structure
checks at load) and one signature each for building and loading::

    KINDS[kind].build(token_docs, out, *, fingerprint, vocab_size, progress=True, meta=None, **kind_options)
        -> format.BuildSummary (one shape for every kind)
    KINDS[kind].load(folder, fingerprint=None, verify=False) -> the opened store

A run opens each store once (:func:`open_once`, in the pre-check before any model loads) and hands the opened
stores to its methods (:func:`drafting_store`), which each get their own view (a tri-gram matrix's adapted rows
are per drafter; the memory-mapped base is shared).

The registry is read without NumPy or numba (``specdec --help``, option checks): the modules of a kind are
imported when it builds or loads. Modules: ``format`` (coding, manifest, integrity), ``suffix_array/`` (build,
search, retrieval), ``trigram/`` (store, matrix), ``tokenizing/`` (tokenizer worker processes) and ``pipeline``
(corpus -> datastore, the library side of ``specdec build-datastore``). Format: docs/datastore-format.md.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

SUFFIX_ARRAY = "suffix-array"
TRIGRAM = "trigram"


@dataclass(frozen=True)
class Kind:
    name: str
    builder: str  # "module:function" in this package: (token_docs, out, *, fingerprint, ...) -> BuildSummary
    store: str  # "module:Class" in this package, with ``load(folder, fingerprint=None, verify=False)``
    source: str  # "module:Class" of auto's draft source for it (``Source.for_store(store, top_c)``)
    chains: str  # "module:Class" of the chain drafter's source for it (the vLLM proposer: ``Class(store)``)
    build_options: tuple[str, ...] = ()  # pipeline options this kind's builder takes

    def build(self, *args, **kwargs):
        return _attr(self.builder)(*args, **kwargs)

    def load(self, folder, fingerprint: str | None = None, verify: bool = False):
        return _attr(self.store).load(folder, fingerprint=fingerprint, verify=verify)

    def auto_source(self):
        """The class of ``auto``'s source drafting from this kind (imported when a drafter is built)."""
        return _attr(self.source)

    def chain_source(self):
        """The class of the chain drafter's source for this kind (:mod:`specdec_cli.serving`)."""
        return _attr(self.chains)


def _attr(spec: str):
    module, name = spec.split(":")
    return getattr(importlib.import_module(module, __name__), name)


KINDS = {
    SUFFIX_ARRAY: Kind(SUFFIX_ARRAY, ".suffix_array.build:build_suffix_array_datastore",
                       ".suffix_array.retrieval:SuffixArrayDatastore", "..drafting.sources:SuffixArraySource",
                       "..serving.chain_sources:SuffixArrayChains", ("shard_bytes", "token_bar")),
    TRIGRAM: Kind(TRIGRAM, ".trigram.store:build_trigram_datastore", ".trigram.matrix:TrigramMatrix",
                  "..drafting.sources:TrigramSource", "..serving.chain_sources:TrigramChains"),
}
DEFAULT_KIND = SUFFIX_ARRAY
LAZY = {"build_suffix_array_datastore": KINDS[SUFFIX_ARRAY].builder, "SuffixArrayDatastore": KINDS[SUFFIX_ARRAY].store,
        "build_trigram_datastore": KINDS[TRIGRAM].builder, "TrigramMatrix": KINDS[TRIGRAM].store,
        "FORMAT_VERSION": ".format:FORMAT_VERSION", "token_width": ".format:token_width"}


def __getattr__(name: str):  # the heavy names, imported on first use
    if name in LAZY:
        return _attr(LAZY[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class OpenStore:
    """A datastore opened (structure checked) once for a run."""

    folder: str
    kind: str
    store: object  # SuffixArrayDatastore or TrigramMatrix
    manifest: dict


def store_kind(folder) -> str:
    """The kind of the datastore in ``folder``, from its manifest (one clear error when it is none)."""
    from ..errors import SpecdecError
    from ..io.jsonl import read_json
    from .format import FORMAT, MANIFEST

    path = Path(folder) / MANIFEST
    try:
        manifest = read_json(path)
    except (OSError, ValueError, UnicodeDecodeError):
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("kind") not in KINDS:
        raise SpecdecError(f"datastore {folder}: no readable specdec datastore manifest ({MANIFEST}); build one with "
                           "`specdec build-datastore`")
    return manifest["kind"]


def check_stores_tokenizer(folders, model: str) -> None:
    """Each store was built with ``model``'s tokenizer: checked with the tokenizer and the manifest alone, before
    weights load."""
    from ..io.jsonl import read_json
    from ..io.models import load_tokenizer, tokenizer_fingerprint
    from .format import MANIFEST, check_tokenizer

    fingerprint = tokenizer_fingerprint(load_tokenizer(model))
    for folder in folders:
        manifest = read_json(Path(folder) / MANIFEST)  # read and checked by the pre-check
        check_tokenizer(Path(folder), manifest, fingerprint)


def open_store(folder, fingerprint: str | None = None, verify: bool = False, kind: str | None = None):
    """``(kind, store)`` for a datastore of ``kind`` (any kind when ``None``: told by its manifest)."""
    kind = kind or store_kind(folder)
    return kind, KINDS[kind].load(folder, fingerprint=fingerprint, verify=verify)


def open_once(opened: dict, folder, kind: str | None = None) -> OpenStore:
    """The store in ``folder``, opened (without the tokenizer check) unless ``opened`` holds it; kept there."""
    entry = opened.get(str(folder))
    if entry is not None:
        if kind is not None and entry.kind != kind:
            from .format import read_manifest

            read_manifest(Path(folder), kind)  # refuses it: "is a ... datastore; this needs ..."
        return entry
    kind, store = open_store(folder, kind=kind)
    entry = OpenStore(str(folder), kind, store, store.manifest)
    opened[str(folder)] = entry
    return entry


def drafting_store(opened: dict, folder, *, kind: str | None = None, fingerprint: str | None = None,
                   verify: bool = False) -> tuple[str, object]:
    """``(kind, store)`` a drafter drafts from: the run's opened store (opened now when the caller did not open
    it), checked against ``fingerprint`` (its manifest), every file's sha256 checked when ``verify``; the drafter
    gets its own view of it."""
    from . import format as fmt

    if str(folder) not in opened:
        kind, store = open_store(folder, fingerprint, verify, kind)
        opened[str(folder)] = OpenStore(str(folder), kind, store, store.manifest)
        return kind, store.view()
    entry = open_once(opened, folder, kind)
    if fingerprint is not None:
        fmt.check_tokenizer(Path(folder), entry.manifest, fingerprint)
    if verify:
        fmt.check_files(Path(folder), entry.manifest, verify=True)
    return entry.kind, entry.store.view()


__all__ = ["store_kind", "open_store", "open_once", "drafting_store", "check_stores_tokenizer", "KINDS", "Kind",
           "OpenStore", "SUFFIX_ARRAY", "TRIGRAM", "DEFAULT_KIND", *LAZY]
