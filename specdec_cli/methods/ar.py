"""``ar``: autoregressive decoding -- the drafter that proposes nothing, so each step is one target forward."""

from ..engine.loop import Drafter


def build(ctx) -> Drafter:
    return Drafter()
