"""Issue 35: a 7B target fits this machine in bfloat16 and decodes with `ar` and `auto` (offline, random weights).

    python scripts/bench_7b.py [--layers 32] [--new-tokens 32] [--threads 1] [--dtype bfloat16] [--json]

Builds a Llama with codellama-7b's dimensions (LlamaConfig: hidden 4096, MLP 11008, 32 layers of 32 heads,
vocabulary 32016, rope theta 1e6) from its config alone -- no download -- with every parameter created directly
in 16 bits (on the meta device, then allocated as bfloat16 and filled in place: no float32 pass, so the peak
resident memory is the 13.5 GB of weights plus what decoding needs). It installs specdec's kernels (the 16-bit
plans, measured once per machine), then decodes the same prompt with `ar` and with `auto` (drafting from the
prompt and the output: the random model's greedy output repeats itself, so `auto` finds drafts), checks that
both give the same tokens, and reports tokens/s, the decode step, the peak RSS and the step against the
memory-bound ceiling: the weights' bytes over the single-thread read bandwidth measured just before (a numpy sum
over 512 MB, as scripts/bench_step.sh measures it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# codellama/CodeLlama-7b-hf's config.json (the dimensions only; the weights are random)
CODELLAMA_7B = dict(vocab_size=32016, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=16384,
                    rms_norm_eps=1e-5, rope_theta=1e6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
INIT_STD = 0.02  # LlamaConfig's initializer_range
PROMPT_TOKENS = 48  # a short prompt: its prefill is compute-bound (48 rows through 13.5 GB of weights)


def read_bandwidth() -> float:
    """Single-thread read bandwidth, GB/s: the best of five numpy sums over 512 MB (scripts/bench_step.sh)."""
    import numpy as np

    a = np.ones(512 * 1024 * 1024 // 8)
    best = min((lambda t: (a.sum(), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(5))
    return a.nbytes / best / 1e9


def random_llama(layers: int, dtype):
    """A codellama-7b-shaped Llama with random weights, made in ``dtype`` without a float32 copy."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(**{**CODELLAMA_7B, "num_hidden_layers": layers})
    cfg._attn_implementation = "sdpa"
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)  # RMSNorm weights
            else:
                p.normal_(0.0, INIT_STD, generator=gen)  # drawn into the 16-bit tensor itself
    model.model.rotary_emb = LlamaRotaryEmbedding(cfg)  # its inv_freq buffer, in float32, on the CPU
    return model.eval()


def prompt_ids(vocab: int) -> list[int]:
    """A prompt with repeats (a pattern of 12 tokens four times), as prompts that ask for edits of their text."""
    pattern = [(7919 * i) % (vocab - 3) + 3 for i in range(12)]
    return [1] + pattern * (PROMPT_TOKENS // 12)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    from specdec_cli import api
    from specdec_cli.io.models import LoadedModel
    from specdec_cli.runtime import decoder, kernels
    from specdec_cli.runtime.machine import peak_rss_bytes

    torch.set_num_threads(args.threads)
    bandwidth = read_bandwidth()
    t0 = time.perf_counter()
    model = random_llama(args.layers, getattr(torch, args.dtype))
    built_s, rss_built = time.perf_counter() - t0, peak_rss_bytes()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kernels.install(model, progress=lambda m: print(f"bench_7b: {m}", file=sys.stderr))
    assert decoder.decoder_for(model).wide, "the 16-bit kernels did not take the model"
    target = LoadedModel(model, None, "random:codellama-7b", False)
    target.fingerprint = "random-codellama-7b"  # no tokenizer: token ids in, token ids out
    ids = prompt_ids(CODELLAMA_7B["vocab_size"])
    runs = {}
    for method in ("ar", "auto"):
        drafter = api.make_drafter(method, target, budget="auto")
        result = api.run(target, ids, drafter, max_new_tokens=args.new_tokens)
        decode_s = result.total_s - result.prefill_s
        runs[method] = {"tokens_per_s": len(result.tokens) / result.total_s, "prefill_s": result.prefill_s,
                        "decode_tokens_per_s": len(result.tokens) / decode_s, "forwards": len(result.steps),
                        "tokens": result.tokens}
    step_s = 1 / runs["ar"]["decode_tokens_per_s"]
    ceiling_s = weight_bytes / (bandwidth * 1e9)
    report = {"layers": args.layers, "dtype": args.dtype, "weights_gb": weight_bytes / 1e9, "build_s": built_s,
              "rss_after_build_gb": rss_built / 1e9, "peak_rss_gb": peak_rss_bytes() / 1e9,
              "read_bandwidth_gbs": bandwidth, "ceiling_step_ms": 1000 * ceiling_s, "ar_step_ms": 1000 * step_s,
              "share_of_ceiling": ceiling_s / step_s, "identical": runs["ar"]["tokens"] == runs["auto"]["tokens"],
              **{f"{m}_{k}": v for m, r in runs.items() for k, v in r.items() if k != "tokens"}}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for key, value in report.items():
            print(f"{key:>26}: {value:.3f}" if isinstance(value, float) else f"{key:>26}: {value}")
    if not report["identical"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
