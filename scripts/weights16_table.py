"""16-bit weights against float32 and llama.cpp: the done criteria (issue 35) from the records of
scripts/bench_weights16.sh OUT_DIR.

    python scripts/weights16_table.py OUT_DIR

Per model and prompt set: decode tokens/s of `ar` at bfloat16 and float16 against llama.cpp F16's plain decode
(>= 0.9x) and against specdec's float32 `ar` (>= 1.7x); `auto` at 16 bits end to end against llama.cpp F16 end to
end (>= 1.4x); whether every method was identical to `ar` at each dtype; llama.cpp's identity to `ar` at the same
weights; peak RSS at 16 bits against float32 (<= 0.55x); the 16-bit/float32 agreement; the 7B run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SETS = ("humaneval", "mt-bench", "rag", "long-edit")


def last_record(path: Path) -> dict | None:
    if not path.exists():
        return None
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return json.loads(lines[-1]) if lines else None


def rows(record: dict | None) -> dict:
    return {r["method"]: r for r in (record or {}).get("results", [])}


def ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def model_table(out: Path, model: str) -> list[str]:
    lines = [f"### {model}", "", "| set | ar bf16 decode tok/s | ar f16 | llama.cpp F16 | ar f32 | bf16 ar / llama F16 "
             "(>= 0.9) | bf16 ar / f32 ar (>= 1.7) | auto bf16 / llama F16 end to end (>= 1.4) | identical to ar "
             "(bf16 / f16 / f32) | llama.cpp = ar (BF16 / F32) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for s in SETS:
        b16, f16, f32 = (rows(last_record(out / f"{model}-{s}-{d}.jsonl")) for d in ("bf16", "f16", "f32"))
        if not b16:  # the set did not run for this model
            continue
        dec = lambda r, m: (r.get(m) or {}).get("decode_tokens_per_s")  # noqa: E731
        e2e = lambda r, m: (r.get(m) or {}).get("tokens_per_s")  # noqa: E731
        same = "/".join("-" if not r else "yes" if all(x.get("lossless") for k, x in r.items()
                                                        if not k.startswith("llama")) else "NO" for r in (b16, f16, f32))
        llama = "/".join(str((r.get("llama-cpp") or {}).get("identical", "-")) for r in (b16, f32))
        tps = lambda v: f"{v:.1f}" if v else "-"  # noqa: E731 - a dtype or method that did not run
        lines.append(f"| {s} | {tps(dec(b16, 'ar'))} | {tps(dec(f16, 'ar'))} | "
                     f"{tps(dec(b16, 'llama-cpp-f16'))} | {tps(dec(f32, 'ar'))} | "
                     f"{ratio(dec(b16, 'ar'), dec(b16, 'llama-cpp-f16'))} | {ratio(dec(b16, 'ar'), dec(f32, 'ar'))} | "
                     f"{ratio(e2e(b16, 'auto'), e2e(b16, 'llama-cpp-f16'))} | {same} | {llama} |")
    rss = {d: (last_record(out / f"{model}-memory-{d}.jsonl") or {}).get("peak_rss_mib")
           for d in ("float32", "bfloat16", "float16")}
    lines += ["", "peak RSS (ar alone): " + ", ".join(f"{d} {v:.0f} MiB" for d, v in rss.items() if v)
              + f"; bfloat16 / float32 = {ratio(rss['bfloat16'], rss['float32'])} (<= 0.55)"]
    agree = out / f"{model}-agreement.json"
    if agree.exists() and agree.stat().st_size:  # empty while scripts/dtype_agreement.py still runs
        sets = json.loads(agree.read_text())["sets"]
        lines.append("16-bit greedy = float32: " + ", ".join(f"{k} {v['identical']}/{v['prompts']}"
                                                            for k, v in sets.items()))
    return lines + [""]


def main() -> None:
    out = Path(sys.argv[1])
    models = sorted({p.name.split("-memory-")[0] for p in out.glob("*-memory-*.jsonl")}
                    | {p.name.split(f"-{s}-")[0] for s in SETS for p in out.glob(f"*-{s}-bf16.jsonl")})
    lines = ["## 16-bit weights against float32 and llama.cpp (issue 35; scripts/bench_weights16.sh)", ""]
    for model in models:
        lines += model_table(out, model)
    seven = out / "7b.json"
    if seven.exists():
        r = json.loads(seven.read_text())
        lines.append(f"7B ({r['dtype']}): peak RSS {r['peak_rss_gb']:.1f} GB, ar {r['ar_decode_tokens_per_s']:.2f} tok/s "
                     f"decode ({r['ar_step_ms']:.0f} ms a step, {100 * r['share_of_ceiling']:.0f}% of the "
                     f"{r['ceiling_step_ms']:.0f} ms ceiling at {r['read_bandwidth_gbs']:.1f} GB/s), auto "
                     f"{r['auto_decode_tokens_per_s']:.2f} tok/s, identical: {r['identical']}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
