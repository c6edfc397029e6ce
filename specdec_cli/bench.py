"""``specdec bench``: honest side-by-side benchmarks of decoding methods (library part; the CLI is commands/bench.py).

Honesty rules the code follows (docs/bench.md has the exact metric definitions):

* every method sees the same prompts, the same ``max_new_tokens``, the same stop ids and the same sampling;
* methods are interleaved per prompt, in a rotating order, so slow drifts (thermal throttling, other processes)
  hit every method alike instead of whichever ran last;
* one untimed warm-up generation per method first (allocations, kernel selection, lazy imports);
* the speedup is measured against ``ar`` run in the same process on the same prompts -- never against a number
  from another run; ``ar`` is added when not asked for;
* transformers' own ``generate`` (plain, assisted, prompt lookup) is timed the same way, as an outside baseline;
* greedy outputs are checked token for token against ``ar``'s (the point of *lossless* speculative decoding).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from . import api
from .errors import SpecdecError
from .prompts import Prompt, load_prompts

HF_BASELINES = {
    "hf": "transformers generate(), greedy",
    "hf-assisted": "transformers generate(assistant_model=first --draft)",
    "hf-pld": "transformers generate(prompt_lookup_num_tokens=10)",
}
HF_PLD_TOKENS = 10
WARMUP_TOKENS = 8
RECORD_SCHEMA = "specdec-bench/1"
REGRESSION_EXIT_CODE = 3


@dataclass
class BenchConfig:
    model: str = "smollm2-135m"
    drafts: list[str] = field(default_factory=list)
    methods: list[str] = field(default_factory=lambda: ["ar"])
    prompts: str = "mt-bench"
    limit: int | None = None
    offset: int = 0
    category: str | None = None
    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    warmup: bool = True
    dtype: str = "auto"
    device: str = "auto"
    datastore: list[str] = field(default_factory=list)  # DIR (every method) or METHOD=DIR, e.g. rest=ds/sa
    window: int | None = None
    options: dict[str, str] = field(default_factory=dict)
    threads: int | None = None  # torch.set_num_threads; 1 is far steadier on a busy CPU
    budget: str = "auto"  # draft budget of our methods: auto, paper or a node count (specdec_cli.budget)
    kernels: str = "auto"  # the target's CPU linear kernels: auto (tuned) or torch

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Generation:
    """One timed generation of one turn of one prompt by one method.

    ``forwards``/``emitted`` count target forwards and tokens they produced (stop token included); ``drafted``,
    ``accepted`` and ``draft_s`` are None where a method cannot report them (transformers' generate).
    """

    method: str
    prompt_id: str
    turn: int
    tokens: list[int]
    seconds: float
    forwards: int | None = None
    emitted: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    draft_s: float | None = None


Runner = Callable[[list[int], int], Generation]


def method_list(methods: list[str]) -> list[str]:
    """Validated method names, ``ar`` first (added when missing: speedups and the identity check need it)."""
    names = [m.strip() for m in methods if m.strip()]
    for name in names:
        if name not in api.METHODS and name not in HF_BASELINES:
            raise SpecdecError(f"unknown method {name!r}; choose from {', '.join([*api.METHODS, *HF_BASELINES])}")
    names = list(dict.fromkeys(names))
    return names if names[:1] == ["ar"] else ["ar"] + [n for n in names if n != "ar"]


# --- runners ----------------------------------------------------------------------------------------------------


def datastore_for(method: str, specs: list[str] | str | None) -> str | None:
    """The datastore directory for ``method`` from ``--datastore`` values: ``METHOD=DIR`` wins over a bare DIR."""
    specs = [specs] if isinstance(specs, str) else list(specs or [])
    bare = [s for s in specs if "=" not in s or s.split("=", 1)[0] not in api.METHODS]
    named = dict(s.split("=", 1) for s in specs if s not in bare)
    if len(bare) > 1:
        raise SpecdecError(f"several --datastore directories without a method name: {', '.join(bare)}; "
                           "write METHOD=DIR, e.g. --datastore rest=DIR --datastore aded=DIR")
    return named.get(method, bare[0] if bare else None)


def specdec_runner(method: str, target, drafts, cfg: BenchConfig) -> Runner:
    """A runner for one of our methods; the drafter is built once and reused, as ``specdec generate`` does."""
    try:
        drafter = api.make_drafter(method, target, drafts, datastore=datastore_for(method, cfg.datastore),
                                   window=cfg.window, options=cfg.options, budget=cfg.budget)
    except ModuleNotFoundError as err:
        raise SpecdecError(f"method {method!r} is not available in this installation ({err})") from None
    sampling = api.SamplingConfig(temperature=cfg.temperature)

    def run(ids: list[int], max_new_tokens: int) -> Generation:
        result = api.run(target, ids, drafter, max_new_tokens=max_new_tokens, sampling=sampling, seed=cfg.seed)
        steps = result.steps
        return Generation(method, "", 0, list(result.tokens), result.total_s, forwards=len(steps),
                          emitted=sum(s.new_tokens for s in steps), drafted=sum(s.drafted for s in steps),
                          accepted=sum(s.accepted for s in steps), draft_s=sum(s.draft_s for s in steps))

    return run


def cut_at_stop(tokens: list[int], stop_ids) -> list[int]:
    """transformers keeps the stop token in its output; our loop does not -- compare like with like."""
    for i, tok in enumerate(tokens):
        if tok in stop_ids:
            return tokens[:i]
    return tokens


class ForwardCounter:
    """Counts forward calls of a module (a pre-hook: no effect on the computation, negligible cost)."""

    def __init__(self, module: torch.nn.Module):
        self.calls = 0
        self.handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module, args) -> None:
        self.calls += 1

    def close(self) -> None:
        self.handle.remove()


def hf_kwargs(method: str, target, drafts, cfg: BenchConfig) -> dict:
    """``generate`` arguments matching our loop: same budget, stop ids and sampling; no minimum length."""
    stop = sorted(target.stop_ids)
    pad = getattr(target.tokenizer, "pad_token_id", None)
    kwargs: dict = dict(eos_token_id=stop or None, pad_token_id=pad if pad is not None else (stop or [0])[0],
                        do_sample=not cfg.greedy, min_new_tokens=0)
    if cfg.greedy:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    else:
        kwargs.update(temperature=cfg.temperature, top_p=1.0, top_k=0)
    if method == "hf-assisted":
        if not drafts:
            raise SpecdecError("method hf-assisted needs a draft model (--draft)")
        kwargs["assistant_model"] = drafts[0].model
    elif method == "hf-pld":
        kwargs["prompt_lookup_num_tokens"] = HF_PLD_TOKENS
    return kwargs


def hf_runner(method: str, target, drafts, cfg: BenchConfig) -> Runner:
    """transformers' own ``generate`` as a baseline, timed around the whole call (prefill included, like ours)."""
    model = target.model
    kwargs = hf_kwargs(method, target, drafts, cfg)

    def run(ids: list[int], max_new_tokens: int) -> Generation:
        input_ids = torch.tensor([ids], device=model.device)
        counter = ForwardCounter(model)
        torch.manual_seed(cfg.seed)
        try:
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                     max_new_tokens=max_new_tokens, **kwargs)
            seconds = time.perf_counter() - t0
        finally:
            counter.close()
        produced = [int(t) for t in out[0, len(ids):].tolist()]
        tokens = cut_at_stop(produced, target.stop_ids)
        return Generation(method, "", 0, tokens, seconds, forwards=counter.calls, emitted=len(produced))

    return run


