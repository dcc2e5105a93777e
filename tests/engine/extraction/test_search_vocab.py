"""The beam on the tiny model's real tokenizer tables (spinf.engine.extraction.vocab): its number answers are numbers
by the grammar, its log-probs are read along the path with the grammar's own rules, its text answers avoid the
masked tokens."""

import math

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from spinf.engine.extraction.grammar import START, complete, feed
from spinf.engine.extraction.search import BEAM, BeamSearch, SearchSlot, stack_slots
from spinf.engine.extraction.vocab import vocabulary
from spinf.engine.gemma4.tiny import ensure_tiny_snapshot


@pytest.fixture(scope="module")
def tiny_vocab(tiny_cache):
    return vocabulary(Tokenizer.from_file(str(ensure_tiny_snapshot(tiny_cache) / "tokenizer.json")), [1])


class BiasedLM:
    """Normal logits from (seed, prefix) plus a bias on the number candidates, so that numbers get long."""

    def __init__(self, seed: int, bias: torch.Tensor) -> None:
        self.seed, self.bias = seed, bias
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}

    def logprobs(self, prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in self._memo:
            rng = np.random.default_rng([self.seed, len(prefix), *prefix])
            logits = torch.tensor(rng.standard_normal(self.bias.shape[0]) * 2.0, dtype=torch.float32) + self.bias
            self._memo[prefix] = torch.log_softmax(logits, dim=-1)
        return self._memo[prefix]


def end_lp(lp: list[float], texts, state, currency: bool) -> float:
    """log(1 − Σ valid P) by the grammar itself: every token that does not extend the number ends it."""
    ending = [x for x, text in zip(lp, texts, strict=True) if text == "" or feed(state, text, currency) is None]
    top = max(ending)
    return top + math.log(sum(math.exp(x - top) for x in ending))


@pytest.mark.parametrize("seed", range(3))
def test_number_answers_on_the_tiny_tokenizer(tiny_vocab, seed):
    table, texts = tiny_vocab.number_table, tiny_vocab.texts
    bias = torch.zeros(tiny_vocab.num_logits)
    bias[table.candidates] = 8.0
    stop, forbidden = tiny_vocab.stop_mask('"'), tiny_vocab.forbidden_mask('"')
    slots = [
        SearchSlot(max_tokens=6, start=table.start(False)),
        SearchSlot(max_tokens=4, start=table.start(True)),
        SearchSlot(max_tokens=5, stop=stop, forbidden=forbidden),
    ]
    lms = [BiasedLM(10 * seed + i, bias) for i in range(len(slots))]
    search = BeamSearch(stack_slots(slots, tiny_vocab.num_logits, table))
    prefixes = [[()] * BEAM for _ in slots]
    for _ in range(search.num_steps):
        lp = torch.stack([torch.stack([lm.logprobs(p) for p in rows]) for lm, rows in zip(lms, prefixes, strict=True)])
        parent, token = (x.tolist() for x in search.step(lp))
        prefixes = [
            [rows[p] + (t,) for p, t in zip(p_s, t_s, strict=True)]
            for rows, p_s, t_s in zip(prefixes, parent, token, strict=True)
        ]
    numbers, money, text = search.answers()
    for answers, lm, currency in ((numbers, lms[0], False), (money, lms[1], True)):
        assert answers
        for tokens, lp in answers:
            state, score = START, 0.0
            for i, tok in enumerate(tokens):
                score += lm.logprobs(tokens[:i])[tok].item()
                state = feed(state, texts[tok], currency)
                assert state is not None, [texts[t] for t in tokens]
            assert complete(state)
            assert lp == pytest.approx(score + end_lp(lm.logprobs(tokens).tolist(), texts, state, currency), abs=1e-4)
    assert any(len(tokens) > 1 for tokens, _ in numbers)
    assert text and all(not forbidden[tok] for tokens, _ in text for tok in tokens)
