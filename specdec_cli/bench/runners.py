"""Runners (ours and transformers' baselines) and the interleaved run that times them."""

from __future__ import annotations

import sys
from dataclasses import replace

from .. import api
from ..errors import SpecdecError
from ..methods import check_options
from ..engine.drafters import Drafters
from ..engine.loop import cut_at_stop  # noqa: F401 - throughput imports it from here
from ..io.prompts import Prompt, load_prompts
from ..runtime import static_cache
from ..runtime.cache_mode import CacheMode, resolve
from ..runtime.cache import CACHE_SLACK
from ..runtime.machine import set_threads
from .baselines import OUTSIDE_BASELINES, baseline_runner
from .config import WARMUP_TOKENS, BenchConfig, Generation, Runner
from .engines import close_engines, start_vllm_engines, vllm_runner
from .labels import BASELINES, method_list, split_label
from .metrics import summarize
from .records import git_commit, make_record

# --- runners ----------------------------------------------------------------------------------------------------


def datastore_for(method: str, specs: list[str] | str | None) -> str | list[str] | None:
    """The datastore directory for ``method`` from ``--datastore`` values: ``METHOD=DIR`` wins over a bare DIR.
    ``auto`` takes every ``auto=DIR`` (a list, any kinds)."""
    specs = [specs] if isinstance(specs, str) else list(specs or [])
    bare = [s for s in specs if "=" not in s or s.split("=", 1)[0] not in api.METHODS]
    if method == "auto":
        return [s.split("=", 1)[1] for s in specs if s not in bare and s.split("=", 1)[0] == "auto"]
    named = dict(s.split("=", 1) for s in specs if s not in bare)
    if len(bare) > 1:
        raise SpecdecError(f"several --datastore directories without a method name: {', '.join(bare)}; "
                           "write METHOD=DIR, e.g. --datastore rest=DIR --datastore aded=DIR")
    return named.get(method, bare[0] if bare else None)


def specdec_runner(method: str, target, drafts, cfg: BenchConfig, opened: dict | None = None) -> Runner:
    """A runner for one of our methods; the drafter is built once and reused, as ``specdec generate`` does.
    ``opened``: the run's opened datastores (shared by its methods; opened now when absent)."""
    try:
        drafter = api.make_drafter(method, target, drafts, cfg.settings,
                                   datastore=datastore_for(method, cfg.datastore), options=cfg.options, check=False,
                                   compile=cfg.compile, opened=opened)
    except ModuleNotFoundError as err:
        raise SpecdecError(f"method {method!r} is not available in this installation ({err})") from None
    def run(ids: list[int], max_new_tokens: int) -> Generation:
        settings = replace(cfg.settings, max_new_tokens=max_new_tokens)  # the warm-up's is shorter
        result = api.run(target, ids, drafter, settings)  # on the path make_drafter resolved cfg.compile to
        steps = result.steps
        return Generation(method, "", 0, list(result.tokens), result.total_s, forwards=len(steps),
                          emitted=sum(s.new_tokens for s in steps), drafted=sum(s.drafted for s in steps),
                          accepted=sum(s.accepted for s in steps), draft_s=sum(s.draft_s for s in steps),
                          sources=result.extra.get("sources"), prefill_s=result.prefill_s)

    run.state = lambda: Drafters.of(drafter).state()[0]
    run.load_state = lambda state: Drafters.of(drafter).load_state([state])
    run.drafter = drafter  # finished after the last prompt (auto saves its --memory then)
    return run


def make_runner(label: str, target, drafts, cfg: BenchConfig, opened: dict | None = None,
                engines: dict | None = None) -> Runner:
    """The runner of a method label (bench.engines): ours, a baseline's (bench.baselines) or, on vLLM, one of
    ``engines``' (a started engine per label)."""
    name, engine = split_label(label, cfg.engine)
    if engine == "vllm":
        return vllm_runner(label, name, target, cfg, engines[label])
    if name in OUTSIDE_BASELINES:
        return baseline_runner(name, target, drafts, cfg)
    return specdec_runner(name, target, drafts, cfg, opened)


# --- the run ----------------------------------------------------------------------------------------------------


def encode_turn(target, prompt: Prompt, turn: int, answers: list[str], max_new_tokens: int) -> list[int]:
    """Token ids for turn ``turn`` of ``prompt``: later turns carry the earlier turns and this method's answers."""
    if prompt.raw:
        text = "".join(t + a + "\n\n" for t, a in zip(prompt.turns[:turn], answers)) + prompt.turns[turn]
        return api.encode_prompt(target, text, raw=True, max_new_tokens=max_new_tokens)
    history = []
    for question, answer in zip(prompt.turns[:turn], answers):
        history += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return api.encode_prompt(target, prompt.turns[turn], history=history, max_new_tokens=max_new_tokens)


