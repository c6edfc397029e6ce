"""A deterministic stand-in for `specdec bench` while the machine is too noisy to time: replay methods against
recorded `ar` outputs (scripts/ar_outputs.py) without the model (specdec_cli/bench/replay.py) and report what
a bench record reports -- target forwards, accepted length, `auto`'s verified / accepted per source -- plus a
modelled speedup over `ar`: the machine's measured forward times t(n) of every step plus a fixed drafting cost.

    PYTHONPATH=. python scripts/replay_bench.py docs/results/ar-outputs/ar-smollm2-135m-wide.json.gz \
        [--profile docs/results/ar-outputs/profile-quiet-smollm2-135m.json] [--methods auto,pld,ngram-trie]
        [--price docs/results/ar-outputs/profile-xeon-points16-smollm2-135m.json]
        [--opt key=value ...] [--by-category] [--json] [--row-price F]

``--profile`` is what the budgets decide with; ``--price`` (default: the same) what each step is then charged: a
budget deciding with an older profile than the machine's real curve (docs/profiling.md, "Where t(n) jumps").
``--row-price F`` replaces both with a straight line through the profile's one-row time, ``t(n) = t(1) * (1 + F *
(n - 1))``: what the methods would do on a machine where one more verification row costs ``F`` of a step (this
CPU: about 0.055 for SmolLM2; a GPU at these sizes: nearly 0; docs/benchmarks.md, "What a verification row costs").

Like bench: one drafter per method for the whole set (what it learns carries over), a warm-up of 8 tokens on
the first prompt first. The modelled time leaves out the per-step bookkeeping and the prefill, so the modelled
speedups are optimistic for every method alike; compare methods with each other, not with timed runs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_cli.bench.replay import make_drafter, replay  # noqa: E402
from specdec_cli.runtime.profile import Profile  # noqa: E402

WARMUP_TOKENS = 8  # bench's warm-up generation


def load_outputs(path: str) -> dict:
    """A file of scripts/ar_outputs.py (gzipped too: docs/results/ar-outputs/)."""
    import gzip

    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def run_method(data: dict, method: str, options: dict, clock: str, times: dict | None = None,
               price: dict | None = None) -> list[dict]:
    times = times or data["profile"]
    profile = Profile(times["points"], times["seconds"])
    charge = Profile(price["points"], price["seconds"]) if price else profile
    stop = frozenset(data["stop_ids"])
    drafter = make_drafter(method, profile, data["vocab_size"], options if method == "auto" else {}, stop)
    rows = data["rows"]
    replay(drafter, rows[0]["prompt"], rows[0]["output"], WARMUP_TOKENS, stop, clock)
    out = []
    for row in rows:
        res = replay(drafter, row["prompt"], row["output"], data["max_new_tokens"], stop, clock)
        seconds = res.seconds if not price else sum(charge(n + 1) for _, n, _ in res.steps) + res.draft_s
        out.append({"id": row["id"], "category": row["category"], "turn": row["turn"], "new_tokens": res.new_tokens,
                    "seconds": seconds, "forwards": res.forwards, "emitted": res.emitted,
                    "drafted": res.drafted, "accepted": res.accepted, "sources": res.sources})
    return out


def straight(times: dict, row_price: float) -> dict:
    """``times``' points priced on a straight line from its one-row time: ``t(n) = t(1) * (1 + row_price * (n-1))``."""
    one = Profile(times["points"], times["seconds"])(1)
    return {"points": list(times["points"]), "seconds": [one * (1 + row_price * (n - 1)) for n in times["points"]]}


def summary(gens: list[dict], ar_s: float) -> dict:
    tokens = sum(g["new_tokens"] for g in gens)
    seconds = sum(g["seconds"] for g in gens)
    sources: dict[str, dict] = {}
    for g in gens:
        for name, row in (g["sources"] or {}).items():
            acc = sources.setdefault(name, {})
            for k, v in row.items():
                acc[k] = acc.get(k, 0) + v
    return {"speedup": ar_s / seconds if seconds else 0.0, "tokens": tokens,
            "accepted_length": sum(g["emitted"] for g in gens) / max(sum(g["forwards"] for g in gens), 1),
            "verified": sum(g["drafted"] for g in gens), "accepted": sum(g["accepted"] for g in gens),
            "sources": sources}


def source_text(sources: dict) -> str:
    return ", ".join(f"{n} {r['accepted']}/{r['verified']} only {r['accepted_only']}"
                     + (f" g{r['gated_steps']}" if r.get("gated_steps") else "") for n, r in sources.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outputs", nargs="+")
    parser.add_argument("--methods", default="auto,pld,ngram-trie")
    parser.add_argument("--opt", action="append", default=[])
    parser.add_argument("--clock", default="fixed", choices=["fixed", "measured"])
    parser.add_argument("--by-category", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--profile", default=None, help="a JSON file {points, seconds}: price steps with these "
                        "forward times instead of the ones recorded with the outputs")
    parser.add_argument("--price", default=None, help="a JSON file {points, seconds}: charge each step these forward "
                        "times (default: --profile's), while the budgets still decide with --profile's")
    parser.add_argument("--row-price", type=float, default=None, help="price every method's steps at t(n) = t(1) * "
                        "(1 + F * (n - 1)), F >= 0, with t(1) from --profile (or the outputs' own)")
    args = parser.parse_args()
    if args.row_price is not None and not (math.isfinite(args.row_price) and args.row_price >= 0):
        parser.error("--row-price must be a finite number >= 0")
    missing = [p for p in args.outputs + [args.profile, args.price] if p and not Path(p).is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    options = dict(o.split("=", 1) for o in args.opt)
    report = []
    for path in args.outputs:
        data = load_outputs(path)
        times = json.loads(Path(args.profile).read_text()) if args.profile else None
        price = json.loads(Path(args.price).read_text()) if args.price else None
        if args.row_price is not None:
            times, price = straight(times or data["profile"], args.row_price), None
        results = {m: run_method(data, m, options, args.clock, times, price) for m in ["ar"] + args.methods.split(",")}
        groups = {"all": None}
        if args.by_category:
            groups.update({c: c for c in sorted({r["category"] for r in data["rows"]})})
        for label, cat in groups.items():
            pick = (lambda g: cat is None or g["category"] == cat)
            ar_s = sum(g["seconds"] for g in results["ar"] if pick(g))
            rows = {m: summary([g for g in gens if pick(g)], ar_s) for m, gens in results.items() if m != "ar"}
            best = max((m for m in rows if m != "auto"), key=lambda m: rows[m]["speedup"], default=None)
            report.append({"file": Path(path).name, "group": label, "rows": rows, "best": best})
    if args.json:
        print(json.dumps(report))
        return
    for item in report:
        rows, best = item["rows"], item["best"]
        line = "  ".join(f"{m} {r['speedup']:.3f}x ({r['accepted_length']:.2f}, {r['accepted']}/{r['verified']})"
                         for m, r in rows.items())
        ratio = rows["auto"]["speedup"] / rows[best]["speedup"] if "auto" in rows and best else math.nan
        print(f"{item['file']} [{item['group']}]: {line}  auto/best {ratio:.3f}")
        if "auto" in rows:
            print(f"    auto sources: {source_text(rows['auto']['sources'])}")
    if len(report) > 1 and all("auto" in r["rows"] and r["best"] for r in report):
        ratios = [r["rows"]["auto"]["speedup"] / r["rows"][r["best"]]["speedup"] for r in report if r["group"] == "all"]
        print(f"geomean auto/best over files: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")


if __name__ == "__main__":
    main()