def make_runner(method: str, target, drafts, cfg: BenchConfig) -> Runner:
    if method in HF_BASELINES:
        return hf_runner(method, target, drafts, cfg)
    return specdec_runner(method, target, drafts, cfg)


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


def warm_up(target, prompts: list[Prompt], runners: dict[str, Runner], max_new_tokens: int) -> None:
    """One short untimed generation per method on the first prompt's first turn."""
    n = min(WARMUP_TOKENS, max_new_tokens)
    ids = encode_turn(target, prompts[0], 0, [], n)
    for runner in runners.values():
        runner(ids, n)


def progress_bar(total: int):
    """tqdm on stderr; disabled when stderr is not a terminal (cron logs stay clean)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, file=sys.stderr, unit="gen", desc="bench", leave=False, disable=None)


def run_generations(target, drafts, cfg: BenchConfig, prompts: list[Prompt], methods: list[str]) -> list[Generation]:
    runners = {m: make_runner(m, target, drafts, cfg) for m in methods}
    if cfg.warmup:
        warm_up(target, prompts, runners, cfg.max_new_tokens)
    total = sum(len(p.turns) for p in prompts) * len(methods)
    generations: list[Generation] = []
    with progress_bar(total) as bar:
        for i, prompt in enumerate(prompts):
            for method in rotated(methods, i):
                generations += run_prompt(target, prompt, method, runners[method], cfg.max_new_tokens,
                                          lambda: bar.update(1))
    return generations


# --- metrics ----------------------------------------------------------------------------------------------------


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (the shorter length when one is a prefix of the other); None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def total(gens: list[Generation], attr: str) -> float | None:
    """Sum of ``attr`` over generations; None when any generation cannot report it."""
    values = [getattr(g, attr) for g in gens]
    return None if any(v is None for v in values) else sum(values)


def identity_check(gens: list[Generation], reference: dict[tuple[str, int], list[int]]) -> dict:
    mismatches = []
    for g in gens:
        div = first_divergence(g.tokens, reference[(g.prompt_id, g.turn)])
        if div is not None:
            mismatches.append({"prompt_id": g.prompt_id, "turn": g.turn, "first_divergence": div})
    return {"lossless": not mismatches, "identical": len(gens) - len(mismatches), "mismatches": mismatches}


def per_prompt_entry(g: Generation) -> dict:
    """One generation's raw counts: enough to re-aggregate records of several runs (``merge_records``)."""
    return {"prompt_id": g.prompt_id, "turn": g.turn, "new_tokens": len(g.tokens), "seconds": round(g.seconds, 6),
            "forwards": g.forwards, "emitted": g.emitted, "drafted": g.drafted, "accepted": g.accepted,
            "draft_s": None if g.draft_s is None else round(g.draft_s, 6)}


