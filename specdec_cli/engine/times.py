"""What a target forward costs a batch's rows, as the batch loop prices it: the measured table, corrected online.

``T(rows, width)`` is the time of one forward over ``rows`` rows of ``width`` query positions each. The measured
table (:mod:`specdec_cli.runtime.batch_profile`, else the one-sequence profile of :mod:`specdec_cli.runtime.profile`
at ``rows * width`` tokens) was timed once, on a quiet machine, after 128 cached tokens; a batch differs (ragged and
longer contexts, a machine busy elsewhere). :class:`LearnedTimes` scales the table per width by what this run's
forwards actually took. Greedy runs only: sampled ones never read the clock, so a seed reproduces its output.

    times = LearnedTimes(table, learn=greedy)    # T(rows, width), learnt
    share = BatchShare(times, rows)              # t(n) as a row's budget sees it: T(rows, n) / rows
    t0 = clock(); forward; times.observe(rows, width, clock() - t0)     # clock = runtime.forward.wall_clock(target)
"""

from __future__ import annotations

LEARNED_WIDTHS = 9  # forward-time corrections per query width up to 9; wider steps are rare and share the last one


class LearnedTimes:
    """``T(rows, width)``: the measured table, corrected by what this run's forwards actually took (greedy runs
    only: sampled ones never read the clock). One factor per width, ``actual / table`` averaged over recent steps,
    absorbs what the table missed (longer contexts than it was measured at, a busy machine); a width not seen yet
    takes the one-position factor."""

    EMA = 0.2  # weight of the newest forward: about five steps to follow a change of the machine's load

    def __init__(self, table, learn: bool):
        self.table, self.learn = table, learn
        self.factor: dict[int, float] = {}

    def __call__(self, rows: int, width: int) -> float:
        return self.table(rows, width) * self.factor.get(min(width, LEARNED_WIDTHS), self.factor.get(1, 1.0))

    def observe(self, rows: int, width: int, seconds: float) -> None:
        if self.learn and seconds > 0:
            key, ratio = min(width, LEARNED_WIDTHS), seconds / self.table(rows, width)
            old = self.factor.get(key)
            self.factor[key] = ratio if old is None else (1 - self.EMA) * old + self.EMA * ratio


class BatchShare:
    """A row's price of a forward of ``n`` tokens per row: ``T(rows, n) / rows`` (``rows``: the live rows)."""

    def __init__(self, times, rows: int = 1):
        self.times, self.rows = times, rows

    def __call__(self, n: int) -> float:
        return self.times(self.rows, n) / self.rows


def flat_times(profile):
    """``T(rows, width)`` from a one-sequence profile, ``t(rows * width)`` (when no batched one is measured)."""
    return lambda rows, width: profile(rows * width)

