"""The vectorised beam (spinf.engine.extraction.search) against a plain reference of A.12.3 and a brute-force oracle.

The language models are synthetic: over a vocabulary of 10 tokens, the log-probs after a prefix are a fixed function
of (seed, prefix). Token 0 is the end-of-sequence token, 1 a special token; for number slots the vocabulary reads as
the hand-made grammar below.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from spinf.engine.extraction.search import (
    BEAM,
    MIN_P,
    REL_P,
    TOPK,
    BeamSearch,
    NumberGrammar,
    SearchSlot,
    initial_buffers,
    search_step,
    stack_slots,
    top,
)

V = 10
NEG_INF = float("-inf")
STOP = frozenset({0})
FORBIDDEN = frozenset({0, 1})

# The number grammar of the tests: " " 2, "1" 3, "2" 4, "." 5, "%" 6, "-" 7, "12" 9 (8 is not a number token).
CANDIDATES = [2, 3, 4, 5, 6, 7, 9]
START, SPACED, SIGN, INT, DOT, FRAC, POST = range(7)
_DIGITS = {3: INT, 4: INT, 9: INT}
_MOVES = {
    START: {2: SPACED, 7: SIGN, **_DIGITS},
    SPACED: {7: SIGN, **_DIGITS},
    SIGN: dict(_DIGITS),
    INT: {5: DOT, 6: POST, **_DIGITS},
    DOT: {3: FRAC, 4: FRAC, 9: FRAC},
    FRAC: {6: POST, 3: FRAC, 4: FRAC, 9: FRAC},
    POST: {},
}
NEXT_STATE = [[_MOVES[q].get(tok, -1) for tok in CANDIDATES] for q in range(7)]
COMPLETE = [q in (INT, DOT, FRAC, POST) for q in range(7)]
GRAMMAR = NumberGrammar(
    candidates=torch.tensor(CANDIDATES),
    next_state=torch.tensor(NEXT_STATE),
    complete=torch.tensor(COMPLETE),
)


class SyntheticLM:
    """Log-probs after a prefix: log-softmax of normal logits drawn from (seed, prefix), times ``scale``."""

    def __init__(self, seed: int, scale: float = 3.0, vocab_size: int = V) -> None:
        self.seed, self.scale, self.vocab_size = seed, scale, vocab_size
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}

    def logprobs(self, prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in self._memo:
            rng = np.random.default_rng([self.seed, len(prefix), *prefix])
            logits = torch.tensor(rng.standard_normal(self.vocab_size) * self.scale, dtype=torch.float32)
            self._memo[prefix] = torch.log_softmax(logits, dim=-1)
        return self._memo[prefix]


def mask(tokens) -> torch.Tensor:
    out = torch.zeros(V, dtype=torch.bool)
    out[list(tokens)] = True
    return out


def text_slot(max_tokens: int, forbidden=FORBIDDEN) -> SearchSlot:
    return SearchSlot(max_tokens=max_tokens, stop=mask(STOP), forbidden=mask(forbidden))


def number_slot(max_tokens: int) -> SearchSlot:
    return SearchSlot(max_tokens=max_tokens, start=START)


def logsumexp(values: list[float]) -> float:
    top_value = max(values)
    if top_value == NEG_INF:
        return NEG_INF
    return top_value + math.log(sum(math.exp(v - top_value) for v in values))


def floor_of(best: float, min_p: float, rel_p: float) -> float:
    p = max(min_p, rel_p * math.exp(best)) if best > NEG_INF else min_p
    return math.log(p) if p > 0 else NEG_INF


def row_rules(lp: list[float], tokens: tuple[int, ...], state: int, slot: SearchSlot):
    """A.12.3 for one beam: the end log-prob (None: no answer) and the proposals (lp, token, state), best first."""
    if slot.is_number:
        valid = [
            (lp[tok], c, tok, NEXT_STATE[state][c]) for c, tok in enumerate(CANDIDATES) if NEXT_STATE[state][c] >= 0
        ]
        extending = {v[2] for v in valid}
        ends = logsumexp([lp[tok] for tok in range(V) if tok not in extending]) if valid else 0.0
        end = ends if COMPLETE[state] else None  # P(end) = 1 − Σ valid P, summed over the tokens that end it
        valid.sort(key=lambda v: (-v[0], v[1]))
        return end, [(v[0], v[2], v[3]) for v in valid]
    end = logsumexp([lp[v] for v in range(V) if slot.stop[v]]) if tokens else None
    props = sorted(((lp[v], v) for v in range(V) if not slot.forbidden[v]), key=lambda x: (-x[0], x[1]))
    return end, [(v, tok, 0) for v, tok in props]


def reference_search(lm, slot: SearchSlot, *, min_p=MIN_P, rel_p=REL_P, beam=BEAM, topk=TOPK, widths=None):
    """A.12.3 read plainly: per step, record, propose the top ``topk`` of each beam, prune, keep the best ``beam``.

    Ties: larger log-prob, then lower row, then the proposal's rank in its row (which breaks ties by lower token
    for text and lower candidate column for numbers). With ``beam = topk = None`` nothing limits the width: every
    path the floor keeps is followed (the brute-force oracle); ``widths`` collects how many proposals survive the
    floor at each step.
    """
    beams = [((), 0.0, slot.start or 0)]
    answers, best = [], NEG_INF
    for t in range(slot.max_tokens + 1):
        gathered = []
        for row, (tokens, score, state) in enumerate(beams):
            end, props = row_rules(lm.logprobs(tokens).tolist(), tokens, state, slot)
            if end is not None and score + end > NEG_INF:
                answers.append((tokens, score + end))
            for rank, (lp, tok, nxt) in enumerate(props[:topk]):
                gathered.append((score + lp, row, rank, tokens + (tok,), nxt))
        best = max([best] + [lp for _, lp in answers])
        if t == slot.max_tokens:
            break
        floor = floor_of(best, min_p, rel_p)
        kept = sorted((g for g in gathered if g[0] >= floor and g[0] > NEG_INF), key=lambda g: (-g[0], g[1], g[2]))
        beams = [(g[3], g[0], g[4]) for g in kept[:beam]]
        if widths is not None:
            widths.append(len(kept))
        if not beams:
            break
    return answers


def all_paths(lm, slot: SearchSlot) -> dict[tuple[int, ...], float]:
    """Every answer path up to max_tokens, enumerated depth first, with its exact log-prob."""
    found = {}

    def walk(tokens, score, state):
        end, props = row_rules(lm.logprobs(tokens).tolist(), tokens, state, slot)
        if end is not None and score + end > NEG_INF:
            found[tokens] = score + end
        if len(tokens) < slot.max_tokens:
            for lp, tok, nxt in props:
                walk(tokens + (tok,), score + lp, nxt)

    walk((), 0.0, slot.start or 0)
    return found


def path_lp(lm, slot: SearchSlot, answer: tuple[int, ...]) -> float:
    """The exact log-prob of one answer path, read along it."""
    score, state = 0.0, slot.start or 0
    for i, tok in enumerate(answer):
        _, props = row_rules(lm.logprobs(answer[:i]).tolist(), answer[:i], state, slot)
        lp, _, state = next(p for p in props if p[1] == tok)
        score += lp
    end, _ = row_rules(lm.logprobs(answer).tolist(), answer, state, slot)
    return score + end


def run_search(lms, slots, *, min_p=MIN_P, rel_p=REL_P):
    """Drive BeamSearch the way a decoder does: per step the log-probs of every row's prefix, rows follow parents."""
    search = BeamSearch(stack_slots(slots, V, GRAMMAR, min_p=min_p, rel_p=rel_p))
    prefixes = [[()] * BEAM for _ in slots]
    for _ in range(search.num_steps):
        lp = torch.stack([torch.stack([lm.logprobs(p) for p in rows]) for lm, rows in zip(lms, prefixes, strict=True)])
        parent, token = (x.tolist() for x in search.step(lp))
        alive = search.alive.tolist()
        prefixes = [
            [rows[par] + (tok,) if live else () for par, tok, live in zip(p_s, t_s, a_s, strict=True)]
            for rows, p_s, t_s, a_s in zip(prefixes, parent, token, alive, strict=True)
        ]
        buf = search.buffers
        for s, rows in enumerate(prefixes):  # the token buffers hold every live beam's tokens
            for j, prefix in enumerate(rows):
                if alive[s][j]:
                    assert tuple(buf.tokens[s, j, : len(prefix)].tolist()) == prefix
    assert not search.alive.any()
    return search.answers()


