"""GPU probe (docs/gpu.md): a SmolLM2-shaped Llama with random weights (no files, so it runs on a machine that
reaches nothing) on the eager and compiled paths: forward-time profiles (the round-robin timing as it was before
every bucket was warmed, and runtime.profile.measure's), ar and pld generations, and a torch.profiler table of
compiled ar steps.

    OUT=results-folder python scripts/gpu_probe.py [--tiny]

Writes probe.json and prof_compiled.txt (prof_off.txt too with --tiny, a 2-layer model for a CPU dry run).
"""
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from specdec_cli.runtime import profile, forward
from specdec_cli.runtime.cache_mode import CacheMode
from specdec_cli.engine.loop import generate
from specdec_cli.engine.drafter import Drafter
from specdec_cli.engine.budget import Budget
from specdec_cli.methods.pld import PromptLookup

OUT = os.environ.get("OUT", ".")
tiny = "--tiny" in sys.argv
dev = "cuda" if torch.cuda.is_available() else "cpu"
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
POINTS = (1, 2, 3, 4)  # buckets 1, 2 and 4 only: each compiles in ~10-40 s on a cold machine
NEW = 128 if not tiny else 8  # as bench; 8 for the CPU dry run
cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=2 if tiny else 30,
                  num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0, tie_word_embeddings=True,
                  max_position_embeddings=8192, rms_norm_eps=1e-5)
cfg._attn_implementation = "sdpa"
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).eval().to(dev)
res = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", "torch": torch.__version__}


def dump():
    json.dump(res, open(f"{OUT}/probe.json", "w"), indent=1)


def old_measure(mode):
    """profile.measure as it was (one warm-up call at 4 tokens, then the round-robin)."""
    vocab, context = 49152, profile.CONTEXT
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, vocab, (context + max(POINTS) + 1,), generator=gen).tolist()
    cache = forward.new_cache(model, context + max(POINTS) + 8, mode)
    forward.forward_chain(model, cache, ctx[:context], keep=0)
    def once(n):
        sync(); t0 = time.perf_counter()
        forward.forward_tree(model, cache, ctx[context], ctx[context + 1: context + n], profile._tree(n - 1))
        sync(); s = time.perf_counter() - t0
        forward.crop(cache, context); return s
    once(4)
    best = {n: float("inf") for n in POINTS}
    for rep in range(2):
        for n in POINTS:
            if rep == 0 or n <= 4:
                best[n] = min(best[n], once(n))
    return [best[n] for n in POINTS]


prompt = (list(range(1000, 1040)) * 3)[:100]  # a 40-token run repeated: something for pld to find
for mode in (CacheMode.EAGER, CacheMode.COMPILED):
    r = res.setdefault(mode.value, {})
    t = time.perf_counter()
    if mode.compiled:
        r["old_profile_raw"] = old_measure(mode); r["old_profile_s"] = time.perf_counter() - t; dump()
        print("old", r["old_profile_raw"], flush=True)
    t = time.perf_counter()
    with torch.inference_mode():
        p = profile.measure(model, points=POINTS, cache_mode=mode)
    r["profile"] = p.seconds; r["profile_s"] = time.perf_counter() - t; dump()
    print(mode.value, "profile", p.seconds, flush=True)
    for name in ("ar", "pld"):
        d = Drafter() if name == "ar" else PromptLookup(num_pred=3)  # drafts of <= 3: buckets 1, 2, 4 only
        d.budget = Budget("paper" if name == "ar" else "auto", p)
        generate(model, prompt, d, max_new_tokens=8, cache_mode=mode)
        sync(); t = time.perf_counter()
        g = generate(model, prompt, d, max_new_tokens=NEW, cache_mode=mode)
        sync(); s = time.perf_counter() - t
        r[name] = {"s": s, "tok_s": len(g.tokens) / s, "summary": g.summary()}
        print(mode.value, name, r[name]["tok_s"], g.summary(), flush=True); dump()
    if mode.compiled or tiny:
        from torch.profiler import profile as tprof, ProfilerActivity
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
        with tprof(activities=acts) as pr:
            generate(model, prompt, Drafter(), max_new_tokens=20, cache_mode=mode)
        key = "self_cuda_time_total" if dev == "cuda" else "self_cpu_time_total"
        open(f"{OUT}/prof_{mode.value}.txt", "w").write(
            pr.key_averages().table(sort_by="self_cpu_time_total", row_limit=40) + "\n\n" +
            pr.key_averages().table(sort_by=key, row_limit=25))
print(json.dumps(res)[:3000])
