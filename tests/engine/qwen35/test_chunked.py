"""The chunked recurrence of the fixed prefixes (spinf/engine/qwen35/chunked.py): its fp32 reference against the
token-by-token rule, the pieces and calls, and the segment table's place for the chunked segments."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from spinf.engine.kernels.chunked import PINNED_KERNELS
from spinf.engine.kernels.gdn import segment_table
from spinf.engine.layout import build_pass
from spinf.engine.qwen35 import chunked
from spinf.engine.qwen35.chunked import plan_calls, reference_chunked
from spinf.engine.qwen35.gdn import delta_rule, delta_step
from spinf.engine.qwen35.plan import pass_plan
from spinf.engine.trie import Job, add_prompt


def inputs(n: int, heads: int = 3, dk: int = 16, dv: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(n, heads, dk, generator=gen), dim=-1) * dk**-0.5
    k = F.normalize(torch.randn(n, heads, dk, generator=gen), dim=-1)
    v = torch.randn(n, heads, dv, generator=gen)
    g = -torch.rand(n, heads, generator=gen) * 0.5  # decays from 0.61 to 1
    beta = torch.rand(n, heads, generator=gen)
    return q, k, v, g, beta


def token_by_token(q, k, v, g, beta, state):
    out = torch.empty_like(v)
    for t in range(q.shape[0]):
        state, out[t] = delta_step(state, q[t], k[t], v[t], torch.exp(g[t]), beta[t])
    return out, state


@pytest.mark.parametrize("lengths", [(1,), (63,), (64,), (65, 5), (200, 64, 130)], ids=str)
def test_the_reference_is_the_token_by_token_rule_regrouped(lengths):
    total = sum(lengths)
    q, k, v, g, beta = inputs(total)
    initial = torch.randn(len(lengths), 3, 16, 8, generator=torch.Generator().manual_seed(1))
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int64)
    out, finals = reference_chunked(q, k, v, g, beta, initial, cu)
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        expected, state = token_by_token(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], initial[n])
        assert (out[a:b] - expected).abs().max().item() <= 1e-5 * expected.abs().max().item()
        assert (finals[n] - state).abs().max().item() <= 1e-5 * state.abs().max().item()


def test_long_prefixes_run_in_pieces_round_by_round_within_the_call_limit(monkeypatch):
    monkeypatch.setattr(chunked, "PIECE_TOKENS", 100)
    segments = ((0, 250, -1), (250, 260, 0), (260, 330, -1), (330, 340, 2), (340, 370, -1))
    calls = plan_calls(segments, frozenset({0, 2, 4}), torch.device("cpu"))
    assert [call.pieces for call in calls] == [((0, 0),), ((2, 0), (4, 0)), ((0, 1),), ((0, 2),)]
    assert [call.cu_host.tolist() for call in calls] == [[0, 100], [0, 70, 100], [0, 100], [0, 50]]
    # a call of one range of rows slices the pass's rows; pieces with rows between them gather
    assert [call.span for call in calls] == [(0, 100), None, (100, 200), (200, 250)]
    assert calls[1].rows.tolist() == list(range(260, 330)) + list(range(340, 370))
    assert calls[3].rows.tolist() == list(range(200, 250))  # cut at multiples of 100 from the BOS


def test_a_call_over_one_range_of_rows_gives_the_gathered_calls_bits():
    """`run_chunked` slices a contiguous call's rows instead of gathering them: the same outputs and states."""
    segments = ((0, 5, -1), (5, 95, -1), (95, 99, 1))
    q, k, v, g, beta = inputs(99)
    results = []
    for contiguous in (True, False):
        calls = plan_calls(segments, frozenset({1}), torch.device("cpu"))
        assert [call.span for call in calls] == [(5, 95)]
        if not contiguous:
            calls = tuple(attrs.evolve(call, span=None) for call in calls)
        out = torch.zeros_like(v)
        results.append((out, chunked.run_chunked(calls, q, k, v, g, beta, out)))
    assert torch.equal(results[0][0], results[1][0]) and results[0][0][5:95].abs().min() > 0
    assert results[0][0][:5].abs().sum() == results[0][0][95:].abs().sum() == 0  # no other row written
    assert results[0][1].keys() == results[1][1].keys() == {1}
    assert torch.equal(results[0][1][1], results[1][1][1])


def test_the_table_puts_the_chunked_segments_first_and_launches_level_zero_after_them():
    # two jobs: a chunked prefix with two branches, a short prefix run token by token, a chunked prefix alone
    segments = ((0, 80, -1), (80, 83, 0), (83, 85, 0), (85, 90, -1), (90, 92, 3), (92, 200, -1))
    kept = frozenset({0, 3})
    table, levels, slots = segment_table(segments, kept, (), frozenset({0, 5}))
    assert table[:2, :2].tolist() == [[0, 80], [92, 200]] and levels[0] == 2
    assert table[levels[0] : levels[1], :2].tolist() == [[85, 90]]  # level 0's launch: the token-by-token one
    slot_of = {(int(r[0]), int(r[1])): int(r[3]) for r in table}
    source_of = {(int(r[0]), int(r[1])): int(r[2]) for r in table}
    assert source_of[(80, 83)] == source_of[(83, 85)] == slot_of[(0, 80)] >= 0
    assert source_of[(90, 92)] == slot_of[(85, 90)] != slot_of[(0, 80)]
    assert slot_of[(92, 200)] == -1 and slots == 2
    with pytest.raises(ValueError, match="chunked segment"):
        segment_table(segments, kept, (), frozenset({1}))


