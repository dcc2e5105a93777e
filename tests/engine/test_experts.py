"""The experts' grouped kernel (spinf.engine.kernels.experts) against each expert's plain product.

On a GPU compiled in bf16 (and e4m3); elsewhere through Triton's interpreter (tests/conftest.py sets
``TRITON_INTERPRET=1`` when no GPU is visible) in fp32, since the interpreter multiplies bf16 tiles wrongly. A row's
bits must not depend on what else is routed to its experts: checked on both.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from spinf.engine.gemma4.moe import ExpertsFp8, MoeBlock  # noqa: E402
from spinf.engine.kernels import experts as grouped  # noqa: E402
from spinf.engine.quant import Fp8Weight, fp8_matmul, quantize  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPE = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32
EXPERTS, TOP_K, INPUTS, OUTPUTS = 6, 2, 96, 160  # neither a power of two nor a multiple of the tiles


def routing(rows: int, seed: int = 0) -> torch.Tensor:
    """[rows, 2] distinct experts per row, skewed: expert 0 gets most rows (several tiles), expert 5 none."""
    gen = torch.Generator().manual_seed(seed)
    first = torch.where(torch.rand(rows, generator=gen) < 0.6, 0, torch.randint(1, 5, (rows,), generator=gen))
    second = (first + torch.randint(1, 5, (rows,), generator=gen)) % 5
    return torch.stack([first, second], dim=1)


def draw(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def expected(x: torch.Tensor, weight: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """[rows, k, out]: each (row, rank)'s row times its expert's weight, in fp32."""
    return torch.einsum("ni,nkoi->nko", x.float(), weight.float()[chosen])


def run(x: torch.Tensor, weight, chosen: torch.Tensor) -> torch.Tensor:
    """The kernel's [rows, k, out] on ``DEVICE``, back on the CPU."""
    plan = grouped.expert_plan(chosen.to(DEVICE), EXPERTS)
    return grouped.grouped_mm(x.to(DEVICE), weight, plan, gather=True)[plan.slot_of].cpu()


