"""Generation (spinf.engine.extraction.sampling) against a plain NumPy reference of A.13 on synthetic models."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from spinf.engine.extraction.sampling import GenerateSlot, Generation, generate_step, initial_generate, stack_generate
from spinf.engine.extraction.search import BEAM
from tests.engine.extraction.test_search import FORBIDDEN, STOP, SyntheticLM, TableLM, V, logsumexp, mask


def slot(max_tokens=6, **params) -> GenerateSlot:
    return GenerateSlot(max_tokens=max_tokens, stop=mask(STOP), forbidden=mask(FORBIDDEN), **params)


def reference_generate(lm, slot: GenerateSlot, sequence: int) -> tuple[tuple[int, ...], str]:
    """A.13 read plainly, drawing with ``np.random.default_rng([seed, b]).choice`` as the reference engine does."""
    rng = np.random.default_rng([slot.seed, sequence])
    tokens: tuple[int, ...] = ()
    while len(tokens) < slot.max_tokens:
        lp = lm.logprobs(tokens).tolist()
        end = logsumexp([lp[v] for v in STOP])
        ranked = sorted(((lp[v], v) for v in range(V) if v not in FORBIDDEN), key=lambda x: (-x[0], x[1]))
        if slot.temperature == 0:
            if end >= ranked[0][0]:
                return tokens, "stop"
            tokens += (ranked[0][1],)
            continue
        events = [(end, None)] + ranked[: slot.num_candidates]
        scaled = [x / slot.temperature for x, _ in events]
        weights = [math.exp(x - max(scaled)) for x in scaled]
        p = [w / sum(weights) for w in weights]
        nucleus, mass = [], 0.0
        for i in sorted(range(len(p)), key=lambda i: -p[i]):  # stable: the end event first on ties
            if mass >= slot.top_p:
                break
            nucleus.append(i)
            mass += p[i]
        q = np.array([p[i] for i in nucleus])
        chosen = events[nucleus[rng.choice(len(q), p=q / q.sum())]][1]
        if chosen is None:
            return tokens, "stop"
        tokens += (chosen,)
    return tokens, "length"


def run_generate(lms, slots):
    """Drive Generation as a decoder does: each live row is fed its own token."""
    generation = Generation(stack_generate(slots))
    prefixes = [[()] * BEAM for _ in slots]
    for _ in range(generation.num_steps):
        lp = torch.stack([torch.stack([lm.logprobs(p) for p in rows]) for lm, rows in zip(lms, prefixes, strict=True)])
        alive_before = generation.alive.tolist()
        token = generation.step(lp).tolist()
        prefixes = [
            [p + (tok,) if live and tok else p for p, tok, live in zip(rows, t_s, a_s, strict=True)]
            for rows, t_s, a_s in zip(prefixes, token, alive_before, strict=True)
        ]
    assert not generation.alive.any()
    return generation.sequences()


PARAMS = [
    {},
    {"temperature": 0.0, "n": 2},
    {"temperature": 1.0, "n": 6, "seed": 5},
    {"temperature": 0.7, "top_p": 0.8, "n": 3, "seed": 11},
    {"temperature": 1.5, "top_k": 3, "n": 4, "seed": 2**31 - 1},
    {"temperature": 1.0, "top_p": 0.3, "top_k": 1, "n": 2},
]


@pytest.mark.parametrize("seed", range(12))
def test_equals_reference_draw_for_draw(seed):
    """Greedy and sampled slots together, different max_tokens: every sequence equals the NumPy reference."""
    slots = [slot(max_tokens=2 + (i + seed) % 7, **params) for i, params in enumerate(PARAMS)]
    lms = [SyntheticLM(100 * seed + i, scale=1.5) for i in range(len(slots))]
    found = run_generate(lms, slots)
    for lm, s, got in zip(lms, slots, found, strict=True):
        assert got == [reference_generate(lm, s, b) for b in range(s.n)]


def test_finish_reasons_and_lengths():
    reasons = [reason for lm_seed in range(30) for _, reason in run_generate([SyntheticLM(lm_seed)], [slot(3)])[0]]
    assert {"stop", "length"} == set(reasons)
    (sequences,) = run_generate([SyntheticLM(1)], [slot(3, temperature=1.0, n=6)])
    assert all((len(t) == 3) == (r == "length") and len(t) <= 3 for t, r in sequences)


def test_greedy_ties():
    """Greedy is argmax with ties to the lower token id, and P(end) equal to the best token's stops."""
    lm = TableLM({(): {4: 0.3, 3: 0.3, 0: 0.2, 5: 0.2}, (3,): {0: 0.4, 2: 0.4, 6: 0.2}})
    assert run_generate([lm], [slot(4)]) == [[((3,), "stop")]]


def test_seeded_sampling_is_reproducible_and_batch_independent():
    """A sequence's tokens depend on its seed and index only: alone, in other chunks, with other n."""
    lm, target = SyntheticLM(3, scale=1.0), slot(8, temperature=1.0, n=3, seed=42)
    alone = run_generate([lm], [target])[0]
    assert run_generate([lm], [target])[0] == alone
    assert len(set(alone)) > 1  # the sequences draw from different streams
    others = [(SyntheticLM(50 + i), slot(3 + i, temperature=0.5 * i, n=1 + i)) for i in range(4)]
    for position in range(len(others) + 1):
        mix = others[:position] + [(lm, target)] + others[position:]
        assert run_generate([m for m, _ in mix], [s for _, s in mix])[position] == alone
    wider = run_generate([lm], [slot(8, temperature=1.0, n=6, seed=42)])[0]
    assert wider[:3] == alone
    assert run_generate([lm], [slot(8, temperature=1.0, n=3, seed=43)])[0] != alone


def test_top_k_one_and_small_top_p_are_greedy_without_end():
    """top_k 1 leaves the end event and the best token; a tiny top_p keeps only the more probable of them."""
    lm = SyntheticLM(9, scale=1.0)
    nucleus_of_one = slot(5, temperature=1.0, top_k=1, top_p=1e-9, n=6)
    (found,) = run_generate([lm], [nucleus_of_one])
    assert found == [run_generate([lm], [slot(5)])[0][0]] * 6


def test_step_has_no_host_sync():
    """The step compiles as one graph (fullgraph: a .item(), .tolist() or a branch on a value would break it)."""
    slots = stack_generate([slot(3), slot(4, temperature=1.0, n=6)])
    lp = torch.stack([SyntheticLM(i).logprobs(()).expand(BEAM, V) for i in range(2)])
    compiled = torch.compile(generate_step, fullgraph=True, backend="eager")
    buf = eager = initial_generate(slots)
    for _ in range(3):
        buf, token = compiled(slots, buf, lp)
        eager, token_e = generate_step(slots, eager, lp)
        assert torch.equal(token, token_e) and torch.equal(buf.tokens, eager.tokens)


def test_rejects_bad_parameters():
    with pytest.raises(ValueError, match=r"^n must be 1 to 6, got 7$"):
        slot(n=7)
    with pytest.raises(ValueError, match=r"^temperature must be >= 0 and top_p in \(0, 1\]$"):
        slot(top_p=0.0)
