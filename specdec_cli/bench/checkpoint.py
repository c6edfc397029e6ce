"""Bench checkpoints: a long ``bench --out FILE`` run survives Ctrl-C, a crash or a kill.

Every finished unit of work (all turns of one prompt with one method) is appended to ``FILE.partial`` as one JSON
line and flushed to disk, after a header line holding the run's configuration. ``bench --resume`` reads it back,
skips the units already done (their generations, tokens included, go into the final record as if just run) and
runs the rest; the record written at the end is the one an uninterrupted run writes. A line torn by a kill is
ignored. The partial file is removed once the record is in ``FILE``.

What the methods learn from one generation to the next (the budget's calibration, value of time and gate; ``auto``'s
per-source calibration, gates and memory of earlier outputs; ``aded``'s adapted tri-grams; ...) shapes the later
generations, so it is part of the checkpoint too: after each unit the method's state is written to
``FILE.partial.state`` (JSON, one entry per method naming the unit it follows, replaced in one rename). It is
written after the unit's line: a kill between the two leaves a state one unit behind, and ``--resume`` runs that
unit again from it, so a resumed run's counts equal an uninterrupted one's. Both files are data from disk (maybe
hostile): JSON only, every value checked.

``FILE.partial`` is locked (``flock``) for as long as the run lives, so a second run with the same ``--out`` is
refused instead of overwriting the first one's finished generations.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, fields
from pathlib import Path

from ..errors import SpecdecError
from ..io.jsonl import MAX_LINE_BYTES, loads, read_json
from .config import upgraded_config

SCHEMA = "specdec-bench-partial/2"  # /2: the config as the record's (specdec-bench/2: the settings one object)
STATE_SCHEMA = "specdec-bench-state/2"
OLD_SCHEMAS = {"specdec-bench-partial/1": SCHEMA, "specdec-bench-state/1": STATE_SCHEMA}  # resumed, config upgraded
GENERATION_FIELDS = None  # filled lazily: the Generation dataclass's field names
MAX_PARTIAL_BYTES = 1 << 30  # far more than the generations of any bench run; more is not a file a run wrote


def _normal(value):
    return json.loads(json.dumps(value))


class Checkpoint:
    """Units done so far (``(prompt_id, method) -> generations as dicts``), each method's learned state after its
    last finished unit, and the files they are written to."""

    def __init__(self, out: str | None, config: dict, resume: bool = False):
        self.path = Path(f"{out}.partial") if out else None
        self.state_path = Path(f"{out}.partial.state") if out else None
        self.config = _normal(config)
        self.done: dict[tuple[str, str], list[dict]] = {}
        self.states: dict[str, dict] = {}  # method -> {"after": prompt_id, "state": ...}
        self._fd: int | None = None
        if self.path is None:
            if resume:
                raise SpecdecError("--resume needs --out (the interrupted run's partial results live beside it)")
            return
        self._lock(create=not resume)
        try:
            if resume:
                self._load()
            else:
                self._write_header()
        except BaseException:
            self.release()
            raise

    # -- the lock ----------------------------------------------------------------------------------------------

    def _lock(self, create: bool) -> None:
        """Hold an exclusive ``flock`` on ``FILE.partial`` (created if needed) until :meth:`release`; another live
        run holding it is one clear error. Nothing is written before the lock is held."""
        import fcntl

        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
            except FileNotFoundError:
                raise SpecdecError(f"--resume: no interrupted run to resume ({self.path} does not exist)") from None
            except OSError as err:
                raise SpecdecError(f"cannot write {self.path}: {err.strerror or err}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise SpecdecError(f"another bench run is writing to --out {str(self.path)[:-len('.partial')]} "
                                   f"(its {self.path.name} is locked); wait for it to finish or choose another --out"
                                   ) from None
            try:  # the file we locked is still the one at the path (a finishing run may have just removed it)
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return
            os.close(fd)
            if not create:
                raise SpecdecError(f"--resume: no interrupted run to resume ({self.path} does not exist)")
        raise SpecdecError(f"cannot lock {self.path}: it keeps being replaced")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None

    # -- reading and writing -----------------------------------------------------------------------------------

    def _write_header(self) -> None:
        try:
            self._rewrite(json.dumps({"schema": SCHEMA, "config": self.config}) + "\n")
            if self.state_path is not None:
                self.state_path.unlink(missing_ok=True)
        except OSError as err:
            raise SpecdecError(f"cannot write {self.path}: {err.strerror or err}") from None

    def _rewrite(self, text: str) -> None:
        """Replace the locked file's content in place (same inode: the lock stays on it)."""
        os.ftruncate(self._fd, 0)
        os.lseek(self._fd, 0, os.SEEK_SET)
        data = text.encode("utf-8")
        while data:
            data = data[os.write(self._fd, data):]
        os.fsync(self._fd)

    def _load(self) -> None:
        entries = self._read_entries()
        header = entries[0] if entries and isinstance(entries[0], dict) else {}
        if current_schema(header) != SCHEMA:
            raise SpecdecError(f"--resume: {self.path} is not a partial bench run")
        old = upgraded_config(header.get("config")) if isinstance(header.get("config"), dict) else {}
        if old != self.config:
            raise SpecdecError(f"--resume: the interrupted run used other settings "
                               f"({', '.join(differences(old, self.config))}); rerun it with the same options, or "
                               "drop --resume to start over")
        header = {"schema": SCHEMA, "config": self.config}
        for entry in entries[1:]:
            if isinstance(entry, dict) and isinstance(entry.get("prompt_id"), str) \
                    and isinstance(entry.get("method"), str):
                gens = entry.get("generations")
                if not _valid_generations(gens, entry["prompt_id"], entry["method"]):
                    raise SpecdecError(f"--resume: {self.path} holds a damaged unit ({entry['prompt_id']}, "
                                       f"{entry['method']}); drop --resume to start over")
                self.done[(entry["prompt_id"], entry["method"])] = gens
        self.states = self._load_states()
        # a method's units after the one its saved state follows (a kill between the line and the state) run again
        for method in {m for _, m in self.done}:
            keys = [key for key in self.done if key[1] == method]
            after = self.states.get(method, {}).get("after")
            cut = next((i + 1 for i, key in enumerate(keys) if key[0] == after), 0)
            for key in keys[cut:]:
                del self.done[key]
        # rewrite without torn or dropped lines, so later appends start on a fresh line
        try:
            self._rewrite("".join(json.dumps(line) + "\n" for line in [header] + [
                {"prompt_id": prompt_id, "method": method, "generations": gens}
                for (prompt_id, method), gens in self.done.items()]))
        except OSError as err:
            raise SpecdecError(f"cannot write {self.path}: {err.strerror or err}") from None

    def _read_entries(self) -> list:
        """The JSON values of ``FILE.partial``'s lines, read line by line and bounded (a line that is not JSON --
        the one a kill cut short -- is skipped)."""
        entries, total = [], 0
        try:
            with open(self.path, "rb") as fh:
                while line := fh.readline(MAX_LINE_BYTES + 1):
                    total += len(line)
                    if total > MAX_PARTIAL_BYTES:
                        raise SpecdecError(f"--resume: {self.path} is larger than {MAX_PARTIAL_BYTES:,} bytes; not a "
                                           "partial bench run")
                    try:
                        entries.append(loads(line))
                    except ValueError:  # JSON, UTF-8 and depth errors alike
                        continue
        except OSError:
            raise SpecdecError(f"--resume: cannot read {self.path}") from None
        return entries

    def _load_states(self) -> dict[str, dict]:
        if self.state_path is None or not self.state_path.exists():
            return {}
        try:
            data = read_json(self.state_path, MAX_PARTIAL_BYTES)
        except (OSError, ValueError):
            data = None  # torn or damaged: every method reruns from its start (the header alone is certain)
        if not isinstance(data, dict) or current_schema(data) != STATE_SCHEMA \
                or not isinstance(data.get("config"), dict) or upgraded_config(data["config"]) != self.config \
                or not isinstance(data.get("methods"), dict):
            return {}
        return {m: s for m, s in data["methods"].items()
                if isinstance(s, dict) and isinstance(s.get("after"), str) and "state" in s}

    def get(self, prompt_id: str, method: str) -> list[dict] | None:
        return self.done.get((prompt_id, method))

    def state_after(self, prompt_id: str, method: str):
        """``method``'s learned state saved right after its unit on ``prompt_id`` (None: none saved there)."""
        entry = self.states.get(method)
        return entry["state"] if entry is not None and entry["after"] == prompt_id else None

    def add(self, prompt_id: str, method: str, generations: list, state=None) -> None:
        """A finished unit, and ``state``: what ``method`` learnt up to its end (JSON data, or None)."""
        if self.path is None:
            return
        entry = {"prompt_id": prompt_id, "method": method, "generations": [asdict(g) for g in generations]}
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.states[method] = {"after": prompt_id, "state": state}
        self._write_states()

    def _write_states(self) -> None:
        tmp = self.state_path.with_name(f".{self.state_path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump({"schema": STATE_SCHEMA, "config": self.config, "methods": self.states}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.state_path)
        finally:
            tmp.unlink(missing_ok=True)

    def finish(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.state_path.unlink(missing_ok=True)
        self.release()


def current_schema(entry: dict):
    """The schema of a partial file's header or state file, a /1 one (its config upgraded on reading) read as /2."""
    schema = entry.get("schema")
    return OLD_SCHEMAS.get(schema, schema) if isinstance(schema, str) else None  # a hostile file: any JSON value


def differences(old: dict, new: dict) -> list[str]:
    """The config fields that differ, a setting named as ``settings.NAME``."""
    keys = sorted(k for k in {*old, *new} if old.get(k) != new.get(k))
    settings = [old.get("settings"), new.get("settings")]
    if "settings" in keys and all(isinstance(s, dict) for s in settings):
        keys.remove("settings")
        keys += sorted(f"settings.{k}" for k in {*settings[0], *settings[1]}
                       if settings[0].get(k) != settings[1].get(k))
    return keys


def _valid_generations(gens, prompt_id: str, method: str) -> bool:
    """Generations as :class:`~specdec_cli.bench.config.Generation` dicts of this unit, with sane types."""
    global GENERATION_FIELDS
    if GENERATION_FIELDS is None:
        from .config import Generation

        GENERATION_FIELDS = {f.name for f in fields(Generation)}
    if not isinstance(gens, list) or not gens:
        return False
    for g in gens:
        if not isinstance(g, dict) or not set(g) <= GENERATION_FIELDS or g.get("prompt_id") != prompt_id \
                or g.get("method") != method or not isinstance(g.get("turn"), int) \
                or not isinstance(g.get("tokens"), list) \
                or not all(isinstance(t, int) and not isinstance(t, bool) for t in g["tokens"]) \
                or not isinstance(g.get("seconds"), (int, float)) \
                or not all(g.get(k) is None or (isinstance(g[k], int) and not isinstance(g[k], bool))
                           for k in ("forwards", "emitted", "drafted", "accepted")) \
                or not (g.get("draft_s") is None or isinstance(g["draft_s"], (int, float))) \
                or not (g.get("sources") is None or isinstance(g["sources"], dict)):
            return False
    return True
