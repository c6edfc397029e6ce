"""PLD: the lookup equals transformers' PromptLookupCandidateGenerator on random sequences."""

from __future__ import annotations

import random

import torch

from specdec_cli.drafting.prompt_lookup import lookup
from specdec_cli.methods.pld import PromptLookup


def transformers_candidates(tokens: list[int], max_ngram: int, num_pred: int, eos: int | None = None) -> list[int]:
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    gen = PromptLookupCandidateGenerator(eos_token_id=None if eos is None else torch.tensor([eos]),
                                         num_output_tokens=num_pred, max_matching_ngram_size=max_ngram,
                                         max_length=10_000)
    ids = torch.tensor([tokens])
    out, _ = gen.get_candidates(ids)
    return out[0, len(tokens):].tolist()


def test_lookup_matches_transformers():
    rng = random.Random(0)
    for trial in range(200):
        tokens = [rng.randrange(6) for _ in range(rng.randrange(2, 40))]
        for max_ngram, num_pred in [(3, 10), (2, 4), (1, 3)]:
            assert lookup(tokens, max_ngram, num_pred) == transformers_candidates(tokens, max_ngram, num_pred), tokens


def test_lookup_prefers_longest_ngram_and_first_match():
    tokens = [1, 2, 3, 9, 8, 5, 2, 3, 7, 7, 1, 2, 3]
    assert lookup(tokens, 3, 2) == [9, 8]  # "1 2 3" first occurs at 0
    assert lookup([4, 2, 3, 6, 5, 3, 1, 2, 3], 3, 2) == [6, 5]  # falls back to "2 3"
    assert lookup([1, 2, 3], 3, 5) == []


def test_draft_stops_before_a_stop_token():
    drafter = PromptLookup(3, 10, stop_ids={0})
    drafter.start([1], None, None)
    draft = drafter.propose([1, 2, 5, 0, 6, 1, 2], max_tokens=10)
    assert draft.tokens == [5] and draft.parents == [-1]
    assert drafter.propose([1, 2, 5, 0, 6, 1, 2], max_tokens=0).tokens == []


def test_incremental_index_agrees_with_the_scan():
    """The O(new tokens) index gives lookup's answer at every step of a growing sequence, and afresh on a new one."""
    from specdec_cli.drafting.prompt_lookup import FirstOccurrenceIndex as NgramIndex, lookup_match

    rng = random.Random(1)
    for trial in range(30):
        index = NgramIndex(3)
        tokens = [rng.randrange(5) for _ in range(3)]
        for _ in range(60):
            tokens.extend(rng.randrange(5) for _ in range(rng.randrange(1, 4)))
            assert index.lookup(tokens, 4) == lookup_match(tokens, 3, 4)
        other = [rng.randrange(5) for _ in range(20)]
        assert index.lookup(other, 4) == lookup_match(other, 3, 4)


def test_prepared_index_is_adopted_by_the_list_that_extends_the_prompt():
    from specdec_cli.drafting.prompt_lookup import FirstOccurrenceIndex as NgramIndex, lookup_match

    prompt = [1, 2, 3, 4, 1, 2]
    index = NgramIndex(3)
    index.prepare(prompt)
    tokens = list(prompt)
    assert index.lookup(tokens, 3) == lookup_match(tokens, 3, 3) and index.indexed == len(prompt)
    tokens += [3, 9, 1, 2, 3]
    assert index.lookup(tokens, 3) == lookup_match(tokens, 3, 3)
    index.prepare(prompt)
    other = [5, 5, 5, 5]
    assert index.lookup(other, 3) == lookup_match(other, 3, 3)
