"""Method registry: one module per method, each exposing ``build(ctx: MethodContext) -> Drafter``.

Modules are imported lazily so that ``specdec --help`` stays fast.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from ..decoding import Drafter
from ..errors import SpecdecError


@dataclass
class MethodContext:
    target: object  # LoadedModel
    drafts: list = field(default_factory=list)  # list[LoadedModel]
    datastore: str | None = None
    window: int | None = None  # draft window K (method default when None)
    options: dict[str, str] = field(default_factory=dict)  # --opt key=value, method-specific
    budget: str | int = "auto"  # --budget: auto, paper or a node count (specdec_cli.budget)

    def opt(self, key: str, default, cast=None):
        """A method option with its default; ``cast`` defaults to the default's type."""
        if key not in self.options:
            return default
        cast = cast or type(default)
        try:
            return cast(self.options[key])
        except ValueError:
            raise SpecdecError(f"--opt {key}={self.options[key]!r}: expected {cast.__name__}") from None


@dataclass(frozen=True)
class MethodInfo:
    module: str
    drafts: int = 0  # draft models required
    datastore: bool = False  # needs --datastore
    help: str = ""


METHODS: dict[str, MethodInfo] = {
    "ar": MethodInfo("ar", help="autoregressive decoding with the target alone (the baseline)"),
    "sd": MethodInfo("sd", drafts=1, help="speculative sampling with a draft model and a fixed window K (default 5)"),
    "self-verify": MethodInfo("self_verify", drafts=1,
                              help="HSDDW Alg. 1: entropy-bounded dynamic draft window, running threshold tau (K cap 10)"),
    "hsddw": MethodInfo("hsddw", drafts=2, help="HSDDW Alg. 2: fast draft -> stronger draft pre-verifies -> target"),
    "rest": MethodInfo("rest", datastore=True, help="REST: suffix-array retrieval drafts verified as a token tree"),
    "aded": MethodInfo("aded", datastore=True, help="ADED: tri-gram matrix + MCTS draft maker, adaptive updates"),
    "ngram-trie": MethodInfo("ngram_trie", help="N-gram trie of the prompt context (n=13, L_p=3), tree verification"),
    "pld": MethodInfo("pld", help="prompt lookup decoding: copy the continuation of the last n-gram match (chain)"),
}


def build_drafter(method: str, ctx: MethodContext) -> Drafter:
    info = METHODS.get(method)
    if info is None:
        raise SpecdecError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if len(ctx.drafts) < info.drafts:
        raise SpecdecError(f"--method {method} needs {info.drafts} draft model(s) (--draft), got {len(ctx.drafts)}")
    if info.datastore and not ctx.datastore:
        raise SpecdecError(f"--method {method} needs --datastore DIR (build one with `specdec build-datastore`)")
    unknown_window = ctx.window is not None and ctx.window < 1
    if unknown_window:
        raise SpecdecError(f"--window must be >= 1, got {ctx.window}")
    module = importlib.import_module(f"{__name__}.{info.module}")
    return module.build(ctx)
