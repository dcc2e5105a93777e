"""The Qwen3.5 GDN's delta rule on the GPU by segment index, and the hybrid stack on CUDA (engine spec B.14.2, C.1).

The Triton kernel (`spinf.engine.kernels.gdn`) against the CPU `delta_rule` on forked passes; a path's outputs bit
for bit whatever shares its pass and wherever its trie forks; the tiny Qwen3.5 on CUDA (the kernel, and the Triton
tree attention) against the CPU and bit for bit per question; the tree-attention kernel at the 27B's attention shape.
The kernel-against-reference test runs on the CPU too, through Triton's interpreter, on small shapes.

``python -m tests.engine.qwen35.test_gpu_gdn`` times the kernel at the 27B's GDN shape (48 value heads, 128 × 128).
"""

from __future__ import annotations

import time

import attrs
import numpy as np
import pytest
import torch

from benchmarks.gpu_probe import timed
from spinf.engine.kernels.gdn import decode_delta_rule, recurrent_delta_rule, segment_table
from spinf.engine.layout import build_pass
from spinf.engine.qwen35.gdn import delta_rule
from spinf.engine.qwen35.model import load_qwen35
from spinf.engine.qwen35.plan import pass_plan, predecessors, segments
from spinf.engine.qwen35.tiny import write_tiny_qwen35
from spinf.engine.scorer import one_cpu_thread
from spinf.engine.trie import Job, add_prompt
from tests.engine.qwen35.test_qwen35_model import forked, job_of, tokens

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
TOLERANCE = 1e-4  # the tiny model's log-probs on CUDA against the CPU


