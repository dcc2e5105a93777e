"""Qwen3.5's norms on the GPU (`spinf.engine.kernels.rows.qwen_norm`): the torch formulas of
`spinf.engine.qwen35.model`, row by row, so a row's bits never depend on how many rows share the call (torch's GPU
reductions split a row by the row count). Compiled on a GPU, through Triton's interpreter elsewhere."""

from __future__ import annotations

import pytest
import torch

from spinf.engine.kernels.rows import qwen_norm

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def torch_rms(x, weight, eps, offset):
    xf = x.float()
    out = xf * (1.0 / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps))
    return (out if weight is None else out * (offset + weight.float())).type_as(x)


def torch_l2(x, eps=1e-6):
    return x * (1.0 / torch.sqrt((x * x).sum(-1, keepdim=True) + eps))


@pytest.mark.parametrize("width,offset", [(64, 1.0), (128, 0.0), (5120, 1.0), (100, 1.0)])
def test_the_rms_norm_is_the_models_and_row_invariant(width, offset):
    gen = torch.Generator().manual_seed(width)
    x, weight = torch.randn(300, width, generator=gen) * 3, torch.randn(width, generator=gen) * 0.1
    got = qwen_norm(x.to(DEVICE), weight.to(DEVICE), 1e-6, offset=offset).cpu()
    torch.testing.assert_close(got, torch_rms(x, weight, 1e-6, offset), rtol=2e-6, atol=1e-6)
    for rows in (1, 2, 7, 150):
        assert torch.equal(qwen_norm(x[:rows].to(DEVICE), weight.to(DEVICE), 1e-6, offset=offset).cpu(), got[:rows])


def test_the_l2_norm_is_the_models_and_row_invariant_over_heads():
    x = torch.randn(40, 6, 128, generator=torch.Generator().manual_seed(3))
    got = qwen_norm(x.to(DEVICE), None, 1e-6, l2=True).cpu()
    torch.testing.assert_close(got, torch_l2(x), rtol=2e-6, atol=1e-7)
    assert torch.equal(qwen_norm(x[3:4].to(DEVICE), None, 1e-6, l2=True).cpu(), got[3:4])


@pytest.mark.gpu
def test_on_the_gpu_the_bf16_l2_norm_rounds_as_torch_does_and_the_rms_keeps_its_dtype():
    x = torch.randn(300, 4, 128, device="cuda").bfloat16()
    torch.testing.assert_close(qwen_norm(x, None, 1e-6, l2=True), torch_l2(x), rtol=1e-2, atol=1e-2)
    out = qwen_norm(x, torch.ones(128, device="cuda"), 1e-6)
    assert out.dtype == torch.bfloat16
    assert torch.equal(qwen_norm(x[:1], None, 1e-6, l2=True), qwen_norm(x, None, 1e-6, l2=True)[:1])
