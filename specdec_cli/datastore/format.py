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
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..io.atomic import replace_dir, write_text
from ..io.jsonl import read_json
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
        manifest = read_json(out / MANIFEST)
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


@dataclass(frozen=True)
class BuildSummary:
    """What every kind's builder returns (one shape): ``details`` holds the kind's own counts."""

    kind: str
    tokens: int
    documents: int
    shards: int  # suffix-array shards (0 for a tri-gram store)
    bytes: int  # every file of the finished store
    details: dict = field(default_factory=dict)

    @classmethod
    def of(cls, out: Path, manifest: dict, **details) -> "BuildSummary":
        size = sum(p.stat().st_size for p in Path(out).iterdir() if p.is_file())
        return cls(manifest["kind"], int(manifest["num_tokens"]), int(manifest["num_documents"]),
                   len(manifest.get("shards", [])), size, details)


def read_manifest(folder: Path, kind: str = KIND) -> dict:
    """Parse and sanity-check the manifest of a ``kind`` datastore; every problem is one SpecdecError line."""
    path = folder / MANIFEST
    if not folder.is_dir():
        raise SpecdecError(f"datastore {folder}: no such directory")
    if not path.exists():
        raise SpecdecError(f"datastore {folder}: no {MANIFEST} (not a datastore, or the build did not finish; "
                           f"build one with `specdec build-datastore --kind {kind}`)")
    try:
        manifest = read_json(path)
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
    check_manifest_types(folder, manifest, kind)
    return manifest


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value, limit: int = 40) -> str:
    """A manifest value for an error message: its repr, one line, cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def plain_name(folder: Path, name, what: str) -> str:
    """``name`` if it is a bare file name (no folder part, no ``..``): manifests may only name files inside the
    datastore's own folder."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name
            or "\0" in name or Path(name).name != name):
        raise SpecdecError(f"datastore {folder}: {MANIFEST} names {what} {_show(name)}, which is not a file name "
                           f"inside the datastore folder")
    return name


def check_manifest_types(folder: Path, manifest: dict, kind: str) -> None:
    """The values the readers use have the types and ranges they need (a hand-edited or damaged manifest is one
    SpecdecError line, never a traceback); every file a shard names is listed in ``files``, so the file checks
    (size, plain file inside the folder, sha256) cover everything that is opened."""

    def bad(key: str, value, want: str):
        raise SpecdecError(f"datastore {folder}: {MANIFEST} has {key} = {_show(value)}; expected {want}")

    if not isinstance(manifest["tokenizer_fingerprint"], str):
        bad("tokenizer_fingerprint", manifest["tokenizer_fingerprint"], "a string")
    vocab = manifest["vocab_size"]
    if not _is_int(vocab) or vocab < 1:
        bad("vocab_size", vocab, "a positive whole number")
    files = manifest["files"]
    if not isinstance(files, dict) or not files:
        bad("files", files, "an object of {file name: {bytes, sha256}}")
    for name, entry in files.items():
        plain_name(folder, name, "a file")
        if not isinstance(entry, dict) or not _is_int(entry.get("bytes")) or entry["bytes"] < 0 \
                or not isinstance(entry.get("sha256"), str):
            bad(f"files[{name!r}]", entry, "{bytes: whole number, sha256: string}")
    for key in ("num_tokens", "num_documents"):
        if key in manifest and (not _is_int(manifest[key]) or manifest[key] < 0):
            bad(key, manifest[key], "a whole number")
    if kind != KIND:
        return
    width = manifest["token_width"]
    if width not in (2, 3) or not _is_int(width):
        bad("token_width", width, "2 or 3")
    if vocab > (MAX_WIDTH2_VOCAB if width == 2 else MAX_WIDTH3_VOCAB):
        bad("vocab_size", vocab, f"at most {MAX_WIDTH2_VOCAB if width == 2 else MAX_WIDTH3_VOCAB} ids for "
                                 f"{width}-byte tokens")
    shards = manifest["shards"]
    if not isinstance(shards, list) or not shards:
        bad("shards", shards, "a non-empty list of {data, sa, keys, ...}")
    for i, shard in enumerate(shards):
        if not isinstance(shard, dict):
            bad(f"shards[{i}]", shard, "an object {data, sa, keys, ...}")
        for key in ("data", "sa", "keys"):
            if key == "keys" and shard.get(key) is None:
                continue  # stores built before the top-level index existed
            if key not in shard:
                raise SpecdecError(f"datastore {folder}: {MANIFEST}: shards[{i}] lacks {key!r}")
            name = plain_name(folder, shard[key], f"shards[{i}].{key} =")
            if name not in files:
                raise SpecdecError(f"datastore {folder}: {MANIFEST}: shards[{i}].{key} = {_show(name)} is not "
                                   f"listed in files")
        stride = shard.get("key_stride", 32)
        if not _is_int(stride) or not 1 <= stride < 2**31:
            bad(f"shards[{i}].key_stride", stride, "a whole number from 1 to 2^31 - 1")


