"""What every command shares: one-line errors, quiet libraries, option and prompt parsing.

Every user-facing problem is a :class:`SpecdecError`, printed as one line on stderr with its exit code.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator, List, Optional

import typer

from ..errors import SpecdecError
from ..config import MAX_BATCH_FILE_BYTES, MAX_PROMPT_BYTES, check_prompt_size
from ..io.bounded import read_chunks



def die(message: str, code: int = 2) -> None:
    """One line on stderr, then exit with ``code``."""
    sys.stderr.write(f"specdec: error: {' '.join(str(message).split())}\n")
    sys.stderr.flush()
    raise typer.Exit(code)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn user-facing errors (and Ctrl-C) into one stderr line and a non-zero exit, never a traceback."""
    try:
        yield
    except SpecdecError as err:
        die(str(err), err.exit_code)
    except KeyboardInterrupt:
        die("interrupted", 130)
    except MemoryError:
        die("out of memory (try a smaller model, --dtype bfloat16, or fewer --max-new-tokens)", 1)


def quiet_libraries() -> None:
    """Keep transformers/torch chatter off the user's terminal; our own progress goes to stderr."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings

    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def parse_opts(opts: Optional[List[str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in opts or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecdecError(f"--opt expects key=value, got {item!r}")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


def read_prompts(prompt: Optional[str], batch_file: Optional[str]) -> list[str]:
    """The prompt argument, else one prompt per line of --batch-file ('-' = stdin), else all of stdin."""
    if prompt is not None and batch_file:
        raise SpecdecError("give either a prompt argument or --batch-file, not both")
    if prompt is not None:
        check_prompt_size(prompt)
        return [prompt]
    if batch_file:
        prompts = read_prompt_lines(batch_file, "--batch-file")
        if not prompts:
            raise SpecdecError(f"--batch-file {batch_file} holds no prompts")
        return prompts
    if sys.stdin is None or sys.stdin.isatty():
        raise SpecdecError("no prompt: give one as an argument, pipe it on stdin, or use --batch-file")
    return [read_stdin()]


def read_prompt_lines(path: str, option: str) -> list[str]:
    """One prompt per non-empty line of ``path`` ('-' = stdin), as UTF-8 text: the one prompt-line reader. At most
    :data:`MAX_BATCH_FILE_BYTES` are read, in chunks (``/dev/zero`` or an endless pipe is refused, and Ctrl-C
    stops the read). Lines end at ``\n`` (or ``\r\n``) only: a form feed, ``\v``, U+2028 and the other breaks
    ``str.splitlines`` knows are characters of a prompt."""
    if path == "-":
        text = read_stdin()
    else:
        try:
            with open(path, "rb") as fh:
                raw = read_chunks(fh, MAX_BATCH_FILE_BYTES)
        except OSError as err:
            raise SpecdecError(f"cannot read {option} {path}: {err.strerror or err}") from None
        if len(raw) > MAX_BATCH_FILE_BYTES:
            raise SpecdecError(f"{option} {path} is larger than {MAX_BATCH_FILE_BYTES:,} bytes; split it into "
                               "several runs")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SpecdecError(f"{option} {path} is not UTF-8 text (one prompt per line)") from None
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    lines = [line for line in lines if line.strip()]
    for i, line in enumerate(lines):
        check_prompt_size(line, f"prompt {i + 1} of {option} {path}")
    return lines


def read_stdin() -> str:
    """All of stdin as UTF-8 text (a clear error for binary input), read no further than the prompt bound."""
    stream = getattr(sys.stdin, "buffer", None) or sys.stdin
    try:
        raw = read_chunks(stream, MAX_PROMPT_BYTES)
        check_prompt_size(raw, "the prompt on stdin")
        return raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise SpecdecError("stdin is not UTF-8 text; pipe a text prompt") from None