def run_prompt(target, prompt: Prompt, method: str, runner: Runner, max_new_tokens: int, tick) -> list[Generation]:
    """All turns of one prompt with one method."""
    answers: list[str] = []
    out = []
    for turn in range(len(prompt.turns)):
        ids = encode_turn(target, prompt, turn, answers, max_new_tokens)
        gen = runner(ids, max_new_tokens)
        gen.method, gen.prompt_id, gen.turn = method, prompt.id, turn
        answers.append(api.decode(target, gen.tokens))
        out.append(gen)
        tick()
    return out


def rotated(methods: list[str], index: int) -> list[str]:
    """The method order for prompt ``index``: rotate by one per prompt so no method always runs first or last."""
    k = index % len(methods)
    return methods[k:] + methods[:k]


def warm_up(target, prompts: list[Prompt], runners: dict[str, Runner], max_new_tokens: int, compile: str = "off",
            drafts=()) -> None:
    """One short untimed generation per method on the first prompt's first turn, each method's learnt state
    (budget calibration, ``auto``'s memory, ``rest``'s, ``aded``'s adapted rows) restored after it. On a compiled path
    (:func:`warm_buckets`) every bucket is compiled first, so no timed step compiles one."""
    if any(hasattr(runner, "drafter") for runner in runners.values()):  # specdec's engine runs (not vLLM alone)
        warm_buckets(target, prompts, max_new_tokens, resolve(compile, target.model), drafts)
    n = min(WARMUP_TOKENS, max_new_tokens)
    ids = encode_turn(target, prompts[0], 0, [], max_new_tokens)  # checked against the run's -n, not the warm-up's
    for runner in runners.values():
        learnt = runner.state() if hasattr(runner, "state") else None
        if hasattr(runner, "before_warmup"):  # vLLM: its state lives in its processes
            runner.before_warmup()
        runner(ids, n)
        if learnt is not None:  # the warm-up warms code and caches, not what the method learns: its 8 tokens are
            runner.load_state(learnt)  # the first timed answer's own start, which auto's memory would hand back
        if hasattr(runner, "after_warmup"):
            runner.after_warmup()


def warm_buckets(target, prompts: list[Prompt], max_new_tokens: int, mode: CacheMode, drafts=()) -> None:
    """Compile every bucket of the target's static cache at the capacity the longest conversation needs (every
    turn's question, and ``max_new_tokens`` per answer), and of each draft model's (``static_cache.warm``)."""
    if not mode.compiled:
        return
    needed = CACHE_SLACK + max(
        len(encode_turn(target, p, len(p.turns) - 1, [""] * (len(p.turns) - 1), max_new_tokens))
        + max_new_tokens * len(p.turns) for p in prompts)
    static_cache.warm(target.model, mode, needed)
    for draft in drafts:  # its drafter's cache has a slot of its own: compile here, record there
        static_cache.warm(draft.model, mode, needed, slot="warm-up", keep=False)


class Progress:
    """Progress on stderr: a bar on a terminal; otherwise one line per prompt and method (cron logs, pipelines)
    with the running tokens/s of that method."""

    def __init__(self, total: int, prompts: int):
        from tqdm.auto import tqdm

        self.total, self.prompts, self.done = total, prompts, 0
        self.terminal = sys.stderr.isatty()
        self.bar = tqdm(total=total, file=sys.stderr, unit="gen", desc="bench", leave=False, disable=not self.terminal)
        self.tokens: dict[str, int] = {}
        self.seconds: dict[str, float] = {}

    def update(self, index: int, method: str, gens: list[Generation], resumed: bool = False) -> None:
        self.done += len(gens)
        self.tokens[method] = self.tokens.get(method, 0) + sum(len(g.tokens) for g in gens)
        self.seconds[method] = self.seconds.get(method, 0.0) + sum(g.seconds for g in gens)
        rate = self.tokens[method] / self.seconds[method] if self.seconds[method] else 0.0
        if self.terminal:
            self.bar.set_postfix_str(f"prompt {index + 1}/{self.prompts} {method} {rate:.1f} tok/s")
            self.bar.update(len(gens))
        else:
            sys.stderr.write(f"bench: prompt {index + 1}/{self.prompts} {method}: {rate:.1f} tok/s running "
                             f"({self.done}/{self.total} generations{', resumed' if resumed else ''})\n")
            sys.stderr.flush()

    def close(self) -> None:
        self.bar.close()


