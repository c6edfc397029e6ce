"""specdec's proposer on vLLM against vLLM's SuffixDecoding, replayed without either engine (docs/vllm.md).

Greedy verification accepts the longest prefix of a chain that agrees with the target's own greedy output, and an
`ar` run has written that output down (docs/results/ar-outputs/). So both drafters can run against it alone:
specdec's :class:`~specdec_cli.serving.chains.ChainDrafter` as its vLLM proposer builds it (context and memory),
and arctic-inference's ``SuffixDecodingCache`` with the calls and defaults vLLM's ``SuffixDecodingProposer`` makes
(tree depth 24, spec factor 1.0, min token prob 0.1). Each step is charged ``a + b * T`` for ``T`` computed tokens,
vLLM's CPU step measured in the peers runs (Gemma-3: a = 33.5 ms, b = 3.4 ms; SmolLM2: 20.8 and 2.8), and
specdec's proposer learns its step cost from those same charges. As in `bench`, the first prompt warms up first
(8 tokens) and specdec's proposer then forgets what it learnt (`SpecdecProposer.mark`: its memory, calibration,
step cost and gates; SuffixDecoding keeps its cache, as on vLLM); 128 new tokens, 16 draft tokens at most (the
`auto` method's window on vLLM).

    python scripts/replay_vllm.py MODEL A_MS B_MS [SETS...]     (needs arctic-inference: scripts/install-vllm.sh)
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replay_bench import load_outputs  # noqa: E402
from specdec_cli.serving.chains import common_prefix  # noqa: E402
from specdec_cli.serving.proposer import build_drafter, read_settings  # noqa: E402

OUTPUTS = Path(__file__).resolve().parents[1] / "docs" / "results" / "ar-outputs"
SETS = ["humaneval", "mt-bench", "rag", "long-edit", "wide", "wide-heldout"]
NEW_TOKENS, WARMUP_TOKENS = 128, 8
WINDOW = 16  # specdec's proposer on vLLM: num_speculative_tokens (serving/vllm_engine.py; suffix's: its depth)
SUFFIX_DEPTH, SUFFIX_FACTOR, SUFFIX_MIN_PROB = 24, 1.0, 0.1  # vLLM's SpeculativeConfig defaults for `suffix`


def replay_set(rows: list[dict], stop: set, propose, cost) -> tuple[float, float, float]:
    """(tokens per modelled second, accepted length, draft tokens per step) of one drafter over ``rows``;
    ``propose(k, row, out, new, limit)`` returns the chain for prompt ``k`` after ``out`` tokens (``new``: the
    last step's), ``limit=None`` ends the request."""
    seconds = tokens = steps = sent = 0
    for k, row in enumerate([rows[0]] + rows):
        truth, out, new = row["output"], 0, []
        budget = WARMUP_TOKENS if k == 0 else NEW_TOKENS
        while out < budget and out < len(truth):
            chain = propose(k, row, out, new, WINDOW)  # vLLM limits a draft by the model's length only
            accepted = common_prefix(chain, truth[out:])
            new = truth[out: out + accepted + 1]
            step = cost(1 + len(chain), len(new))
            kept = min(len(new), budget - out)  # tokens past max_tokens are computed, then dropped
            out += len(new)
            if k:
                seconds, tokens, steps, sent = seconds + step, tokens + kept, steps + 1, sent + len(chain)
            if stop & set(new):
                break
        propose(k, row, out, new, None)  # the request ends
    return tokens / seconds, tokens / steps, sent / steps


def specdec(vocab_size: int, a: float, b: float):
    drafter = build_drafter(read_settings(), vocab_size)
    mark = []

    def propose(k, row, out, new, limit):
        if limit is None:
            drafter.end(k)
            if k == 0:  # the warm-up ends: back to what the drafter knew before it (bench's back_to_mark)
                (drafter.calibration, drafter.cost, drafter.gates), memory = mark
                drafter.pending = {}
                drafter.memory.load_state(memory)
            return []
        if out == 0 and k == 0:
            mark.append(copy.deepcopy((drafter.calibration, drafter.cost, drafter.gates)))
            mark.append(drafter.memory.state())
        if out == 0:
            drafter.begin(k, row["prompt"])
            return []  # the prefill step drafts nothing
        drafter.advance(k, new)
        return drafter.draft([k], [limit])[0] if limit > 0 else []

    def cost(computed, emitted):
        seconds = a + b * computed
        drafter.cost.observe(computed, seconds, emitted)
        return seconds

    return propose, cost


def suffix(a: float, b: float):
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    cache = SuffixDecodingCache(max_tree_depth=SUFFIX_DEPTH, max_cached_requests=10000)
    seen: dict[int, list[int]] = {}

    def propose(k, row, out, new, limit):
        if limit is None:
            cache.stop_request(str(k))
            return []
        if out == 0:
            cache.start_request(str(k), row["prompt"])
            seen[k] = list(row["prompt"])
            return []
        cache.add_active_response(str(k), new)
        seen[k] += new
        draft = cache.speculate(str(k), seen[k][-SUFFIX_DEPTH:], max_spec_tokens=SUFFIX_DEPTH,
                                max_spec_factor=SUFFIX_FACTOR, min_token_prob=SUFFIX_MIN_PROB)
        return list(draft.token_ids)

    return propose, lambda computed, emitted: a + b * computed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("a_ms", type=float)
    parser.add_argument("b_ms", type=float)
    parser.add_argument("sets", nargs="*", default=SETS)
    args = parser.parse_args()
    try:
        import arctic_inference  # noqa: F401 - before the first set, not after its specdec half
    except ImportError:
        parser.error("needs arctic-inference (SuffixDecoding): bash scripts/install-vllm.sh")
    missing = [name for name in args.sets if not (OUTPUTS / f"ar-{args.model}-{name}.json.gz").is_file()]
    if missing:
        parser.error(f"no recorded ar outputs for {args.model} on {', '.join(missing)} in {OUTPUTS}")
    if not (args.a_ms > 0 and args.b_ms >= 0):
        parser.error("A_MS must be > 0 and B_MS >= 0")
    a, b = args.a_ms / 1e3, args.b_ms / 1e3
    print("| set | specdec's proposer tok/s (acc. len, sent) | SuffixDecoding tok/s (acc. len, sent) | ratio |")
    print("|---|---|---|---|")
    ratios = []
    for name in args.sets:
        data = load_outputs(OUTPUTS / f"ar-{args.model}-{name}.json.gz")
        stop = set(data["stop_ids"])
        ours = replay_set(data["rows"], stop, *specdec(data["vocab_size"], a, b))
        theirs = replay_set(data["rows"], stop, *suffix(a, b))
        ratios.append(ours[0] / theirs[0])
        print(f"| {name} | {ours[0]:.1f} ({ours[1]:.2f}, {ours[2]:.2f}) | {theirs[0]:.1f} ({theirs[1]:.2f}, "
              f"{theirs[2]:.2f}) | {ratios[-1]:.3f} |", flush=True)
    print(f"\ngeometric mean of the ratios: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")


if __name__ == "__main__":
    main()
