"""Bench checkpoints: a long ``bench --out FILE`` run survives Ctrl-C, a crash or a kill.

Every finished unit of work (all turns of one prompt with one method) is appended to ``FILE.partial`` as one JSON
line and flushed to disk, after a header line holding the run's configuration. ``bench --resume`` reads it back,
skips the units already done (their generations, tokens included, go into the final record as if just run) and
runs the rest; the record written at the end is the one an uninterrupted run writes. A line torn by a kill is
ignored. The partial file is removed once the record is in ``FILE``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from .errors import SpecdecError

SCHEMA = "specdec-bench-partial/1"


def _normal(value):
    return json.loads(json.dumps(value))


class Checkpoint:
    """Units done so far (``(prompt_id, method) -> generations as dicts``) and the file they are appended to."""

    def __init__(self, out: str | None, config: dict, resume: bool = False):
        self.path = Path(f"{out}.partial") if out else None
        self.config = _normal(config)
        self.done: dict[tuple[str, str], list[dict]] = {}
        if self.path is None:
            if resume:
                raise SpecdecError("--resume needs --out (the interrupted run's partial results live beside it)")
            return
        if resume:
            self._load()
        else:
            self._write_header()

    def _write_header(self) -> None:
        try:
            with open(self.path, "w", encoding="utf-8") as fh:
                fh.write(json.dumps({"schema": SCHEMA, "config": self.config}) + "\n")
        except OSError as err:
            raise SpecdecError(f"cannot write {self.path}: {err.strerror or err}") from None

    def _load(self) -> None:
        if not self.path.exists():
            raise SpecdecError(f"--resume: no interrupted run to resume ({self.path} does not exist)")
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            raise SpecdecError(f"--resume: cannot read {self.path}") from None
        entries = []
        for line in lines:
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # the line a kill cut short
        header = entries[0] if entries and isinstance(entries[0], dict) else {}
        if header.get("schema") != SCHEMA:
            raise SpecdecError(f"--resume: {self.path} is not a partial bench run")
        if header.get("config") != self.config:
            old = header.get("config") or {}
            diff = sorted(k for k in {*old, *self.config} if old.get(k) != self.config.get(k))
            raise SpecdecError(f"--resume: the interrupted run used other settings ({', '.join(diff)}); "
                               "rerun it with the same options, or drop --resume to start over")
        for entry in entries[1:]:
            if isinstance(entry, dict) and "prompt_id" in entry and "method" in entry:
                self.done[(entry["prompt_id"], entry["method"])] = entry["generations"]
        # rewrite without torn lines, so later appends start on a fresh line
        with open(self.path, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(header) + "\n")
            for (prompt_id, method), gens in self.done.items():
                fh.write(json.dumps({"prompt_id": prompt_id, "method": method, "generations": gens}) + "\n")

    def get(self, prompt_id: str, method: str) -> list[dict] | None:
        return self.done.get((prompt_id, method))

    def add(self, prompt_id: str, method: str, generations: list) -> None:
        if self.path is None:
            return
        entry = {"prompt_id": prompt_id, "method": method, "generations": [asdict(g) for g in generations]}
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def finish(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