def assert_same(found, expected):
    assert [a for a, _ in found] == [a for a, _ in expected]
    for (_, lp), (_, want) in zip(found, expected, strict=True):
        assert lp == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("seed", range(40))
def test_vectorised_equals_reference(seed):
    rng = np.random.default_rng(seed)
    kinds, lengths = rng.integers(0, 2, 4).tolist(), rng.integers(1, 9, 4).tolist()
    slots = [text_slot(m) if k else number_slot(m) for k, m in zip(kinds, lengths, strict=True)]
    lms = [SyntheticLM(1000 * seed + i, scale=float(rng.uniform(1.0, 4.0))) for i in range(len(slots))]
    found = run_search(lms, slots)
    for lm, slot, got in zip(lms, slots, found, strict=True):
        want = reference_search(lm, slot)
        assert_same(got, want)
        assert len(set(a for a, _ in got)) == len(got)


def test_reference_widths_bind():
    """The reference tests above exercise the width limits: some step gathers more than BEAM proposals."""
    lm = SyntheticLM(7, scale=1.0)
    assert len(reference_search(lm, text_slot(4))) < len(reference_search(lm, text_slot(4), beam=None, topk=None))


@pytest.mark.parametrize(
    ("slot", "scale"),
    [
        (text_slot(1, forbidden={0, 1, 9}), 1.0),  # 7 continuations, one level: TOPK binds
        (text_slot(1, forbidden={0, 1, 8, 9}), 1.0),  # 6 continuations
        (text_slot(2, forbidden={0, 1, 4, 5, 6, 7, 8, 9}), 2.0),  # 2 continuations, 4 paths on level 2
        (number_slot(1), 1.0),  # 5 valid first tokens, 3 of them complete
    ],
)
def test_no_cut_equals_all_paths(slot, scale):
    """Where nothing can cut (no pruning, at most BEAM paths per level), the beam finds every path, exactly."""
    can_cut = slot.forbidden is not None and V - int(slot.forbidden.sum()) > TOPK
    for seed in range(10):
        lm = SyntheticLM(seed, scale=scale)
        (found,) = run_search([lm], [slot], min_p=0.0, rel_p=0.0)
        oracle = all_paths(lm, slot)
        assert len(found) == (TOPK if can_cut else len(oracle))
        assert {a for a, _ in found} <= set(oracle)
        for answer, lp in found:
            assert lp == pytest.approx(oracle[answer], abs=1e-5)
        if can_cut:  # the rows are the TOPK most probable first tokens, best first
            first = lm.logprobs(()).masked_fill(slot.forbidden, NEG_INF)
            assert [a for a, _ in found] == [(tok,) for tok in first.argsort(descending=True)[:TOPK].tolist()]


