"""Entropy of accepted vs rejected draft tokens under vanilla speculative sampling (HSDDW paper, Figure 6).

Self-verify rests on one observation: the draft's entropy ``H(q_draft)`` is higher at tokens the target
rejects than at tokens it accepts. :func:`collect_entropies` runs ``sd`` with a fixed window ``K`` and records,
for every drafted token the target looked at, its entropy and whether it was accepted (the token after the
first rejection in a chain is never judged, so it is counted as ``unverified`` only). :func:`entropy_report`
summarises both groups and the threshold self-verify would learn (the mean entropy of rejected tokens).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ..engine.loop import Draft, Drafter, Outcome, generate
from ..drafting.draft_model import DraftModel, draft_chain
from ..drafting.entropy_window import rejected_index
from ..engine.sampling import SamplingConfig


class EntropyRecorder(Drafter):
    """``sd`` that records ``H(q_draft)`` of each drafted token and the target's verdict on it.

    Drafting goes through :func:`~specdec_cli.drafting.draft_model.draft_chain` with ``tau = inf`` and no budget: the
    same draws as ``sd`` with a full window, plus the entropies (for greedy, of the draft's untempered softmax:
    see ``confidence_entropy``).
    """

    name = "sd-entropy"

    def __init__(self, draft, vocab_size: int, window: int = 5):
        self.dm = DraftModel(draft, vocab_size)
        self.window = window
        self.accepted: list[float] = []
        self.rejected: list[float] = []
        self.unverified = 0

    def use_target_cache(self, cache) -> None:
        self.dm.use_target_cache(cache)

    def start(self, prompt, cfg, generator) -> None:
        super().start(prompt, cfg, generator)
        self.dm.prefill(prompt)
        self.pending: list[float] = []
        self.generation_rejected: list[float] = []  # this generation's rejected entropies: self-verify's tau

    def propose(self, tokens: list[int], max_tokens: int) -> Draft:
        k = min(self.window, max_tokens)
        chain = draft_chain(self.dm, tokens, k, self.cfg, self.generator, entropies=True)
        self.pending = chain.entropies
        return chain.draft()

    def accept(self, tokens: list[int], outcome: Outcome) -> None:
        n = len(outcome.path)
        self.accepted += self.pending[:n]
        i = rejected_index(outcome)
        if i is not None:
            self.rejected.append(self.pending[i])
            self.generation_rejected.append(self.pending[i])
            self.unverified += len(self.pending) - i - 1


@dataclass
class EntropySample:
    accepted: list[float] = field(default_factory=list)
    rejected: list[float] = field(default_factory=list)
    unverified: int = 0
    learned_tau: list[float | None] = field(default_factory=list)  # per prompt: tau self-verify ends with


def collect_entropies(target, draft, prompts: list[list[int]], *, window: int = 5, max_new_tokens: int = 64,
                      sampling: SamplingConfig = SamplingConfig(), seed: int = 0) -> EntropySample:
    """Run ``sd`` (``target``/``draft``: LoadedModel) over tokenised ``prompts``; collect draft-token entropies."""
    recorder = EntropyRecorder(draft, target.vocab_size, window)
    out = EntropySample()
    for ids in prompts:
        generate(target.model, ids, recorder, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                 stop_ids=target.stop_ids)
        rej = recorder.generation_rejected
        out.learned_tau.append(sum(rej) / len(rej) if rej else None)
    out.accepted, out.rejected, out.unverified = recorder.accepted, recorder.rejected, recorder.unverified
    return out


def describe(values: list[float]) -> dict:
    """Count, mean, median and quartiles (None when empty)."""
    if not values:
        return {"count": 0, "mean": None, "median": None, "q1": None, "q3": None, "min": None, "max": None}
    v = sorted(values)
    q1, med, q3 = statistics.quantiles(v, n=4, method="inclusive") if len(v) > 1 else (v[0], v[0], v[0])
    return {"count": len(v), "mean": statistics.fmean(v), "median": med, "q1": q1, "q3": q3, "min": v[0], "max": v[-1]}


def entropy_report(sample: EntropySample) -> dict:
    """Summary of both groups, the learned threshold and how well it separates them."""
    tau = statistics.fmean(sample.rejected) if sample.rejected else None
    report = {
        "accepted": describe(sample.accepted),
        "rejected": describe(sample.rejected),
        "unverified": sample.unverified,
        "learned_tau": tau,  # mean entropy of rejected tokens over all prompts
        "learned_tau_per_prompt": sample.learned_tau,
    }
    if tau is not None:
        # self-verify with this tau would stop right after a token with H > tau
        report["accepted_at_or_below_tau"] = _fraction(sample.accepted, lambda h: h <= tau)
        report["rejected_above_tau"] = _fraction(sample.rejected, lambda h: h > tau)
    return report


def _fraction(values: list[float], pred) -> float | None:
    return sum(1 for v in values if pred(v)) / len(values) if values else None


def plot_histogram(sample: EntropySample, path: str, title: str = "Draft entropy of accepted vs rejected tokens") -> None:
    """Overlaid density histograms of both groups with the learned tau as a vertical line (PNG, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    top = max(sample.accepted + sample.rejected + [1e-3])
    bins = [top * i / 40 for i in range(41)]
    for values, label, color in ((sample.accepted, "accepted", "tab:green"), (sample.rejected, "rejected", "tab:red")):
        if values:
            ax.hist(values, bins=bins, density=True, alpha=0.55, color=color, label=f"{label} (n={len(values)})")
    if sample.rejected:
        tau = statistics.fmean(sample.rejected)
        ax.axvline(tau, color="black", linestyle="--", label=f"learned tau = {tau:.3f}")
    ax.set_xlabel("entropy H(q_draft) [nats]")
    ax.set_ylabel("density")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