def summarize_method(method: str, gens: list[Generation], ar_tokens_per_s: float | None,
                     reference: dict | None) -> dict:
    """Aggregate metrics of one method over the prompt set (definitions in docs/bench.md)."""
    tokens = sum(len(g.tokens) for g in gens)
    seconds = sum(g.seconds for g in gens)
    forwards, emitted = total(gens, "forwards"), total(gens, "emitted")
    drafted, accepted, draft_s = total(gens, "drafted"), total(gens, "accepted"), total(gens, "draft_s")
    tokens_per_s = ratio(tokens, seconds) or 0.0
    row = {
        "method": method,
        "generations": len(gens),
        "new_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens_per_s,
        "mean_token_ms": 1000 * seconds / tokens if tokens else None,
        "speedup": ratio(tokens_per_s, ar_tokens_per_s),
        "mean_accepted_length": ratio(emitted, forwards),
        "sigma": 1 - accepted / drafted if drafted else None,
        "eta": ratio(forwards, emitted),
        "draft_ms_per_step": 1000 * draft_s / forwards if draft_s is not None and forwards else None,
        "lossless": None,
        "identical": None,
        "mismatches": [],
        "per_prompt": [per_prompt_entry(g) for g in gens],
    }
    if reference is not None:
        row.update(identity_check(gens, reference))
    return row


