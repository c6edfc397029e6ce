"""Method registry: one module per method, each exposing ``build(ctx: MethodContext) -> Drafter``.

Modules are imported lazily so that ``specdec --help`` stays fast.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from typing import TYPE_CHECKING

from ..datastore import SUFFIX_ARRAY, TRIGRAM
from ..config import AUTO_BUDGET, MAX_MEMORY_TOKENS, BudgetSpec
from ..errors import SpecdecError

if TYPE_CHECKING:  # the registry is read without torch (`specdec methods`, option checks before loading)
    from ..engine.loop import Drafter


@dataclass(frozen=True)
class Option:
    """One ``--opt key=value`` of a method: its default (``paper``: another default under ``--budget paper``;
    ``None``: derived from other settings, as ``help`` says), the type values are parsed as, and what it does."""

    default: object
    help: str
    type: type = int
    paper: object = None


@dataclass
class MethodContext:
    target: object  # LoadedModel
    drafts: list = field(default_factory=list)  # list[LoadedModel]
    datastore: str | None = None
    window: int | None = None  # draft window K (method default when None)
    options: dict[str, str] = field(default_factory=dict)  # --opt key=value, method-specific
    budget: BudgetSpec = AUTO_BUDGET  # --budget (specdec_cli.engine.budget); a spelling is parsed as the flag
    method: str = ""  # set by build_drafter: whose registered options ``opt`` reads
    datastores: list = field(default_factory=list)  # auto: every --datastore (kinds told apart by their manifest)
    opened: dict = field(default_factory=dict)  # folder -> datastore.OpenStore: opened once per run, shared
    shared: dict = field(default_factory=dict)  # the parts the drafters of one batch hold once (held_once)

    def __post_init__(self) -> None:
        self.budget = BudgetSpec.parse(self.budget)  # a BudgetSpec as it comes; "paper", 8, ... read as --budget

    def store(self, folder) -> tuple[str, object]:
        """``(kind, store)``: this method's view of the run's opened store in ``folder`` (opened now if the caller
        did not), checked against the target's tokenizer and, with ``--opt verify=1``, every file's sha256."""
        from ..datastore import drafting_store

        info = METHODS[self.method]
        verify = bool(self.opt("verify")) if "verify" in info.options else False
        return drafting_store(self.opened, folder, kind=info.datastore_kind, fingerprint=self.target.fingerprint,
                              verify=verify)

    def held_once(self, key: str, make) -> tuple[object, bool]:
        """``(part, made)``: the run-wide part ``key`` of this method's drafters (``auto``'s memory of outputs and
        its calibration, ``aded``'s adapted tri-gram matrix), held once for every slot of a batch
        (``api.make_drafters`` hands their contexts one ``shared`` dict): the first build makes it with ``make()``
        (``made``: that drafter owns it, and saves what is saved -- the memory, the adapted matrix -- at ``finish``),
        the others get the same object. A drafter made alone holds its own."""
        if key in self.shared:
            return self.shared[key], False
        self.shared[key] = make()
        return self.shared[key], True

    def opt(self, key: str):
        """The value of a registered option of this method: ``--opt key=value`` parsed, else its default."""
        spec = METHODS[self.method].options[key]
        if key not in self.options:
            return spec.paper if self.budget.paper and spec.paper is not None else spec.default
        try:
            return spec.type(self.options[key])
        except ValueError:
            raise SpecdecError(f"--opt {key}={self.options[key]!r}: expected {spec.type.__name__}") from None


@dataclass(frozen=True)
class MethodInfo:
    module: str
    drafts: int = 0  # draft models required
    datastore: bool = False  # needs --datastore
    help: str = ""
    datastore_kind: str | None = None  # the kind of its one --datastore (specdec_cli.datastore.KINDS)
    drafter: bool = True  # False: no drafts at all (the baseline)
    options: dict = field(default_factory=dict)  # name -> Option: the only place options and defaults are written


INF = float("inf")
VERIFY = Option(0, "1: also recompute every file's sha256 when loading (structure and sizes are always checked)")
TAU0 = Option(INF, "initial entropy threshold; 0 = the paper's cold start, inf = learn from the first rejection",
              float)

METHODS: dict[str, MethodInfo] = {
    "auto": MethodInfo("auto", help="the default: drafts from every source at once (this request's context, memory "
                       "of earlier outputs, every --datastore, a --draft model's chain), one tree, the budget picks",
                       options={"context": Option(1, "1: draft from this request's own prompt and output"),
                                "memory": Option(1, "1: draft from earlier outputs of this run (--memory DIR: and "
                                                 "of earlier runs)"),
                                "memory_dir": Option("", "keep the memory in this folder across runs (--memory)",
                                                     str),
                                "memory_tokens": Option(262_144, f"memory size bound (1 to {MAX_MEMORY_TOKENS:,} "
                                                        "tokens); the oldest outputs are forgotten first"),
                                "max_ngram": Option(8, "longest context n-gram matched"),
                                # 32: deeper copies pay once the budget prices 9+ rows right (16 before;
                                # docs/profiling.md, "Where t(n) jumps"); --kernels blocks pays ~4% for it on
                                # HumanEval (docs/benchmarks.md)
                                "cont_len": Option(32, "deepest draft node"),
                                "top_c": Option(32, "nodes kept from each source's frequency trie"),
                                "max_nodes": Option(64, "nodes of the merged tree handed to the budget"),
                                "model_window": Option(8, "longest draft-model chain (--window sets it too)")}),
    "ar": MethodInfo("ar", drafter=False, help="autoregressive decoding with the target alone (the baseline)"),
    "sd": MethodInfo("sd", drafts=1, help="speculative sampling with a draft model; chain length from the budget "
                     "(K=5 with --budget paper)"),
    "self-verify": MethodInfo("self_verify", drafts=1, options={"tau0": TAU0},
                              help="HSDDW Alg. 1: entropy-bounded dynamic draft window, running threshold tau (K cap 10)"),
    "hsddw": MethodInfo("hsddw", drafts=2, help="HSDDW Alg. 2: fast draft -> stronger draft pre-verifies -> target",
                        options={"tau0": TAU0,
                                 "tau1_0": Option(None, "M1's initial threshold (default: tau0)", float),
                                 "tau2_0": Option(None, "M2's initial threshold (default: tau0)", float),
                                 "max_draft": Option(None, "cap on the chain sent to the target (default: 2 K)")}),
    "rest": MethodInfo("rest", datastore=True, help="REST: suffix-array retrieval drafts verified as a token tree",
                       datastore_kind=SUFFIX_ARRAY,
                       options={"n_max": Option(16, "longest context suffix looked up"),
                                "cont_len": Option(10, "tokens of continuation per match"),
                                "top_c": Option(64, "nodes kept from the frequency trie"),
                                "max_matches": Option(1000, "matches sampled from the match range", paper=5000),
                                "verify": VERIFY,
                                "memory": Option(0, "1: also draft from this run's earlier verified outputs"),
                                "memory_weight": Option(8, "count of a remembered continuation in the trie"),
                                "context": Option(1, "1: also draft from this request's own prompt and output (the "
                                                  "continuation of the tail's earlier occurrence, SuffixDecoding's "
                                                  "per-request tree); 0: the datastore only, as in the paper",
                                                  paper=0)}),
    "aded": MethodInfo("aded", datastore=True, help="ADED: tri-gram matrix + MCTS draft maker, adaptive updates",
                       datastore_kind=TRIGRAM,
                       options={"iterations": Option(150, "MCTS iterations per step"),
                                "c1": Option(32.0, "PUCT exploration constant c1", float),
                                "c2": Option(8.0, "PUCT constant c2", float),
                                "depth": Option(4, "search depth (--window sets it too)"),
                                "candidates": Option(24, "candidate sequences merged into the tree"),
                                "top_k": Option(None, "next tokens per context (default: the store's, 12)"),
                                "adapt": Option(1, "0: no tri-gram updates from verified output"),
                                "adapt_prompt": Option(1, "0: do not learn the prompt's tri-grams"),
                                "increment": Option(0.1, "adaptive update step", float),
                                "max_prob": Option(1.0, "cap on an adapted probability", float),
                                "seed": Option(0, "MCTS random seed"),
                                "save_adapted": Option("", "write the adapted matrix here at the end", str),
                                "verify": VERIFY}),
    "ngram-trie": MethodInfo("ngram_trie", help="N-gram trie of the prompt context (n=13, L_p=3), tree verification",
                             options={"n": Option(13, "n-gram window size"),
                                      "lp": Option(3, "prefix length L_p"),
                                      "budget": Option(32, "the paper's node budget before the engine's selection"),
                                      "max_depth": Option(None, "deepest draft node (default n - 1; --window too)"),
                                      "grow": Option(1, "1: index the verified output as it is written", paper=0)}),
    "pld": MethodInfo("pld", help="prompt lookup decoding: copy the continuation of the last n-gram match (chain)",
                      options={"max_ngram": Option(3, "longest n-gram matched"),
                               "min_ngram": Option(1, "shortest n-gram matched"),
                               "num_pred": Option(10, "tokens copied (--window sets it too)")}),
}


def check_options(methods: list[str], given) -> None:
    """Refuse ``--opt`` keys that none of ``methods`` takes (before anything loads), listing what they take."""
    known = {key: name for name in methods if name in METHODS for key in METHODS[name].options}
    unknown = sorted(set(given) - set(known))
    if not unknown:
        for key, value in given.items():  # values too: a typo fails now, not after the model loaded
            spec = METHODS[known[key]].options[key]
            try:
                spec.type(value)
            except (TypeError, ValueError):
                raise SpecdecError(f"--opt {key}={value!r}: expected {spec.type.__name__}") from None
        return
    listed = ", ".join(f"{k} ({METHODS[m].options[k].default})" for k, m in sorted(known.items())) or "none"
    which = f"--method {methods[0]}" if len(methods) == 1 else f"methods {', '.join(methods)}"
    raise SpecdecError(f"unknown --opt {', '.join(unknown)} for {which}; options (defaults): {listed} "
                       "(see `specdec methods`)")


def check_methods(names: list[str], baselines: dict | tuple = ()) -> None:
    """Every name is a method (or one of ``baselines``: bench's transformers runs): the one check of method names."""
    for name in names:
        if name not in METHODS and name not in baselines:
            raise SpecdecError(f"unknown method {name!r}; choose one of {', '.join([*METHODS, *baselines])}")


def build_drafter(method: str, ctx: MethodContext) -> "Drafter":
    check_methods([method])
    info = METHODS[method]
    if len(ctx.drafts) < info.drafts:
        raise SpecdecError(f"--method {method} needs {info.drafts} draft model(s) (--draft), got {len(ctx.drafts)}")
    if info.datastore and not ctx.datastore:
        raise SpecdecError(f"--method {method} needs --datastore DIR (build one with `specdec build-datastore`)")
    ctx.method = method
    module = importlib.import_module(f"{__name__}.{info.module}")
    return module.build(ctx)


def model_free() -> list[str]:
    """Methods that draft without a model (``bench-drafting`` times them without a target)."""
    return [name for name, info in METHODS.items() if info.drafter and not info.drafts]


def precheck_datastore(method: str, datastore: str | list[str] | None, opened: dict | None = None) -> dict:
    """Before any model loads: the method's ``--datastore`` exists, is of the right kind and is structurally
    sound (the tokenizer check needs the model and comes later). ``auto`` takes any number, of any kind.
    Each store is opened once: returns ``opened`` (folder -> datastore.OpenStore, a new dict when None) with
    this method's stores added, for :class:`MethodContext` (bench shares one across its methods)."""
    from ..datastore import open_once

    opened = {} if opened is None else opened
    if method == "auto":
        for folder in [datastore] if isinstance(datastore, str) else list(datastore or []):
            open_once(opened, folder)
        return opened
    if isinstance(datastore, list):
        if len(datastore) > 1:
            raise SpecdecError(f"--method {method} takes one --datastore, got {len(datastore)} (only auto takes "
                               "several)")
        datastore = datastore[0] if datastore else None
    info = METHODS.get(method)
    if info is None or not info.datastore:
        return opened
    if not datastore:
        raise SpecdecError(f"--method {method} needs --datastore DIR (build one with `specdec build-datastore`)")
    open_once(opened, datastore, info.datastore_kind)
    return opened