def stream_inputs(token_ids: list[int], heads: int, dk: int, dv: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Delta-rule inputs of a stream, each row a function of its token id alone (so equal paths get equal inputs):
    q, k [N, heads, dk] l2-normed (q scaled by dk^-1/2), v [N, heads, dv], decay in (0.85, 1), beta in (0, 1)."""
    g = torch.Generator().manual_seed(seed)
    vocab = 8192  # the ids `tokens` draws (the tables must not depend on the pass)
    table_qk = torch.nn.functional.normalize(torch.randn(vocab, 2, heads, dk, generator=g), dim=-1)
    table_v = torch.randn(vocab, heads, dv, generator=g)
    table_decay = 0.85 + 0.15 * torch.rand(vocab, heads, generator=g)
    table_beta = torch.sigmoid(torch.randn(vocab, heads, generator=g))
    ids = torch.tensor(token_ids, dtype=torch.long)
    return (
        table_qk[ids, 0] * dk**-0.5,
        table_qk[ids, 1].contiguous(),
        table_v[ids],
        table_decay[ids],
        table_beta[ids],
    )


def kernel_rule(inputs: tuple[torch.Tensor, ...], layout) -> torch.Tensor:
    """The kernel's delta rule of one pass, on `DEVICE`, back on the CPU."""
    plan = pass_plan(layout, 4)
    table, levels, slots = segment_table(plan.segments, plan.kept)
    on = [t.to(DEVICE) for t in inputs]
    return recurrent_delta_rule(*on, torch.from_numpy(table).to(DEVICE), levels, slots).cpu()


def reference_rule(inputs, plan, states_at=None) -> torch.Tensor:
    """The CPU delta rule on ``inputs`` (q, k, v, decay, beta): its own log decay beside the decay."""
    q, k, v, decay, beta = inputs
    return delta_rule(q, k, v, torch.log(decay), beta, plan, states_at, decay=decay)


def several_jobs(long_prefix: int) -> list[Job]:
    """Jobs with forks at several depths, a prompt inside another one, 1-token leaves, a job without a prefix and
    one whose single prompt continues its prefix's segment."""
    jobs = [job_of(*forked(10, long_prefix))[0], job_of(*forked(20, 17))[0]]
    jobs.append(job_of((), [tokens(30, 5), tokens(30, 5)[:2] + tokens(31, 1), tokens(32, 1)])[0])
    jobs.append(job_of(tokens(40, 9), [tokens(41, 6)])[0])
    leaves = job_of(tokens(50, 12), [tokens(51, 3) + (t,) for t in range(100, 106)])[0]  # 6 one-token leaves
    return [*jobs, leaves]


# heads, dk, dv; through the interpreter the middle shape takes about 30 s in all, so on the CPU it runs with the
# long runs (the default run keeps within ten minutes)
SHAPES = [(4, 16, 16), pytest.param((3, 64, 96), marks=() if CUDA else pytest.mark.slow, id="3x64x96")]
SHAPES += [(6, 128, 128)] if CUDA else []


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_kernel_matches_the_reference_on_forked_passes(shape):
    layout = build_pass(several_jobs(300 if CUDA else 40))
    inputs = stream_inputs(layout.token_ids, *shape)
    with one_cpu_thread(torch.device("cpu")):
        expected = reference_rule(inputs, pass_plan(layout, 4))
    got = kernel_rule(inputs, layout)
    assert (got - expected).abs().max().item() <= 1e-5 * expected.abs().max().item()


def _prefix_ends(layout) -> tuple[int, ...]:
    return tuple(start + prefix_len - 1 for start, prefix_len, _ in layout.spans if prefix_len)


@pytest.mark.parametrize("shape", SHAPES[:2], ids=lambda s: "x".join(map(str, s)))
def test_the_kernel_keeps_the_state_after_each_captured_row_and_cutting_there_changes_no_bit(shape):
    layout = build_pass(several_jobs(300 if CUDA else 40))
    inputs = stream_inputs(layout.token_ids, *shape)
    heads, dk, dv = shape
    rows = _prefix_ends(layout)  # what extraction captures: the state at each job's prefix end
    expected = dict.fromkeys(rows)
    with one_cpu_thread(torch.device("cpu")):
        expected_out = reference_rule(inputs, pass_plan(layout, 4), expected)
    segs, kept = segments(predecessors(layout), frozenset(rows))
    table, levels, slots = segment_table(segs, kept, rows)
    captured = torch.full((len(rows), heads, dk, dv), float("nan"), device=DEVICE)
    on = [t.to(DEVICE) for t in inputs]
    got = recurrent_delta_rule(*on, torch.from_numpy(table).to(DEVICE), levels, slots, captured=captured).cpu()
    assert torch.equal(got, kernel_rule(inputs, layout))  # the uncut segments' bits
    scale = expected_out.abs().max().item()
    assert (got - expected_out).abs().max().item() <= 1e-5 * scale
    for place, row in enumerate(rows):
        assert (captured[place].cpu() - expected[row]).abs().max().item() <= 1e-5 * expected[row].abs().max().item()
    with pytest.raises(ValueError, match="does not end a segment"):
        segment_table(*segments(predecessors(layout)), (rows[0] - 1,))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_a_decode_step_replays_each_rows_path_to_the_bits_of_the_pass(shape):
    """A decode row whose path is the first m tokens of a branch gets, from the state captured at the prefix's end,
    the branch's m-th output of the scoring kernel bit for bit (the decoder's buffer: every stream row's inputs)."""
    prefix, branch = tokens(5, 30), tokens(6, 12)
    layout = build_pass([job_of(prefix, [branch, tokens(7, 4)])[0], job_of(tokens(8, 9), [tokens(9, 3)])[0]])
    heads, dk, dv = shape
    q, k, v, decay, beta = (t.to(DEVICE) for t in stream_inputs(layout.token_ids, *shape))
    rows = _prefix_ends(layout)
    segs, kept = segments(predecessors(layout), frozenset(rows))
    table, levels, slots = segment_table(segs, kept, rows)
    captured = torch.empty((len(rows), heads, dk, dv), device=DEVICE)
    scored = recurrent_delta_rule(q, k, v, decay, beta, torch.from_numpy(table).to(DEVICE), levels, slots,
                                  captured=captured)  # fmt: skip
    start, prefix_len, _ = layout.spans[0]
    path = list(range(start + prefix_len, start + prefix_len + len(branch)))  # the first branch, in stream order
    assert layout.token_ids[path[0] : path[-1] + 1] == list(branch)
    n = len(path)
    buffer = torch.cat([k.reshape(len(k), -1), v.reshape(len(v), -1), decay, beta], dim=1)
    path_index = torch.zeros((n, n), dtype=torch.long)
    for m in range(1, n + 1):
        path_index[m - 1, :m] = torch.tensor(path[:m])
    own = torch.tensor(path, device=DEVICE)
    states = captured[:1].contiguous()  # group 0: the first job's prefix
    group_of = torch.zeros(n, dtype=torch.long, device=DEVICE)
    lengths = torch.arange(1, n + 1, device=DEVICE)
    got = decode_delta_rule(q[own], k[own], v[own], decay[own], beta[own], states, group_of, buffer,
                            path_index.to(DEVICE), lengths)  # fmt: skip
    assert torch.equal(got.cpu(), scored[own].cpu())
    # one row alone, its group read from a [3, 1] table as the decoder keeps it (a row of stride 3, one element)
    table = torch.tensor([[0, start, prefix_len]]).t().contiguous().to(DEVICE)
    assert table[0].stride(0) == 3
    last = own[-1:]
    one = decode_delta_rule(q[last], k[last], v[last], decay[last], beta[last], states, table[0], buffer,
                            path_index[-1:].to(DEVICE), lengths[-1:])  # fmt: skip
    assert torch.equal(one.cpu(), scored[last].cpu())


def test_slots_alternate_by_level_and_each_segment_reads_its_sources_slot():
    prefix, branches = (7, 8, 9), [(1, 2, 3), (1, 2, 4), (1, 5), (6,)]
    layout = build_pass([job_of((3, 4), [(5,)])[0], job_of(prefix, branches)[0]])
    plan = pass_plan(layout, 4)
    table, levels, slots = segment_table(plan.segments, plan.kept)
    # segments (first, end, source): 0 (0,3,-1) 1 (3,6,-1) 2 (6,7,1) 3 (7,8,2) 4 (8,9,3) 5 (9,10,3) 6 (10,11,2)
    # 7 (11,12,1); levels: {0, 1}, {2, 7}, {3, 6}, {4, 5}; kept 1 (level 0), 2 (level 1), 3 (level 2)
    assert levels == (0, 2, 4, 6, 8) and slots == 2
    assert table.tolist() == [
        [0, 3, -1, -1, 0, -1],
        [3, 6, -1, 0, 0, -1],
        [6, 7, 0, 1, 1, -1],
        [11, 12, 0, -1, 1, -1],
        [7, 8, 1, 0, 2, -1],
        [10, 11, 1, -1, 2, -1],
        [8, 9, 0, -1, 3, -1],
        [9, 10, 0, -1, 3, -1],
    ]
    # the states after row 1 (inside segment 0, which is cut there) and row 7 (a segment's end): captured
    segs, kept = segments(predecessors(layout), frozenset({1, 7}))
    assert segs[:3] == ((0, 2, -1), (2, 3, 0), (3, 6, -1)) and len(segs) == len(plan.segments) + 1
    table, _, _ = segment_table(segs, kept, (7, 1))
    assert [(first, end, place) for first, end, *_, place in table.tolist() if place >= 0] == [(0, 2, 1), (7, 8, 0)]


def path_rows(layout, job: int, read: tuple[int, int]) -> list[int]:
    """The stream rows of a prompt's path: its job's prefix, then its own tokens root first."""
    start, prefix_len, _ = layout.spans[job]
    end_row = layout.read_rows[layout.read_index[(job, *read)][0]]
    branch = dict(zip(layout.branch_rows, layout.paths, strict=True))
    return list(range(start, start + prefix_len)) + branch.get(end_row, [])


def compositions(seed: int) -> tuple[tuple[int, ...], list[tuple[list[Job], int, tuple[int, int]]]]:
    """One prompt in passes of other make-ups: (jobs, the prompt's job, its read) each."""
    prefix, target = tokens(seed, 60), tokens(seed + 1, 8)
    others = [job_of(*forked(seed + 10 * i, 20 + 7 * i))[0] for i in range(1, 7)]

    def with_siblings(siblings: list[tuple[int, ...]], first: bool = True) -> tuple[Job, tuple[int, int]]:
        job = Job(prefix)
        branches = [target, *siblings] if first else [*siblings, target]
        reads = [add_prompt(job, b, [(5,)])[0][0] for b in branches]
        return job, reads[0 if first else -1]

    stems = [target[:d] + tokens(seed + 20 + d, 3) for d in (0, 1, 3, 6)]  # forks along the target's own path
    made = [
        with_siblings([]),
        with_siblings(stems),
        with_siblings(stems[::-1], first=False),
        with_siblings([target[:5], target + tokens(seed + 30, 2)]),  # a prompt inside it, one past it
        with_siblings([target[:7] + (t,) for t in range(200, 205)]),  # 1-token leaves at its last fork
    ]
    out = [([job], 0, read) for job, read in made]
    job, read = with_siblings(stems)
    out.append(([*others[:3], job, *others[3:]], 3, read))  # among 6 other jobs
    job, read = with_siblings([target[:2] + tokens(seed + 40, 9)], first=False)
    out.append(([*others[::-1], job], 6, read))
    return target, out


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4, 16, 16), (6, 128, 128)], ids=lambda s: "x".join(map(str, s)))
def test_a_paths_outputs_are_the_same_bits_wherever_its_trie_forks_and_whatever_shares_the_pass(shape):
    for seed in (100, 200):
        _, cases = compositions(seed)
        seen = []
        for jobs, job, read in cases:
            layout = build_pass(jobs)
            got = kernel_rule(stream_inputs(layout.token_ids, *shape, seed=seed), layout)
            seen.append(got[path_rows(layout, job, read)])
        assert len(seen) >= 7 and all(torch.equal(seen[0], other) for other in seen[1:]), seed


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    folder = write_tiny_qwen35(tmp_path_factory.mktemp("tiny-qwen35"))
    return load_qwen35(folder), load_qwen35(folder).to(DEVICE)


