"""The Gemma schemes on the GPU (engine spec B.8): each scheme's product against its CPU emulation, and the tiny model
served from a folder in each scheme through the fused path and CUDA graphs, against the CPU's fp32 forward.

The CPU tests (tests/engine/test_schemes.py) bound each scheme's emulation; these check that the GPU kernels compute
what the emulation computes, up to the order of the sums: w8a8's int32 sums are exact, so its GPU product is its
CPU product bit for bit; the others within a product's rounding. The end-to-end bounds are the CPU's with a margin
of 1.5 (the fused path rounds to bf16 where the CPU's plain path does, but sums in other orders). The 12B-shaped
run (speed, peak memory, each product's row invariance) is ``python benchmarks/schemes.py`` (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import shutil

import pytest
import torch

from spinf import Engine
from spinf.engine.quant import AmaxRecorder
from spinf.engine.scales import SHIPPED_TABLE, write_table
from spinf.engine.schemes import SCHEMES, quantize_tokens
from tests.engine.test_schemes import BODIES, BOUNDS, HEADS, errors, logprobs

pytestmark = pytest.mark.gpu
GPU_MARGIN = 1.5


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tiny_engine):
    """The tiny model as a local folder (every Gemma scheme may run it on a GPU) with an fp8s table shipped in it."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("the fp8 schemes need compute capability 8.9")
    path = tmp_path_factory.mktemp("tiny") / "tiny-gemma4"
    shutil.copytree(tiny_engine.folder, path)
    recorder = AmaxRecorder()
    with tiny_engine.model.observing(recorder.observe):
        for body in BODIES:
            tiny_engine.score(body)
    table = {"format": 1, "model": str(path), "revision": "tiny-gemma4", "scheme": "fp8s"}
    write_table({**table, "scales": recorder.scales()}, path / SHIPPED_TABLE)
    return path


@pytest.mark.parametrize("scheme", ["fp8", "fp8row", "w8a16", "w8a8"])
def test_each_product_on_the_gpu_is_its_cpu_emulation(scheme):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(300, 512, generator=gen).to(torch.bfloat16)
    weight = torch.cat([torch.randn(256, 512, generator=gen) * s for s in (0.05, 0.5)])
    stored_cpu = SCHEMES[scheme].quantize(weight, (256, 256))
    stored_gpu = SCHEMES[scheme].quantize(weight.cuda(), (256, 256))
    for field in ("data", "scale"):  # the same quantized weight on both devices
        assert torch.equal(getattr(stored_cpu, field).float(), getattr(stored_gpu, field).float().cpu())
    on_cpu = SCHEMES[scheme].linear(x, stored_cpu, torch.bfloat16)
    on_gpu = SCHEMES[scheme].linear(x.cuda(), stored_gpu, torch.bfloat16).cpu()
    if scheme == "w8a8":
        assert torch.equal(on_gpu, on_cpu)  # exact int32 sums, the same fp32 epilogue
    else:
        relative = ((on_gpu.float() - on_cpu.float()).norm() / on_cpu.float().norm()).item()
        assert relative < 1e-2, relative  # bf16 outputs (2^-9) and fp8 tensor cores' narrower accumulators
    for rows in (1, 16, 17):  # w8a8 pads up to 17 rows for _int_mm; the others take any row count
        assert SCHEMES[scheme].linear(x[:rows].cuda(), stored_gpu, torch.bfloat16).shape == (rows, 512)


def test_the_per_token_quantizers_are_the_same_on_both_devices():
    gen = torch.Generator().manual_seed(6)
    x = (torch.randn(40, 3840, generator=gen) * torch.logspace(-2, 2, 40)[:, None]).to(torch.bfloat16)
    for int8 in (True, False):
        (q_cpu, s_cpu), (q_gpu, s_gpu) = quantize_tokens(x, int8=int8), quantize_tokens(x.cuda(), int8=int8)
        assert torch.equal(s_gpu.cpu(), s_cpu) and torch.equal(q_gpu.cpu().float(), q_cpu.float())


@pytest.mark.parametrize("scheme", list(BOUNDS))
def test_each_scheme_serves_the_tiny_model_on_the_gpu(scheme, folder, exact_cpu):
    engine = Engine(str(folder), device="cuda", quant=scheme)
    assert engine.model.runs_fused() and engine.quant == scheme and not engine.batch_invariant
    got = logprobs(engine)
    worst, median = errors(got, exact_cpu)
    bound_max, bound_median = (GPU_MARGIN * b for b in BOUNDS[scheme])
    assert (worst <= bound_max, median <= bound_median) == (True, True), (scheme, worst, median)
    assert logprobs(engine) == got  # deterministic
    graphs = engine.scorer.graphs  # the small passes were captured and replayed, not run eagerly after a failure
    assert not graphs.failed and graphs.captured and graphs.replays > 0, (scheme, graphs.captured)


def test_the_head_modes_on_the_gpu(folder, exact_cpu):
    found = {mode: logprobs(Engine(str(folder), device="cuda", quant="bf16", lm_head=mode)) for mode in HEADS}
    assert found["f32out"] != found["bf16"] and found["f32out"] != found["fp32"]
    for mode, got in found.items():
        worst, median = errors(got, exact_cpu)
        bound_max, bound_median = (GPU_MARGIN * b for b in BOUNDS["bf16"])
        assert (worst <= bound_max, median <= bound_median) == (True, True), (mode, worst, median)


@pytest.fixture(scope="module")
def exact_cpu(tiny_engine):
    return logprobs(tiny_engine)