def check_files(folder: Path, manifest: dict, verify: bool = False) -> None:
    """Every listed file is a plain file inside ``folder`` (not a link out of it, a FIFO or a device) with its
    recorded size (cheap, always: one ``stat`` each); with ``verify`` also its sha256."""
    inside = folder.resolve()
    for name, entry in manifest["files"].items():
        path = folder / plain_name(folder, name, "a file")
        try:
            real = path.resolve()
            info = real.stat()
        except FileNotFoundError:
            raise SpecdecError(f"datastore {folder}: missing file {name} (truncated copy?)") from None
        except (OSError, RuntimeError) as err:  # RuntimeError: a symlink loop (older Pythons)
            raise SpecdecError(f"datastore {folder}: cannot open {name} "
                               f"({getattr(err, 'strerror', None) or type(err).__name__})") from None
        if real.parent != inside:
            raise SpecdecError(f"datastore {folder}: {name} is a link to a file outside the datastore folder; "
                               f"refusing to open it")
        if not stat.S_ISREG(info.st_mode):
            raise SpecdecError(f"datastore {folder}: {name} is not a plain file; refusing to open it")
        if info.st_size != entry["bytes"]:
            raise SpecdecError(f"datastore {folder}: {name} has {info.st_size} bytes, the manifest says "
                               f"{entry['bytes']} (truncated or altered)")
        if verify and sha256_file(real) != entry["sha256"]:
            raise SpecdecError(f"datastore {folder}: checksum mismatch for {name} (corrupt file)")


def load_npy(folder: Path, name: str) -> np.ndarray:
    """A read-only memory map of the checked file ``name``; a file that is not a NumPy array is one line that
    names it (never echoing its bytes)."""
    try:
        with warnings.catch_warnings():  # a header numpy only warns about (Python 2's) is not one a build wrote
            warnings.simplefilter("error")
            return np.load(folder / name, mmap_mode="r", allow_pickle=False)
    except OSError as err:
        raise SpecdecError(f"datastore {folder}: cannot read {name} ({err.strerror or type(err).__name__})") from None
    except Exception:  # numpy's header parser raises ValueError, SyntaxError, TypeError, ... and quotes the bytes
        raise SpecdecError(f"datastore {folder} is corrupt ({name}: not a readable NumPy array file); rebuild it"
                           ) from None


def check_tokenizer(folder: Path, manifest: dict, fingerprint: str) -> None:
    if manifest["tokenizer_fingerprint"] != fingerprint:
        raise SpecdecError(
            f"datastore {folder} was built with another tokenizer (fingerprint {manifest['tokenizer_fingerprint'][:8]}, "
            f"model {manifest.get('model')!r}) than this model's ({fingerprint[:8]}); rebuild it with "
            f"`specdec build-datastore --model ...` for this model")
