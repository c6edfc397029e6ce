"""Method labels of a bench run over several engines: ``NAME`` or ``NAME@ENGINE`` (docs/vllm.md), checked before
torch is imported. specdec's engine runs specdec's methods and the outside baselines (:mod:`.baselines`); vLLM
runs its own methods and specdec's proposer (``config.VLLM_METHODS``)."""

from __future__ import annotations

from ..config import ENGINES, VLLM_METHODS
from ..errors import SpecdecError
from ..methods import METHODS
from .baselines import OUTSIDE_BASELINES

BASELINES = {"specdec": "ar", "vllm": "vllm"}  # a run's speedups and identity are measured against its engine's


def methods_of(engine: str) -> tuple[str, ...]:
    """The methods an engine runs: ours and the outside baselines (bench.baselines) on specdec's engine, vLLM's
    and our proposer on vLLM."""
    return tuple(VLLM_METHODS) if engine == "vllm" else (*METHODS, *OUTSIDE_BASELINES)


def check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise SpecdecError(f"unknown --engine {engine!r}; choose {', '.join(ENGINES)}")


def split_label(label: str, default: str) -> tuple[str, str]:
    """``(method, engine)`` of a method label in a run on engine ``default``: ``NAME@ENGINE`` picks the engine;
    a bare name runs on ``default`` when it has the method, else on the engine that does."""
    name, at, engine = label.partition("@")
    if at:
        check_engine(engine)
        if name not in methods_of(engine):
            raise SpecdecError(f"method {name!r} does not run on {engine}; there: {', '.join(methods_of(engine))}")
        return name, engine
    for engine in (default, *ENGINES):
        if name in methods_of(engine):
            return name, engine
    every = ", ".join(dict.fromkeys(m for e in ENGINES for m in methods_of(e)))
    raise SpecdecError(f"unknown method {name!r}; choose one of {every} (NAME@ENGINE picks an engine)")


def label_of(name: str, engine: str, default: str) -> str:
    """The shortest label of ``name`` on ``engine`` in a run on ``default``: the bare name when it resolves there."""
    return name if split_label(name, default) == (name, engine) else f"{name}@{engine}"


def engine_of(label: str, default: str) -> str:
    return split_label(label, default)[1]


def method_list(names: list[str], engine: str = "specdec") -> list[str]:
    """Validated labels without repeats, the run's baseline first (added when missing)."""
    check_engine(engine)
    labels = list(dict.fromkeys(label_of(*split_label(n.strip(), engine), engine) for n in names if n.strip()))
    base = BASELINES[engine]
    return [base] + [m for m in labels if m != base]
