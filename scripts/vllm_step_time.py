"""What one step of vLLM costs against the number of draft tokens it verifies (docs/vllm.md): a proposer that
drafts ``k`` tokens every step (a token that is never the target's, or the known greedy continuation, so all are
accepted), one prompt, 128 new tokens, one thread; ``k`` in turn over a list, twice.

    python scripts/vllm_step_time.py MODEL [--accept]           (needs vLLM: scripts/install-vllm.sh)

Milliseconds per engine step, the prefill included (one short prompt), per ``k``; the proposer itself costs
microseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KS = [0, 1, 2, 4, 6, 8, 12, 16]
SETTINGS = Path(os.environ.get("TMPDIR", "/tmp")) / "specdec-step-time.json"  # k and mode, read every step
NEVER = 3  # a draft token the target should not choose: a control token in both models' vocabularies (SmolLM2:
# <repo_name>; Gemma-3: <unk>); were it ever accepted, a step would only emit more, the time is what counts
PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and tests."


class FixedProposer:
    """vLLM's ``custom_class`` proposer: ``k`` draft tokens per decoding row, as the settings file says."""

    def __init__(self, vllm_config):
        pass

    def load_model(self, *args, **kwargs) -> None:
        pass

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None, **kwargs):
        cfg = json.loads(SETTINGS.read_text())
        out = []
        for i, new in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            known = cfg["sequence"][n: n + cfg["k"]]
            out.append([] if not len(new) else known if cfg["accept"] else [NEVER] * cfg["k"])
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--accept", action="store_true", help="draft the known greedy continuation (all accepted)")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    import specdec_cli.serving.vllm_engine as engine_module
    from specdec_cli import api
    from specdec_cli.config import SamplingConfig
    from specdec_cli.errors import SpecdecError
    from specdec_cli.serving.vllm_engine import EngineOptions

    model, accept = args.model, args.accept
    engine_module.SPEC["auto"] = {"method": "custom_class", "model": "vllm_step_time.FixedProposer",
                                  "num_speculative_tokens": max(KS)}
    try:
        text = api.load_text(model)
    except SpecdecError as err:
        parser.error(str(err))
    prompt = api.encode_prompt(text, PROMPT)
    SETTINGS.write_text(json.dumps({"k": 0, "accept": False, "sequence": []}))
    engine = api.vllm_engine("auto", text, EngineOptions(threads=1))
    first = engine.generate([prompt], 200, SamplingConfig())[0]  # the greedy continuation, for --accept: 128
    # tokens and the longest draft (16) past them, with room to spare
    best: dict[int, float] = {}
    for _ in range(2):
        for k in KS:
            SETTINGS.write_text(json.dumps({"k": k, "accept": accept, "sequence": list(prompt) + first.tokens}))
            res = engine.generate([prompt], 128, SamplingConfig())[0]
            ms = 1000 * res.seconds / res.forwards
            best[k] = min(best.get(k, ms), ms)
            print(f"k={k:2d} steps={res.forwards:3d} ms/step={ms:.2f}", flush=True)
    engine.close()
    print(json.dumps({"model": model, "accept": accept, "ms_per_step": best}))


if __name__ == "__main__":
    main()