def summarize(generations: list[Generation], methods: list[str], greedy: bool) -> list[dict]:
    by_method = {m: [g for g in generations if g.method == m] for m in methods}
    ar = by_method["ar"]
    ar_tps = ratio(sum(len(g.tokens) for g in ar), sum(g.seconds for g in ar))
    reference = {(g.prompt_id, g.turn): g.tokens for g in ar} if greedy else None
    return [summarize_method(m, by_method[m], ar_tps, reference) for m in methods]


# --- the record -------------------------------------------------------------------------------------------------


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_name() -> str | None:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def machine_info() -> dict:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": gpu_name(),
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "specdec": package_version("specdec"),
    }


def git_commit() -> str | None:
    """HEAD of the git checkout holding this package, or None (installed from a wheel, no git, ...)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else None


def make_record(cfg: BenchConfig, prompts: list[Prompt], results: list[dict], device: str) -> dict:
    return {
        "schema": RECORD_SCHEMA,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {**machine_info(), "device": device},
        "git_commit": git_commit(),
        "config": asdict(cfg),
        "prompt_set": cfg.prompts,
        "num_prompts": len(prompts),
        "identity_checked": cfg.greedy,
        "note": None if cfg.greedy else "temperature > 0: sampled outputs differ by design; identity check skipped",
        "results": results,
    }


def set_threads(threads: int | None) -> None:
    """``torch.set_num_threads`` (before loading: kernel plans and forward-time profiles are per thread count)."""
    if threads is not None:
        if threads < 1:
            raise SpecdecError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)


def benchmark(cfg: BenchConfig, target, drafts) -> dict:
    """Run the benchmark on already loaded models and return the record (see docs/bench.md for its schema)."""
    if cfg.max_new_tokens < 1:
        raise SpecdecError(f"--max-new-tokens must be >= 1, got {cfg.max_new_tokens}")
    api.SamplingConfig(temperature=cfg.temperature).validate()
    set_threads(cfg.threads)
    methods = method_list(cfg.methods)
    cfg.methods = methods
    prompts = load_prompts(cfg.prompts, cfg.limit, cfg.category, cfg.offset)
    generations = run_generations(target, drafts, cfg, prompts, methods)
    device = str(next(target.model.parameters()).device)
    return make_record(cfg, prompts, summarize(generations, methods, cfg.greedy), device)


# --- merging shards: several runs of one configuration over disjoint prompts ----------------------------------

MERGE_CONFIG_KEYS = ("model", "drafts", "methods", "prompts", "category", "max_new_tokens", "temperature", "dtype",
                     "device", "datastore", "window", "options", "threads", "budget", "kernels")
MERGE_MACHINE_KEYS = ("cpu", "cpu_count", "gpu", "device", "torch", "transformers")


def generations_of(result: dict) -> list[Generation]:
    """Generations rebuilt from a result's ``per_prompt`` counts (token values are not stored, only how many)."""
    return [Generation(result["method"], p["prompt_id"], p["turn"], [0] * p["new_tokens"], p["seconds"],
                       p.get("forwards"), p.get("emitted"), p.get("drafted"), p.get("accepted"), p.get("draft_s"))
            for p in result["per_prompt"]]