def run_generations(target, drafts, cfg: BenchConfig, prompts: list[Prompt], methods: list[str],
                    checkpoint=None, opened: dict | None = None) -> list[Generation]:
    """Every prompt with every method (order rotated per prompt); units already in ``checkpoint`` (``--resume``)
    are taken from it, new ones are added to it as they finish."""
    check_options([split_label(m, cfg.engine)[0] for m in methods], cfg.options)  # each key must be some method's
    for prompt in prompts:  # a prompt too long for -n is one error now, not after the prompts before it ran
        encode_turn(target, prompt, 0, [], cfg.settings.max_new_tokens)
    opened = {} if opened is None else opened  # one open per datastore, shared by the methods
    engines = start_vllm_engines(cfg, target)
    try:
        runners = {m: make_runner(m, target, drafts, cfg, opened, engines) for m in methods}
        if cfg.warmup:
            warm_up(target, prompts, runners, cfg.settings.max_new_tokens, cfg.compile, drafts)
        generations = run_units(target, cfg, prompts, methods, runners, checkpoint)
        for runner in runners.values():
            if hasattr(runner, "drafter"):
                runner.drafter.finish()
        for engine in engines.values():
            engine.finish()
    finally:
        close_engines(engines)
    return generations


def run_units(target, cfg: BenchConfig, prompts: list[Prompt], methods: list[str], runners: dict,
              checkpoint) -> list[Generation]:
    """Every (prompt, method) unit, the method order rotated per prompt, taken from ``checkpoint`` when it holds
    the unit (``--resume``)."""
    total = sum(len(p.turns) for p in prompts) * len(methods)
    generations: list[Generation] = []
    progress = Progress(total, len(prompts))
    restore: dict = {}  # method -> its learned state after its last unit taken from the checkpoint (--resume)
    try:
        for i, prompt in enumerate(prompts):
            for method in rotated(methods, i):
                saved = checkpoint.get(prompt.id, method) if checkpoint else None
                if saved is not None:
                    gens = [Generation(**g) for g in saved]
                    restore[method] = checkpoint.state_after(prompt.id, method)
                else:
                    if restore.get(method) is not None:  # continue from where the interrupted run stood
                        restore_state(runners[method], method, restore.pop(method), checkpoint)
                    gens = run_prompt(target, prompt, method, runners[method], cfg.settings.max_new_tokens,
                                      lambda: None)
                    if checkpoint:
                        checkpoint.add(prompt.id, method, gens, runners[method].state())
                generations += gens
                progress.update(i, method, gens, resumed=saved is not None)
    finally:
        progress.close()
    return generations


def restore_state(runner: Runner, method: str, state, checkpoint) -> None:
    """Load a method's learned state from a checkpoint file (JSON from disk: anything malformed is one error)."""
    try:
        runner.load_state(state)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError):
        raise SpecdecError(f"--resume: {checkpoint.state_path} holds a damaged state for method {method}; drop "
                           "--resume to start over") from None


def benchmark(cfg: BenchConfig, target, drafts, checkpoint=None, prompts: list[Prompt] | None = None,
              opened: dict | None = None) -> dict:
    """Run the benchmark on already loaded models and return the record (see docs/bench.md for its schema).
    ``checkpoint`` (:class:`specdec_cli.bench.checkpoint.Checkpoint`) keeps finished generations for ``--resume``.
    ``opened``: the datastores the pre-check opened (``methods.precheck_datastore``), handed to the methods."""
    set_threads(cfg.settings.threads)
    git_commit()  # the code this run loaded: asked now, kept for the record
    methods = method_list(cfg.methods, cfg.engine)
    cfg.methods = methods
    if prompts is None:
        prompts = load_prompts(cfg.prompts, cfg.limit, cfg.category, cfg.offset)
    generations = run_generations(target, drafts, cfg, prompts, methods, checkpoint, opened)
    model = getattr(target, "model", None)  # None: vLLM alone loaded the weights
    device = str(next(model.parameters()).device) if model is not None else cfg.engine
    results = summarize(generations, methods, cfg.greedy, BASELINES[cfg.engine])
    for result in results:
        result["engine"] = split_label(result["method"], cfg.engine)[1]
    return make_record(cfg, prompts, results, device)