def test_number_no_cut_three_tokens():
    """A number slot of 3 tokens through a grammar narrow enough (digits "1" and "." only) to hold every path."""
    lm = SyntheticLM(3, scale=1.0)
    narrow = torch.tensor(NEXT_STATE)
    narrow[:, [CANDIDATES.index(t) for t in (2, 4, 6, 7, 9)]] = -1
    grammar = NumberGrammar(torch.tensor(CANDIDATES), narrow, torch.tensor(COMPLETE))
    search = BeamSearch(stack_slots([number_slot(3)], V, grammar, min_p=0.0, rel_p=0.0))
    prefixes = [()] * BEAM
    for _ in range(search.num_steps):
        parent, token = (x[0].tolist() for x in search.step(torch.stack([lm.logprobs(p) for p in prefixes])[None]))
        prefixes = [prefixes[p] + (t,) for p, t in zip(parent, token, strict=True)]
    (found,) = search.answers()
    # "1" "11" "1." "111" "11." "1.1": every path of at most 3 tokens that ends a number
    assert sorted(a for a, _ in found) == [(3,), (3, 3), (3, 3, 3), (3, 3, 5), (3, 5), (3, 5, 3)]
    p1 = lm.logprobs(()).exp()[3].item()
    p11 = lm.logprobs((3,)).exp()
    assert dict(found)[(3,)] == pytest.approx(math.log(p1 * (1 - p11[3].item() - p11[5].item())), abs=1e-5)


@pytest.mark.parametrize("kind", ["text", "number"])
def test_pruned_equals_pruned_oracle(kind):
    """With pruning on and peaked models, the beam equals the oracle that follows every path the floor keeps."""
    compared = 0
    for seed in range(100):
        lm = SyntheticLM(seed, scale=5.0)
        slot = text_slot(6) if kind == "text" else number_slot(6)
        widths = []
        oracle = reference_search(lm, slot, beam=None, topk=None, widths=widths)
        (found,) = run_search([lm], [slot])
        if max(widths) <= BEAM:  # the width limits never bind: only the floor decides
            assert_same(found, oracle)
            compared += 1
        for answer, lp in found:  # pruning only removes answers, never changes one
            assert lp == pytest.approx(path_lp(lm, slot, answer), abs=1e-5)
    assert compared >= 20