def merge_records(records: list[dict]) -> dict:
    """One record for several shards of a run (``--offset``/``--limit``): same configuration and machine, disjoint
    prompts. Every metric is recomputed from the per-generation counts, speedups against the pooled ``ar``."""
    if len(records) < 2:
        raise SpecdecError("bench-merge needs at least two records")
    for rec in records:
        results = rec.get("results") if isinstance(rec, dict) else None
        if not results or rec.get("schema") != RECORD_SCHEMA or not all("per_prompt" in r for r in results) \
                or not any(r.get("method") == "ar" for r in results):
            raise SpecdecError(f"not a {RECORD_SCHEMA} record with an ar result: {str(rec)[:60]}...")
    base = records[0]
    for rec in records[1:]:
        diff = [k for k in MERGE_CONFIG_KEYS if rec["config"].get(k) != base["config"].get(k)]
        diff += [f"machine {k}" for k in MERGE_MACHINE_KEYS if rec["machine"].get(k) != base["machine"].get(k)]
        if diff:
            raise SpecdecError(f"cannot merge records that differ in {', '.join(diff)}")
    methods = base["config"]["methods"]
    seen: set[tuple[str, int]] = set()
    for rec in records:
        ar = next(r for r in rec["results"] if r["method"] == "ar")
        keys = {(p["prompt_id"], p["turn"]) for p in ar["per_prompt"]}
        if keys & seen:
            raise SpecdecError(f"records overlap in prompts, e.g. {sorted(keys & seen)[0][0]}; merge disjoint shards")
        seen |= keys
    rows = {m: [r for rec in records for r in rec["results"] if r["method"] == m] for m in methods}
    ar_gens = [g for row in rows["ar"] for g in generations_of(row)]
    ar_tps = ratio(sum(len(g.tokens) for g in ar_gens), sum(g.seconds for g in ar_gens))
    results = []
    for method in methods:
        merged = summarize_method(method, [g for row in rows[method] for g in generations_of(row)], ar_tps, None)
        checked = [row for row in rows[method] if row.get("lossless") is not None]
        if checked and len(checked) == len(rows[method]):
            merged.update(lossless=all(row["lossless"] for row in checked),
                          identical=sum(row["identical"] for row in checked),
                          mismatches=[m for row in checked for m in row["mismatches"]])
        results.append(merged)
    return {**base, "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "config": {**base["config"], "offset": None, "limit": None},
            "num_prompts": sum(rec["num_prompts"] for rec in records), "results": results,
            "merged_from": [{"timestamp": rec["timestamp"], "offset": rec["config"].get("offset"),
                             "limit": rec["config"].get("limit"), "git_commit": rec.get("git_commit")}
                            for rec in records]}


# --- history: --out and --compare --------------------------------------------------------------------------------


def append_record(path: str, record: dict) -> None:
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
    except OSError as err:
        raise SpecdecError(f"cannot write --out {path}: {err.strerror or err}") from None


def read_records(path: str, what: str = "--compare") -> list[dict]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise SpecdecError(f"cannot read {what} {path}: {err.strerror or err}") from None
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise SpecdecError(f"{what} {path}: line {n} is not JSON") from None
    return records


def latest_result(records: list[dict], model: str, prompt_set: str, method: str) -> dict | None:
    """The method's result in the newest record (by file order) with the same model and prompt set."""
    for record in reversed(records):
        if record.get("config", {}).get("model") != model or record.get("prompt_set") != prompt_set:
            continue
        for result in record.get("results", []):
            if result.get("method") == method:
                return result
    return None


def compare(record: dict, old_records: list[dict], tolerance: float) -> list[dict]:
    """One finding per method: ``regression`` when the speedup fell by more than ``tolerance`` (a fraction) or the
    greedy output is no longer identical to ``ar``'s; ``ok``; or ``new`` when there is nothing to compare with."""
    findings = []
    model, prompt_set = record["config"]["model"], record["prompt_set"]
    for result in record["results"]:
        old = latest_result(old_records, model, prompt_set, result["method"])
        new_speedup = result.get("speedup")
        old_speedup = old.get("speedup") if old else None
        change = ratio(new_speedup, old_speedup)
        reasons = []
        if result.get("lossless") is False:
            reasons.append("output differs from ar")
        if change is not None and change < 1 - tolerance:
            reasons.append(f"speedup {old_speedup:.2f} -> {new_speedup:.2f} ({(change - 1) * 100:+.0f}%)")
        status = "regression" if reasons else ("new" if old is None else "ok")
        findings.append({"method": result["method"], "old_speedup": old_speedup, "new_speedup": new_speedup,
                         "change": None if change is None else change - 1, "status": status, "reasons": reasons})
    return findings


def has_regression(findings: list[dict]) -> bool:
    return any(f["status"] == "regression" for f in findings)


# --- output -----------------------------------------------------------------------------------------------------

