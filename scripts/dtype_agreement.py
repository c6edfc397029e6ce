"""Issue 35: how often greedy decoding of the 16-bit model (or of the GGUF blocks) gives the float32 model's output.

    python scripts/dtype_agreement.py --model smollm2-135m --prompts humaneval,mt-bench,rag,long-edit --limit 8 -n 128
    python scripts/dtype_agreement.py --dtypes blocks ...    # --kernels blocks against float32

For each prompt (first turns), `ar` at float32, bfloat16 and float16 (the 16-bit models are the float32 one with
its weights rounded to 16 bits: docs/profiling.md, issue 35), and `blocks`: float32 with `--kernels blocks` (the
same weights, read from the GGUF file's blocks); prints, per set and type, how many outputs equal float32's and
where the others first differ. JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", default="humaneval,mt-bench,rag,long-edit")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    from specdec_cli import api
    from specdec_cli.bench.metrics import first_divergence
    from specdec_cli.bench.runners import encode_turn
    from specdec_cli.io.prompts import load_prompts

    torch.set_num_threads(args.threads)
    dtypes = ["float32", *args.dtypes.split(",")]
    outputs: dict[str, dict[str, list[list[int]]]] = {}
    for dtype in dtypes:
        blocks = dtype == "blocks"  # the float32 model, its products read from the GGUF's blocks
        target, _ = api.load(args.model, dtype="float32" if blocks else dtype, device="cpu",
                             kernel_mode="blocks" if blocks else "auto")
        drafter = api.make_drafter("ar", target)
        for name in args.prompts.split(","):
            rows = outputs.setdefault(name, {}).setdefault(dtype, [])
            for prompt in load_prompts(name, args.limit):
                ids = encode_turn(target, prompt, 0, [], args.max_new_tokens)
                rows.append(api.run(target, ids, drafter, max_new_tokens=args.max_new_tokens).tokens)
        del target, drafter
    report = {}
    for name, by_dtype in outputs.items():
        for dtype in dtypes[1:]:
            div = [first_divergence(a, b) for a, b in zip(by_dtype[dtype], by_dtype["float32"])]
            report[f"{name}/{dtype}"] = {"prompts": len(div), "identical": sum(d is None for d in div),
                                         "first_divergence": [d for d in div if d is not None]}
    if args.json:
        print(json.dumps({"model": args.model, "max_new_tokens": args.max_new_tokens, "sets": report}))
        return
    for key, row in report.items():
        print(f"{args.model} {key}: {row['identical']}/{row['prompts']} identical to float32; "
              f"others first differ at tokens {row['first_divergence']}")


if __name__ == "__main__":
    main()
