"""On-disk format of specdec datastores (see docs/datastore-format.md): token coding, manifest, checks.

Both kinds -- REST's suffix arrays (``kind: "suffix-array"``) and ADED's tri-gram matrices (``kind: "trigram"``,
see ``datastore/trigram.py``) -- share one manifest layout (``format``, ``kind``, ``format_version``,
``tokenizer_fingerprint``, ``vocab_size``, ``files`` with sizes and sha256s), written last, and one way of being
built: into a temporary sibling directory that is renamed into place when complete.

Tokens are stored as fixed-width big-endian bytes so that a *byte-level* suffix array (libdivsufsort) sorts
token-aligned suffixes in token order: big-endian fixed width makes byte order equal token order.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ..atomic import replace_dir, write_text
from ..errors import SpecdecError

FORMAT = "specdec-datastore"
KIND = "suffix-array"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
VERSIONS = {"suffix-array": FORMAT_VERSION, "trigram": 1}  # format version of each kind this specdec reads
COMMON_KEYS = ("tokenizer_fingerprint", "vocab_size", "files")
REQUIRED = {"suffix-array": COMMON_KEYS + ("token_width", "shards"), "trigram": COMMON_KEYS}
MAX_WIDTH2_VOCAB = 0xFFFF - 1  # ids 0..65533 fit in 2 bytes with 0xFFFF kept for the separator
MAX_WIDTH3_VOCAB = 0xFFFFFF - 1


def token_width(vocab_size: int) -> int:
    """Bytes per token: 2 if the vocabulary has at most 65,534 ids, else 3."""
    if vocab_size <= MAX_WIDTH2_VOCAB:
        return 2
    if vocab_size <= MAX_WIDTH3_VOCAB:
        return 3
    raise SpecdecError(f"vocabulary of {vocab_size} ids is too large for a 3-byte suffix-array datastore")


def separator(width: int) -> int:
    """The separator id: the largest value of the width (all bytes 0xFF), never a real token id."""
    return (1 << (8 * width)) - 1


def encode_tokens(ids, width: int) -> np.ndarray:
    """Token ids -> uint8 big-endian bytes of ``width`` each."""
    arr = np.asarray(ids, dtype=np.uint32)
    shifts = np.arange(width - 1, -1, -1, dtype=np.uint32) * 8
    return ((arr[:, None] >> shifts[None, :]) & 0xFF).astype(np.uint8).reshape(-1)


def decode_tokens(data: np.ndarray, width: int) -> np.ndarray:
    """uint8 big-endian bytes (last axis a multiple of ``width``) -> int64 token ids (separator included)."""
    data = np.asarray(data, dtype=np.uint8)
    groups = data.reshape(*data.shape[:-1], data.shape[-1] // width, width).astype(np.int64)
    out = groups[..., 0]
    for k in range(1, width):
        out = (out << 8) | groups[..., k]
    return out


def sha256_file(path: Path, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            h.update(chunk)
    return h.hexdigest()


def file_entry(path: Path) -> dict:
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def write_manifest(folder: Path, manifest: dict) -> None:
    """Written last (after every data file is complete), in one rename."""
    write_text(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def check_out_dir(out: Path) -> None:
    """Before a build: ``out`` may be new, an empty folder, or a folder holding exactly what a datastore build wrote
    there (its manifest and the files the manifest lists, at their recorded sizes), which the build replaces.
    Anything else -- a file, a folder of other things, a manifest that only looks like ours, a datastore with files
    a user added -- is refused, so a build never deletes a file it did not write."""
    out = Path(out)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise SpecdecError(f"--out {out} exists and is not a folder; refusing to replace it")
    if not out.is_dir() or not any(out.iterdir()):
        return
    try:
        manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SpecdecError(f"--out {out} exists and is not a specdec datastore; refusing to replace it "
                           "(choose a new or empty folder)")
    files = manifest.get("files")
    listed = set(files) if isinstance(files, dict) else set()
    valid = (manifest.get("kind") in VERSIONS and isinstance(files, dict) and bool(files)
             and all(isinstance(e, dict) and "/" not in name and name not in (MANIFEST, ".", "..")
                     for name, e in files.items()))
    if valid:
        for entry in out.iterdir():
            name = entry.name
            if name == MANIFEST and entry.is_file() and not entry.is_symlink():
                continue
            if name not in listed or entry.is_symlink() or not entry.is_file() \
                    or entry.stat().st_size != files[name].get("bytes"):
                valid = False
                break
        valid = valid and all((out / name).is_file() for name in listed)
    if not valid:
        raise SpecdecError(f"--out {out} holds more or other than a datastore build wrote (a partial manifest, or "
                           "files added by hand); refusing to replace it (move those files, or choose a new folder)")


def move_into_place(tmp: Path, out: Path) -> None:
    """Replace ``out`` by the finished ``tmp``; an old datastore there is removed only now."""
    if out.exists():
        check_out_dir(out)
    replace_dir(tmp, out)


def read_manifest(folder: Path, kind: str = KIND) -> dict:
    """Parse and sanity-check the manifest of a ``kind`` datastore; every problem is one SpecdecError line."""
    path = folder / MANIFEST
    if not folder.is_dir():
        raise SpecdecError(f"datastore {folder}: no such directory")
    if not path.exists():
        raise SpecdecError(f"datastore {folder}: no {MANIFEST} (not a datastore, or the build did not finish; "
                           f"build one with `specdec build-datastore --kind {kind}`)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise SpecdecError(f"datastore {folder}: corrupt {MANIFEST} ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SpecdecError(f"datastore {folder}: {MANIFEST} is not a specdec datastore manifest")
    if manifest.get("kind") != kind:
        raise SpecdecError(f"datastore {folder} is a {manifest.get('kind')!r} datastore; this needs {kind!r}")
    if manifest.get("format_version") != VERSIONS[kind]:
        raise SpecdecError(f"datastore {folder}: {kind} format version {manifest.get('format_version')} is not "
                           f"supported (this specdec reads version {VERSIONS[kind]}); rebuild it with "
                           f"`specdec build-datastore`")
    for key in REQUIRED[kind]:
        if key not in manifest:
            raise SpecdecError(f"datastore {folder}: {MANIFEST} lacks {key!r}")
    return manifest


def check_files(folder: Path, manifest: dict, verify: bool = False) -> None:
    """Every listed file exists with its recorded size (cheap, always); with ``verify`` also its sha256."""
    for name, entry in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            raise SpecdecError(f"datastore {folder}: missing file {name} (truncated copy?)")
        size = path.stat().st_size
        if size != entry.get("bytes"):
            raise SpecdecError(f"datastore {folder}: {name} has {size} bytes, the manifest says {entry.get('bytes')} "
                               f"(truncated or altered)")
        if verify and sha256_file(path) != entry.get("sha256"):
            raise SpecdecError(f"datastore {folder}: checksum mismatch for {name} (corrupt file)")


def check_tokenizer(folder: Path, manifest: dict, fingerprint: str) -> None:
    if manifest["tokenizer_fingerprint"] != fingerprint:
        raise SpecdecError(
            f"datastore {folder} was built with another tokenizer (fingerprint {manifest['tokenizer_fingerprint'][:8]}, "
            f"model {manifest.get('model')!r}) than this model's ({fingerprint[:8]}); rebuild it with "
            f"`specdec build-datastore --model ...` for this model")