COLUMNS = ["method", "tok/s", "ms/tok", "speedup", "acc.len", "sigma", "eta", "draft ms/step", "lossless"]


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def lossless_cell(result: dict) -> str:
    if result["lossless"] is None:
        return "n/a (sampled)"
    n = result["generations"]
    if result["lossless"]:
        return f"yes {n}/{n}"
    first = result["mismatches"][0]
    return f"NO {result['identical']}/{n} (first: {first['prompt_id']} t{first['turn']} @{first['first_divergence']})"


def table_rows(record: dict) -> list[list[str]]:
    return [[r["method"], fmt(r["tokens_per_s"], ".1f"), fmt(r["mean_token_ms"], ".2f"), fmt(r["speedup"], ".2f") + "x",
             fmt(r["mean_accepted_length"], ".2f"), fmt(r["sigma"], ".2f"), fmt(r["eta"], ".2f"),
             fmt(r["draft_ms_per_step"], ".2f"), lossless_cell(r)] for r in record["results"]]


def title(record: dict) -> str:
    cfg = record["config"]
    return (f"{cfg['model']} | {record['prompt_set']} ({record['num_prompts']} prompts) | "
            f"max_new_tokens={cfg['max_new_tokens']} | {'greedy' if cfg['temperature'] == 0 else 'T=' + str(cfg['temperature'])}"
            f" | {record['machine']['device']}")


def plain_table(record: dict) -> str:
    """Aligned plain text (for pipes, logs and cron mail)."""
    rows = [COLUMNS] + table_rows(record)
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [title(record)] + ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    if record.get("note"):
        lines.append(f"note: {record['note']}")
    return "\n".join(lines)


def print_table(record: dict, terminal: bool, file=None) -> None:
    """A rich table on a terminal, plain aligned text otherwise."""
    file = file or sys.stdout
    if not terminal:
        print(plain_table(record), file=file)
        return
    from rich.console import Console
    from rich.table import Table

    from rich import box

    rows = table_rows(record)
    table = Table(title=title(record), box=box.SIMPLE_HEAD, pad_edge=False)
    for i, col in enumerate(COLUMNS):
        # headers may wrap at spaces; cells never get cut
        width = max([len(row[i]) for row in rows] + [len(word) for word in col.split()])
        table.add_column(col, justify="left" if i in (0, len(COLUMNS) - 1) else "right", min_width=width)
    for row in rows:
        style = "red" if row[-1].startswith("NO") else None
        table.add_row(*row, style=style)
    console = Console(file=file, force_terminal=True)
    console.print(table)
    if record.get("note"):
        console.print(f"note: {record['note']}")


def comparison_text(findings: list[dict], tolerance: float) -> str:
    lines = [f"compare (tolerance {tolerance:.0%}):"]
    for f in findings:
        detail = "; ".join(f["reasons"]) or (
            "no earlier record" if f["status"] == "new" else
            f"speedup {fmt(f['old_speedup'], '.2f')} -> {fmt(f['new_speedup'], '.2f')}")
        lines.append(f"  {f['method']:<12} {f['status'].upper():<10} {detail}")
    return "\n".join(lines)


def plot_speedups(record: dict, path: str) -> None:
    """A PNG bar chart of speedups vs ar (matplotlib's Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [r["method"] for r in record["results"]]
    speedups = [r["speedup"] or 0.0 for r in record["results"]]
    colors = ["#999999" if m == "ar" else ("#d62728" if r["lossless"] is False else "#1f77b4")
              for m, r in zip(methods, record["results"])]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(methods) + 1), 3.6))
    bars = ax.bar(methods, speedups, color=colors)
    ax.bar_label(bars, labels=[f"{s:.2f}x" for s in speedups], fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_ylabel("speedup vs ar (tokens/s ratio)")
    ax.set_title(title(record), fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=120)
    except OSError as err:
        raise SpecdecError(f"cannot write --plot {path}: {err.strerror or err}") from None
    finally:
        plt.close(fig)