def cuda_prompt_logprobs(model, jobs) -> list[list[torch.Tensor]]:
    """`Qwen35Text.pass_logprobs` on CUDA: the plan on the device, with the tree-attention kernel's tables, and the
    head in the scorer's fixed chunks (`full_logprobs`: a product of the read rows alone changes with their count)."""
    cfg = model.cfg
    layout = build_pass([job for job, _ in jobs])
    plan = pass_plan(layout, cfg.linear_conv_kernel_dim, DEVICE, (cfg.head_dim, cfg.num_heads // cfg.num_kv_heads))
    assert plan.attention.kernel is not None and plan.recurrent is not None
    with torch.inference_mode():
        hidden = model(torch.tensor(layout.token_ids, dtype=torch.long, device=DEVICE), plan)
        rows = model.full_logprobs(hidden[torch.tensor(layout.read_rows, dtype=torch.long, device=DEVICE)]).cpu()
    return [[rows[layout.read_index[(j, *read)][0]] for read in reads] for j, (_, reads) in enumerate(jobs)]


@pytest.mark.gpu
@pytest.mark.parametrize("fixed", [False, True], ids=["token by token", "fixed prefixes chunked"])
def test_the_tiny_model_on_cuda_matches_the_cpu(tiny_models, fixed):
    """Token by token, CUDA gives the CPU's log-probs to 1e-4; with the fixed prefixes chunked, fla's products
    (tf32 on fp32 inputs, bf16 chunk states) move this sharp model's log-probs by about 0.01."""
    cpu, gpu = tiny_models
    if fixed:
        chunked_or_skip()
    tolerance = 0.05 if fixed else TOLERANCE
    cases = [forked(10, 30), forked(20, 300), (tokens(30, 90), [tokens(31, 80)])]
    jobs = [job_of(prefix, branches, None if fixed else 0) for prefix, branches in cases]
    with one_cpu_thread(torch.device("cpu")), torch.inference_mode():
        layout = build_pass([job for job, _ in jobs])
        rows = cpu.pass_logprobs(layout)
    got = cuda_prompt_logprobs(gpu, jobs)
    for j, (_, reads) in enumerate(jobs):
        for read, row in zip(reads, got[j], strict=True):
            expected = rows[layout.read_index[(j, *read)][0]]
            assert (row - expected).abs().max().item() <= tolerance, (j, read)


@pytest.mark.gpu
def test_the_tiny_models_questions_are_the_same_bits_on_cuda_alone_among_siblings_and_other_jobs(tiny_models):
    _, gpu = tiny_models
    prefix, branches = forked(50, 140)  # its fixed prefix runs chunked, with the other jobs' or alone
    branches = [b for b in branches if b]
    alone = [cuda_prompt_logprobs(gpu, [job_of(prefix, [branch])])[0][0] for branch in branches]
    (together,) = cuda_prompt_logprobs(gpu, [job_of(prefix, branches)])
    others = [job_of(*forked(60 + i, 25 + 90 * i)) for i in range(5)] + [job_of(tokens(70, 7), [tokens(71, 3)])]
    mixed = cuda_prompt_logprobs(gpu, [*others[:3], job_of(prefix, branches[::-1]), *others[3:]])[3][::-1]
    for branch, solo, sibling, packed in zip(branches, alone, together, mixed, strict=True):
        assert torch.equal(solo, sibling), branch
        assert torch.equal(solo, packed), branch


def chunked_or_skip():
    from spinf.engine.kernels.chunked import chunked_kernel

    fn, why = chunked_kernel()
    if fn is None:
        pytest.skip(why)


def chunked_inputs(lengths: tuple[int, ...], heads: int, dk: int, dv: int, seed: int):
    """Packed rows of sequences ``lengths`` (bf16 q, k, v; fp32 log decay and beta) and random initial states."""
    gen = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    q = torch.nn.functional.normalize(torch.randn(n, heads, dk, generator=gen), dim=-1) * dk**-0.5
    k = torch.nn.functional.normalize(torch.randn(n, heads, dk, generator=gen), dim=-1)
    v = torch.randn(n, heads, dv, generator=gen)
    g = torch.log(0.85 + 0.15 * torch.rand(n, heads, generator=gen))
    beta = torch.sigmoid(torch.randn(n, heads, generator=gen))
    initial = torch.randn(len(lengths), heads, dk, dv, generator=gen) / 4
    bf16 = [t.to(torch.bfloat16) for t in (q, k, v)]
    return (*bf16, g, beta), initial, torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int64)


def run_fla(rows, initial, cu):
    from spinf.engine.kernels.chunked import chunked_delta_rule
    from spinf.engine.qwen35.chunked import CHUNK

    on = [t.to(DEVICE) for t in rows]
    lengths = (cu[1:] - cu[:-1]).tolist()
    indices = torch.tensor([(n, c) for n, m in enumerate(lengths) for c in range(-(-m // CHUNK))]).to(DEVICE)
    o, final = chunked_delta_rule(*on, initial.to(DEVICE), cu.to(DEVICE), cu, indices)
    return o.float().cpu(), final.cpu()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_fla_runs_the_chunked_rule_near_the_reference_with_its_pinned_configurations(monkeypatch):
    chunked_or_skip()
    from triton.runtime import autotuner

    from spinf.engine.kernels.chunked import PINNED_KERNELS, config_dir
    from spinf.engine.qwen35.chunked import reference_chunked

    def refuse(*args, **kwargs):
        raise AssertionError("an fla kernel timed its candidate configurations")

    monkeypatch.setattr(autotuner.Autotuner, "_bench", refuse)
    rows, initial, cu = chunked_inputs((300, 64, 1, 130, 8192 + 70), 48, 128, 128, seed=7)  # the 27B's GDN shape
    o, final = run_fla(rows, initial, cu)
    expected, expected_final = reference_chunked(*(t.float() for t in rows), initial, cu)
    scale, state_scale = expected.abs().max().item(), expected_final.abs().max().item()
    print("fla against the fp32 reference:", (o - expected).abs().max().item() / scale)
    assert (o - expected).abs().max().item() <= 2e-2 * scale  # bf16 inputs, bf16 chunk states inside fla
    assert (final - expected_final).abs().max().item() <= 2e-2 * state_scale
    import json

    from fla.ops.common import chunk_delta_h, chunk_o
    from fla.ops.gated_delta_rule import chunk_fwd, wy_fast
    from fla.ops.utils import cumsum

    kernels = {
        "chunk_local_cumsum_scalar_kernel": cumsum,
        "chunk_gated_delta_rule_fwd_kkt_solve_kernel": chunk_fwd,
        "recompute_w_u_fwd_kernel": wy_fast,
        "chunk_gated_delta_rule_fwd_kernel_h_blockdim64": chunk_delta_h,
        "chunk_fwd_kernel_o": chunk_o,
    }
    assert set(kernels) == set(PINNED_KERNELS)
    for name, module in kernels.items():
        tuner = getattr(module, name)
        while not isinstance(tuner, autotuner.Autotuner):
            tuner = tuner.fn
        pinned = json.loads((config_dir() / f"{name}.json").read_text())["default_config"]
        used = list(tuner.cache.values())
        assert used, name
        for config in used:
            assert (config.kwargs, config.num_warps, config.num_stages) == (
                pinned["kwargs"], pinned["num_warps"], pinned["num_stages"]
            ), name  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_a_sequence_gets_the_same_bits_from_fla_whatever_shares_its_call():
    chunked_or_skip()
    rows, initial, cu = chunked_inputs((200, 5, 1000, 64, 77), 6, 128, 128, seed=9)
    o, final = run_fla(rows, initial, cu)
    for n in range(len(cu) - 1):
        a, b = int(cu[n]), int(cu[n + 1])
        alone, alone_final = run_fla([t[a:b] for t in rows], initial[n : n + 1], torch.tensor([0, b - a]))
        assert torch.equal(alone, o[a:b]) and torch.equal(alone_final[0], final[n]), n


@pytest.mark.gpu
def test_the_tree_attention_kernel_runs_the_27b_attention_shape():
    from spinf.engine.attention import attention_plan, tree_attention
    from spinf.engine.kernels import kernel_plan, tile_rows, tree_attention_kernel
    from spinf.engine.qwen35.plan import kernel_config

    layout = build_pass(several_jobs(300))
    n, config = layout.num_tokens, kernel_config(256, 6)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, heads, 256, generator=g) / 4 for heads in (24, 4, 4))
    expected = tree_attention(q, k, v, attention_plan(layout, torch.device("cpu")), None)
    plan = kernel_plan(layout, DEVICE, {tile_rows(256, 6, config)})
    got = tree_attention_kernel(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), plan, None, config).cpu()
    assert (got - expected).abs().max().item() <= 1e-5


def _benchmark_job(seed: int, content: int, questions: int) -> Job:
    """A job of ``content`` tokens and ``questions`` prompts of 12 tokens forking in a trie: a 3-token stem shared
    by all, 3 more shared by each group of 5, then 6 of their own (about 270 trie nodes). The content is not fixed
    (token by token); `_time_layout` times it fixed too."""
    job = Job(tokens(seed, content))
    stem = tokens(seed + 1, 3)
    for i in range(questions):
        prompt = stem + tokens(seed + 2 + i // 5, 3) + tokens(seed + 100 + i, 6)
        add_prompt(job, prompt, [(5,)])
    return job


def _time_layout(name: str, jobs: list[Job], heads=48, dk=128, dv=128, gdn_layers=48) -> None:
    """The token-by-token kernel over ``jobs`` at each of four configurations, then the whole delta rule with each
    job's prefix fixed (chunked by fla, the rest by the kernel)."""
    layout = build_pass(jobs)
    plan = pass_plan(layout, 4, DEVICE)
    n = layout.num_tokens
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(n, heads, dk, device=DEVICE, generator=g), dim=-1) * dk**-0.5
    k = torch.nn.functional.normalize(torch.randn(n, heads, dk, device=DEVICE, generator=g), dim=-1)
    v = torch.randn(n, heads, dv, device=DEVICE, generator=g)
    decay = 0.9 + 0.1 * torch.rand(n, heads, device=DEVICE, generator=g)
    beta = torch.rand(n, heads, device=DEVICE, generator=g)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))  # as the model's activations come
    log_decay = torch.log(decay)
    kept_mib = plan.num_slots * heads * dk * dv * 4 / 2**20
    print(
        f"{name}: {n} tokens, {len(plan.segments)} segments in {len(plan.levels) - 1} levels,"
        f" {plan.num_slots} slots ({kept_mib:.0f} MiB kept, {len(plan.kept)} kept segments)"
    )
    for config in (None, (8, 1), (8, 2), (16, 1), (16, 2), (16, 4), (32, 2), (32, 8), (64, 4), (64, 8)):

        def run(config=config):
            return recurrent_delta_rule(q, k, v, decay, beta, plan.recurrent, plan.levels, plan.num_slots, config)

        ms = timed(run, 5) * 1000
        print(f"  config {config or 'fixed'}: {ms:.3f} ms per GDN layer, {ms * gdn_layers:.1f} ms for {gdn_layers}")
    fixed = build_pass([attrs.evolve(job, fixed=len(job.prefix)) for job in jobs])
    chunked = pass_plan(fixed, 4, DEVICE)
    if not chunked.chunked:
        print("  chunked: not run (fla is not available pinned)")
        return
    ms = timed(lambda: delta_rule(q, k, v, log_decay, beta, chunked, decay=decay), 5) * 1000
    calls = len(chunked.chunked_calls)
    print(f"  content chunked ({calls} fla calls), the rest token by token: {ms:.3f} ms per GDN layer, "
          f"{ms * gdn_layers:.1f} ms for {gdn_layers}")  # fmt: skip


def benchmark() -> None:
    """The kernel at the 27B's GDN shape on a trie pass of 8 jobs and on one job of 16k tokens."""
    started = time.perf_counter()
    _time_layout("16 jobs x (40 content + 106 questions), as J2", [_benchmark_job(s, 40, 106) for s in range(16)])
    _time_layout("8 jobs x (1800 content + 40 questions)", [_benchmark_job(s, 1800, 40) for s in range(8)])
    single = Job(tokens(9, 16383))
    add_prompt(single, tokens(10, 1), [(5,)])
    _time_layout("1 job of 16k tokens", [single])
    print(f"benchmark: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    benchmark()