class TableLM:
    """Log-probs from a table keyed by prefix; an unknown prefix ends at once."""

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]]) -> None:
        self.table = table

    def logprobs(self, prefix):
        p = torch.full((V,), 1e-12)
        for tok, prob in self.table.get(prefix, {0: 1.0}).items():
            p[tok] = prob
        return torch.log(p / p.sum())


def test_min_p_cuts():
    """A proposal below MIN_P is dropped; one just above it is kept."""
    lm = TableLM({(): {2: 0.9, 3: 0.0025, 4: 0.0015, 0: 0.0960}})
    answers = dict(run_search([lm], [text_slot(3)])[0])
    assert set(answers) == {(2,), (3,)}


def test_rel_p_cuts_after_a_good_answer():
    """After an answer of probability 0.5, proposals below 0.02 × 0.5 = 0.01 are dropped (0.005 is above MIN_P)."""
    lm = TableLM({(): {2: 1.0}, (2,): {0: 0.5, 3: 0.49, 4: 0.005, 5: 0.005}})
    answers = dict(run_search([lm], [text_slot(3)])[0])
    assert set(answers) == {(2,), (2, 3)}
    assert answers[(2,)] == pytest.approx(math.log(0.5), abs=1e-6)
    before = TableLM({(): {3: 0.49, 4: 0.005, 0: 0.505}})  # no answer before the step: only MIN_P applies
    assert set(dict(run_search([before], [text_slot(1)])[0])) == {(3,), (4,)}


def test_ties_lower_token_then_lower_row():
    """Equal log-probs: the lower token id wins within a beam, the lower row across beams; reference agrees."""
    lm = TableLM(
        {
            (): {t: 0.125 for t in range(2, 10)},
            **{(t,): {0: 0.2, **{u: 0.1 for u in range(2, 10)}} for t in range(2, 10)},
        }
    )
    (found,) = run_search([lm], [text_slot(2)])
    assert_same(found, reference_search(lm, text_slot(2)))
    firsts = [a for a, _ in found if len(a) == 1]
    assert firsts == [(2,), (3,), (4,), (5,), (6,), (7,)]
    seconds = [a for a, _ in found if len(a) == 2]
    assert seconds == [(2, 2), (2, 3), (2, 4), (2, 5), (2, 6), (2, 7)]


def test_top_ties_and_negative_zero():
    values = torch.tensor([[-1.0, 0.0, -0.0, -1.0, NEG_INF, 2.0]])
    lp, pos = top(values, 4)
    assert pos.tolist() == [[5, 1, 2, 0]]
    lp, pos = top(values[:, :2], 4)
    assert lp.tolist() == [[0.0, -1.0, NEG_INF, NEG_INF]] and pos.tolist() == [[1, 0, 1, 1]]


def test_per_slot_invariance():
    """A slot's answers are bit-identical whatever shares its chunk (other kinds, other max_tokens, other order)."""
    target_lm, target = SyntheticLM(11, scale=2.0), number_slot(5)
    alone = run_search([target_lm], [target])[0]
    others = [(SyntheticLM(20 + i, scale=1.5), text_slot(3 + 2 * i) if i % 2 else number_slot(8)) for i in range(4)]
    for position in range(len(others) + 1):
        mix = others[:position] + [(target_lm, target)] + others[position:]
        found = run_search([lm for lm, _ in mix], [slot for _, slot in mix])
        assert found[position] == alone


def test_step_has_no_host_sync():
    """The step compiles as one graph (fullgraph: a .item(), .tolist() or a branch on a value would break it)."""
    slots = stack_slots([text_slot(3), number_slot(4)], V, GRAMMAR)
    lms = [SyntheticLM(1), SyntheticLM(2)]
    compiled = torch.compile(search_step, fullgraph=True, backend="eager")
    buf = eager = initial_buffers(slots)
    for _ in range(3):
        lp = torch.stack([lm.logprobs(()).expand(BEAM, V) for lm in lms])
        buf, parent, token = compiled(slots, buf, lp)
        eager, parent_e, token_e = search_step(slots, eager, lp)
        assert torch.equal(parent, parent_e) and torch.equal(token, token_e)
        assert torch.equal(buf.answer_lp, eager.answer_lp)
