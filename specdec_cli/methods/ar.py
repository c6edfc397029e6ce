"""``ar``: autoregressive decoding -- the drafter that proposes nothing, so each step is one target forward."""

from ..decoding import Drafter


def build(ctx) -> Drafter:
    return Drafter()
