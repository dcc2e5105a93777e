"""The mixture-of-experts blocks on the GPU (the 26B A4B's, `spinf.engine.gemma4.moe`): the tiny MoE checkpoint of
tests/engine/test_gemma4_moe.py on CUDA through the fused path (each projection of every expert in one grouped
launch) and CUDA graphs, in bf16 and in fp8s.

Against the CPU's fp32 answers, with the bounds of the CPU's own bf16 and fp8s runs of this model (measured
1.39 / 0.076 and 2.10 / 0.32, max / median |Δ log-prob|) times 1.5 to 1.8, the fused path rounding elsewhere; and
each question's log-probs bit for bit in five compositions (tests/engine/test_gpu_invariance.py's), so no row's
result depends on what else is routed to its experts. The 26B A4B-shaped run (throughput, memory) is
``python benchmarks/gpu_fast.py --shape 26b-a4b`` (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import pytest
import torch

from spinf import Engine
from spinf.engine.quant import AmaxRecorder
from tests.engine import test_gpu_invariance as invariance
from tests.engine.test_gemma4_moe import write_checkpoint
from tests.engine.test_schemes import BODIES, errors, logprobs

pytestmark = pytest.mark.gpu
BOUNDS = {"bf16": (2.5, 0.12), "fp8s": (3.2, 0.5)}  # (max, median) |Δ log-prob| against the CPU's fp32


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("gemma4-moe"))


@pytest.fixture(scope="module")
def exact_cpu(folder):
    return logprobs(Engine(str(folder), device="cpu"))


@pytest.fixture(scope="module", params=list(BOUNDS))
def gpu_engine(request, folder):
    """The MoE model on CUDA in bf16, or in fp8s with every linear's and expert's scale calibrated on the bodies."""
    engine = Engine(str(folder), device="cuda", quant="bf16")
    if request.param == "fp8s":
        if torch.cuda.get_device_capability() < (8, 9):
            pytest.skip("fp8 needs compute capability 8.9")
        recorder = AmaxRecorder()
        with engine.model.observing(recorder.observe):
            for body in BODIES:
                engine.score(body)
        engine.model.to_fp8s(recorder.scales())
        assert engine.model.layers[0].moe.fp8["gate_up"].data.dtype == torch.float8_e4m3fn
    assert engine.model.runs_fused() and engine.scorer.graphs is not None
    return request.param, engine


def test_the_gpu_answers_are_the_cpus(gpu_engine, exact_cpu):
    scheme, engine = gpu_engine
    got = logprobs(engine)
    worst, median = errors(got, exact_cpu)
    bound_max, bound_median = BOUNDS[scheme]
    assert (worst <= bound_max, median <= bound_median) == (True, True), (scheme, worst, median)
    assert logprobs(engine) == got  # deterministic


def test_every_question_keeps_its_bits_in_five_compositions(gpu_engine):
    invariance.test_every_question_keeps_its_bits_in_five_compositions(gpu_engine[1])


def test_the_grouped_path_is_the_plain_path_on_the_gpu(folder):
    """One block's fused output against its plain forward on the same bf16 inputs: rows routed alike agree to
    bf16 rounding (the router's norm is computed by another kernel, so a near tie may route a row otherwise)."""
    engine = Engine(str(folder), device="cuda", quant="bf16")
    moe = engine.model.layers[1].moe
    gen = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(300, moe.hidden, generator=gen, device="cuda").to(torch.bfloat16)
    dense = torch.randn(300, moe.hidden, generator=gen, device="cuda").to(torch.bfloat16)
    with torch.inference_mode():
        fused, plain = moe.fused(h, dense).float(), moe(h, dense).float()
    close = ((fused - plain).norm(dim=1) / plain.norm(dim=1)) < 3e-2
    assert close.float().mean().item() > 0.9, close.float().mean().item()