def test_the_plan_groups_slots_by_expert():
    chosen = routing(150)
    plan = grouped.expert_plan(chosen, EXPERTS)
    counts = torch.bincount(chosen.reshape(-1), minlength=EXPERTS)
    assert plan.offsets.tolist() == [0, *counts.cumsum(0).tolist()]
    assert plan.tile_starts.tolist() == [0, *(-(-counts // grouped.TILE_ROWS)).cumsum(0).tolist()]
    assert sorted(plan.slot_of.reshape(-1).tolist()) == list(range(300))
    rows = torch.arange(150)[:, None].expand(150, 2)
    assert torch.equal(plan.slot_rows[plan.slot_of].long(), rows)  # each slot reads its own row
    for e in range(EXPERTS):  # an expert's slots in row order
        mine = plan.slot_of[chosen == e]
        assert torch.equal(mine, torch.arange(plan.offsets[e], plan.offsets[e + 1]))


def test_each_slot_is_its_experts_product():
    x, weight, chosen = draw(150, INPUTS, seed=1).to(DTYPE), draw(EXPERTS, OUTPUTS, INPUTS, seed=2), routing(150)
    weight = (weight / INPUTS**0.5).to(DTYPE)
    got = run(x, weight.to(DEVICE), chosen).float()
    want = expected(x, weight, chosen)
    relative = ((got - want).norm() / want.norm()).item()
    assert relative < (1e-2 if DTYPE == torch.bfloat16 else 1e-6), relative
    # the second projection reads its rows in slot order
    plan = grouped.expert_plan(chosen.to(DEVICE), EXPERTS)
    first = grouped.grouped_mm(x.to(DEVICE), weight.to(DEVICE), plan, gather=True)
    down = (draw(EXPERTS, INPUTS, OUTPUTS, seed=3) / OUTPUTS**0.5).to(DTYPE)
    second = grouped.grouped_mm(first, down.to(DEVICE), plan)[plan.slot_of].cpu().float()
    chained = torch.einsum("nko,nkio->nki", first[plan.slot_of].cpu().float(), down.float()[chosen])
    assert ((second - chained).norm() / chained.norm()).item() < (1e-2 if DTYPE == torch.bfloat16 else 1e-6)


def test_a_rows_bits_do_not_depend_on_what_else_is_routed():
    x, chosen = draw(200, INPUTS, seed=4).to(DTYPE), routing(200, seed=5)
    weight = (draw(EXPERTS, OUTPUTS, INPUTS, seed=6) / INPUTS**0.5).to(DTYPE).to(DEVICE)
    whole = run(x, weight, chosen)
    shuffled = torch.randperm(200, generator=torch.Generator().manual_seed(7))
    for rows in (torch.arange(1), torch.arange(7, 70), shuffled):
        assert torch.equal(run(x[rows], weight, chosen[rows]), whole[rows])
    # the same row among others routed to other experts, and alone with its ranks swapped
    assert torch.equal(run(x[3:4], weight, chosen[3:4].flip(1)), whole[3:4].flip(1))


def test_under_fp8s_each_expert_quantizes_by_its_own_scale():
    x, chosen = draw(150, INPUTS, seed=8).to(DTYPE), routing(150, seed=9)
    if DEVICE.type == "cpu":  # the interpreter's cast to e4m3 does not round to nearest: inputs on the e4m3 grid
        x = quantize(x, 1 / 32).float() / 32  # of every scale below (each a power of two under 1/32)
    weight = draw(EXPERTS, OUTPUTS, INPUTS, seed=10) / INPUTS**0.5
    per_expert = [Fp8Weight.from_float(weight[e], (OUTPUTS // 2, OUTPUTS // 2)) for e in range(EXPERTS)]
    inputs = tuple(2.0 ** -(e % 3) / 32 for e in range(EXPERTS))  # three scales: each expert quantizes by its own
    stacked = ExpertsFp8(
        data=torch.stack([w.data for w in per_expert]).to(DEVICE),
        scale=torch.stack([w.scale for w in per_expert]).to(DEVICE),
        inputs=inputs,
        input_scales=torch.tensor(inputs, device=DEVICE),
    )
    got = run(x, stacked, chosen).float()
    for rank in range(TOP_K):
        for e in range(EXPERTS):
            rows = (chosen[:, rank] == e).nonzero()[:, 0]
            if len(rows):
                want = fp8_matmul(quantize(x[rows], inputs[e]), per_expert[e], inputs[e], out_dtype=torch.float32)
                relative = ((got[rows, rank] - want).norm() / want.norm()).item()
                assert relative < (1e-2 if DTYPE == torch.bfloat16 else 1e-6), (rank, e, relative)


@pytest.mark.skipif(DEVICE.type == "cuda", reason="tests/engine/test_gpu_moe.py checks the bf16 block on a GPU")
def test_the_fused_block_is_the_plain_block(monkeypatch):
    """`MoeBlock.fused` (row kernels, the grouped launches, no host sync) against the block's plain forward. Through
    the interpreter the row kernels' bf16 outputs are widened to fp32, so the products run in fp32 (the interpreter
    multiplies bf16 wrongly); what differs is then their bf16 rounding alone."""
    from spinf import engine
    from spinf.engine.gemma4.config import parse_text_config
    from tests.engine.test_gemma4_moe import TEXT

    for name in ("norm_rows", "gelu_mul"):
        kernel = getattr(engine.kernels, name)
        monkeypatch.setattr(engine.kernels, name, lambda *a, kernel=kernel, **k: kernel(*a, **k).float())
    moe = MoeBlock(parse_text_config({**TEXT, "model_type": "gemma4_text"}))
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for param in moe.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) / param.shape[-1] ** 0.5 + (param.dim() == 1))
    h, dense = draw(100, TEXT["hidden_size"], seed=12), draw(100, TEXT["hidden_size"], seed=13)
    with torch.inference_mode():
        fused, plain = moe.fused(h, dense), moe(h, dense)
    assert (((fused - plain).norm(dim=1) / plain.norm(dim=1)).max().item()) < 1e-2  # bf16's 2^-8, a few times


# the interpreter's casts to bf16 do not round to nearest: bf16 is checked compiled
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if DEVICE.type == "cuda" else [torch.float32])
def test_the_combined_rows_are_the_blocks_mix_bit_for_bit(dtype):
    chosen = routing(150, seed=14)
    plan = grouped.expert_plan(chosen.to(DEVICE), EXPERTS)
    out = draw(300, OUTPUTS, seed=15).to(dtype).to(DEVICE)
    weights = torch.rand(150, TOP_K, generator=torch.Generator().manual_seed(16)).to(DEVICE)
    got = grouped.combine(out, plan, weights)
    assert got.dtype == dtype and torch.equal(got, MoeBlock.mix(out[plan.slot_of], weights))