def by_token(token_ids: list[int], heads: int = 3, dk: int = 16, dv: int = 8):
    """Delta-rule inputs of a stream, each row a function of its token id alone (equal paths, equal inputs)."""
    ids = torch.tensor(token_ids)
    return tuple(t[ids] for t in inputs(4096, heads, dk, dv, seed=6))


def path_rows(layout, job: int, read: tuple[int, int]) -> list[int]:
    """The stream rows of the path that ends at ``read`` of job ``job``: its prefix's, then its branch's."""
    start, prefix_len, _ = layout.spans[job]
    row = layout.read_rows[layout.read_index[(job, *read)][0]]
    return list(range(start, start + prefix_len)) + dict(zip(layout.branch_rows, layout.paths, strict=True))[row]


def test_a_paths_recurrence_keeps_its_bits_when_a_cut_moves_the_prefix_end_but_not_its_fixed_rows():
    """A join cut moves the content's tail from the prefix into the branches (`spinf.engine.compiler._join`); the
    fixed rows end before any cut, so the chunked part and every token after it run the same computation."""
    content = tuple(torch.randint(3, 4096, (200,), generator=torch.Generator().manual_seed(2)).tolist())
    question = (11, 12, 13)
    whole = Job(content, fixed=150)
    read_whole = add_prompt(whole, question, [(5,)])[0][0]
    cut = Job(content[:180], fixed=150)
    read_cut = add_prompt(cut, content[180:] + question, [(5,)])[0][0]
    add_prompt(cut, content[180:185] + (14,), [(5,)])  # another query's branch forks inside the tail
    other = Job(tuple(range(3, 90)), fixed=87)
    add_prompt(other, (7,), [(5,)])
    seen = []
    for jobs, job, read in (([whole], 0, read_whole), ([cut], 0, read_cut), ([other, cut], 1, read_cut)):
        layout = build_pass(jobs)
        plan = pass_plan(layout, 4)
        assert plan.chunked  # the fixed rows ran chunked
        rows = path_rows(layout, job, read)
        assert [layout.token_ids[r] for r in rows] == list(content + question)
        seen.append(delta_rule(*by_token(layout.token_ids), plan)[rows])
    assert torch.equal(seen[0], seen[1]) and torch.equal(seen[0], seen[2])


def test_a_seed_that_names_a_captured_place_needs_the_captured_buffer():
    from spinf.engine.kernels.gdn import TABLE_COLUMNS, recurrent_delta_rule

    q, k, v, g, beta = inputs(4)
    table = torch.tensor([[0, 4, -1, 0, 0, 0]], dtype=torch.int32).reshape(-1, TABLE_COLUMNS)
    seed = (0, 0, torch.zeros(3, 16, 8))
    with pytest.raises(ValueError, match="captured place"):
        recurrent_delta_rule(q, k, v, torch.exp(g), beta, table, (1, 1), 1, seeds=[seed])


PIN_CHECK = """
import json, sys
import spinf.engine.kernels.chunked as chunked
if sys.argv[1] == "first":
    import fla.ops.gated_delta_rule  # imported before the engine sets fla's settings
out = {}
for pins in ("sm90", "portable"):  # fla reads its config folder per call, its mode once
    chunked.config_dir = lambda: chunked.CONFIGS / pins  # no GPU here to ask its capability
    fn, why = chunked._load()
    out[pins] = {"loaded": fn is not None, "why": why, "kernels": {}}
    if fn is None:
        continue
    from triton.runtime.autotuner import Autotuner
    from fla.ops.common import chunk_delta_h, chunk_o
    from fla.ops.gated_delta_rule import chunk_fwd, wy_fast
    from fla.ops.utils import cache, cumsum
    modules = [cumsum, chunk_fwd, wy_fast, chunk_delta_h, chunk_o]
    for name in chunked.PINNED_KERNELS:
        tuner = next(getattr(m, name) for m in modules if hasattr(m, name))
        while not isinstance(tuner, Autotuner):
            tuner = tuner.fn
        out[pins]["kernels"][name] = {
            "tuner": type(tuner).__name__,
            "pinned": cache.load_cached_config(name),
            "file": json.loads((chunked.config_dir() / f"{name}.json").read_text())["default_config"],
        }
print(json.dumps(out))
"""


def test_fla_takes_the_pinned_configurations_and_refuses_when_imported_first():
    """In fresh interpreters (fla reads its settings once, at import): the engine's load sets them, every pinned
    kernel of both sets is one of fla's config-cache autotuners and fla reads its pin back from the engine's file;
    with fla imported first, the engine refuses and says why (the GPU tests run the kernels)."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("fla")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLA_")}
    ran = [
        subprocess.run([sys.executable, "-c", PIN_CHECK, order], capture_output=True, text=True, env=env, timeout=300)
        for order in ("engine", "first")
    ]
    for done in ran:
        assert done.returncode == 0, done.stderr[-2000:]
    loaded, refused = (json.loads(done.stdout.strip().splitlines()[-1]) for done in ran)
    for pins in ("sm90", "portable"):
        assert loaded[pins]["loaded"] and loaded[pins]["why"].endswith(f"pinned in {pins}"), loaded[pins]
        assert set(loaded[pins]["kernels"]) == set(PINNED_KERNELS)
        for name, kernel in loaded[pins]["kernels"].items():
            assert kernel["tuner"] == "CachedAutotuner" and kernel["pinned"] == kernel["file"], (pins, name)
        assert not refused[pins]["loaded"] and "imported before" in refused[pins]["why"]
