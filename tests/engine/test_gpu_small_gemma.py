"""The small Gemma 4 models (E2B/E4B: per-layer input embeddings, KV-shared layers) on the fused GPU path.

The model is test_gemma4_small.py's: an 8-layer ``Gemma4ForCausalLM`` built and saved by transformers (the last
three layers KV-shared, double-wide MLPs there, per-layer inputs 16 wide).

On every machine (the kernels through Triton's interpreter on a CPU, as tests/engine/test_kernels.py runs them): a
shared layer's q/k/v kernel prepares its queries only, and a pass through the fused path (`Gemma4Text.forward` with
a kernel plan) stays within bf16 rounding of the fp32 forward while a wrong key producer or a per-layer input left
out does not, and two copies of one job in the same pass get the same bits. The interpreter multiplies bf16 tiles
wrongly (numpy has no bf16), so on the CPU the tree-attention kernel runs on fp32 copies of q, k and v.

On the GPU (marked ``gpu``): the engine on the folder through the fused path and CUDA graphs, against the CPU's
fp32 engine within the bf16 bounds below times test_gpu_schemes.py's margin; whole sequences against transformers'
fp64 forward, within a few times the CPU's bf16 error on the same sequence, and so are image rows; and, in bf16 and
in fp8s (linears
calibrated on the engine), test_gpu_invariance.py's five compositions, test_gpu_extraction.py's six and
test_gpu_graphs.py's replay against the eager pass, bit for bit. The E4B-shaped run of the same checks is
``python benchmarks/gpu_fast.py --shape e4b --jobs J1,J2,J3 --invariance`` (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import copy
import random

import attrs
import pytest
import torch

from spinf import Engine
from spinf.engine.attention import AttentionPlan, attention_plan
from spinf.engine.gemma4.loading import load_gemma4_text
from spinf.engine.layout import build_pass
from spinf.engine.trie import Job
from tests.engine import test_gpu_extraction as gpu_extraction
from tests.engine import test_gpu_graphs as gpu_graphs
from tests.engine import test_gpu_invariance as gpu_invariance
from tests.engine.test_gemma4_small import TEXT, WINDOW, folder, image_rows, with_vision  # noqa: F401 - fixtures
from tests.engine.test_schemes import errors, logprobs

triton = pytest.importorskip("triton")

from spinf.engine import kernels  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BF16 = torch.bfloat16
# |Δ log-prob| of the CPU's bf16 engine against its fp32 engine over test_schemes.py's bodies on this model
# (x86-64, torch 2.13): max 0.528, median 0.0561; the bounds leave test_schemes.py's margin of about 1.3
BF16_BOUNDS = (0.7, 0.075)
GPU_MARGIN = 1.5  # test_gpu_schemes.py's: the fused path rounds where the plain path does, sums in other orders


def fused_pass(model, layout, device: torch.device) -> torch.Tensor:
    """Hidden states of ``layout`` through the fused path (a kernel plan, as the scorer's eager pass builds it)."""
    plan = kernels.kernel_plan(layout, device, model.tile_rows())
    empty = torch.zeros((0, 1), dtype=torch.long, device=device)
    attention = AttentionPlan(plan.positions, (), empty[:, 0], empty, empty.bool(), kernel=plan)
    return model(torch.tensor(layout.token_ids, device=device), attention)


@pytest.fixture
def interpreted_attention(monkeypatch):
    """On the CPU, the tree-attention kernel on fp32 copies (the interpreter's bf16 products are wrong)."""
    if DEVICE.type == "cpu":
        real = kernels.tree_attention_kernel

        def fp32_attention(q, k, v, plan, window, config=None, out_scale=None, bidirectional=0):
            return real(q.float(), k.float(), v.float(), plan, window, config, None, bidirectional).to(q.dtype)

        monkeypatch.setattr(kernels, "tree_attention_kernel", fp32_attention)


def test_a_shared_layers_qkv_kernel_prepares_queries_only():
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, n = 4, 2, 32, 5
    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim, generator=gen).to(BF16).to(DEVICE)
    positions = torch.arange(n, dtype=torch.int32, device=DEVICE)
    inv_freq = (1.0 / 10_000 ** (torch.arange(0, dim, 2).float() / dim)).to(DEVICE)
    weights = kernels.qkv_norm_weights(*(torch.rand(2, dim, generator=gen) + 0.5).to(DEVICE))
    shape = {"heads": heads, "head_dim": dim, "k_eq_v": False, "eps": 1e-6}
    q, _, _ = kernels.prepare_qkv(qkv, positions, inv_freq, weights, kv_heads=kv_heads, **shape)
    queries = qkv[:, : heads * dim].contiguous()  # a shared layer's projection
    only, k, v = kernels.prepare_qkv(queries, positions, inv_freq, weights, kv_heads=0, **shape)
    assert torch.equal(only, q) and k.shape == v.shape == (n, 0, dim)


def job(rng: random.Random, prefix_len: int, prompts: int) -> Job:
    made = Job(prefix=tuple(rng.randrange(3, TEXT["vocab_size"]) for _ in range(prefix_len)))
    for _ in range(prompts):
        made.trie.insert([7] + [rng.randrange(3, TEXT["vocab_size"]) for _ in range(rng.randrange(1, 3))])
    return made


@pytest.mark.slow  # over 15 s: the default run keeps to 10 minutes on 2 cores
@pytest.mark.usefixtures("interpreted_attention")
def test_the_fused_path_runs_per_layer_inputs_and_shared_keys(folder):  # noqa: F811
    """A pass of three jobs (the first and last the same, its content longer than the window) through the fused
    path: within bf16 rounding of the fp32 forward (mean |Δ log-prob| 0.11 measured, the plain bf16 path's 0.087;
    shared layers that read their kind's first layer give 0.70, no per-layer inputs 2.1), and the two copies of the
    job bit for bit alike."""
    rng = random.Random(1)
    mine = job(rng, WINDOW + 4, 2)
    layout = build_pass([mine, job(rng, 3, 1), mine])
    model = load_gemma4_text(folder, device=str(DEVICE), dtype=BF16)
    exact = load_gemma4_text(folder)
    with torch.inference_mode():
        assert model.runs_fused()
        hidden = fused_pass(model, layout, DEVICE).cpu()
        got = exact.read_logprobs(hidden.float())
        want = exact.read_logprobs(exact(torch.tensor(layout.token_ids), attention_plan(layout, torch.device("cpu"))))
    diff = (got - want).abs()
    assert diff.mean().item() < 0.2 and diff.max().item() < 3.0, (diff.mean().item(), diff.max().item())
    (first, size, branches), (last, *_) = layout.spans[0], layout.spans[2]
    assert torch.equal(hidden[first : first + size + branches], hidden[last : last + size + branches])


# --- on the GPU --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["bf16", "fp8s"])
def gpu_engine(request, folder):  # noqa: F811
    """The engine on the folder on CUDA in bf16, or in fp8s with linears calibrated on a few questions (as
    test_gpu_invariance.py's ``cuda_engine``); the names the shared GPU tests below ask for."""
    engine = Engine(str(folder), device="cuda", quant="bf16")
    return gpu_invariance.to_fp8s(engine) if request.param == "fp8s" else engine


@pytest.mark.gpu
def test_the_gpu_engine_matches_the_cpu_fp32_engine(folder):  # noqa: F811
    engine = Engine(str(folder), device="cuda", quant="bf16")
    assert engine.model.runs_fused() and engine.model.layers[-1].spec.kv_shared
    got = logprobs(engine)
    worst, median = errors(got, logprobs(Engine(str(folder), device="cpu")))
    bound_max, bound_median = (GPU_MARGIN * b for b in BF16_BOUNDS)
    assert (worst <= bound_max, median <= bound_median) == (True, True), (worst, median)
    assert logprobs(engine) == got  # deterministic
    graphs = engine.scorer.graphs  # the small passes were captured and replayed, not run eagerly after a failure
    assert not graphs.failed and graphs.captured and graphs.replays > 0, graphs.captured


@pytest.mark.gpu
@pytest.mark.parametrize("length", [WINDOW + 1, 3 * WINDOW + 5])
def test_whole_sequences_on_the_gpu_match_transformers(folder, length):  # noqa: F811
    """Our fused bf16 forward against transformers' fp64 one: within a few times what the CPU's plain bf16 forward
    of the same sequence is off by (through the interpreter the fused path is off by 1.3 to 1.5 times that on
    average and 1.75 times at worst; with shared layers that read their kind's first layer, 8 and 6 times)."""
    from transformers import Gemma4ForCausalLM

    reference = Gemma4ForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float64).eval()
    ids = torch.randint(3, TEXT["vocab_size"], (length,), generator=torch.Generator().manual_seed(length))
    layout = build_pass([Job(prefix=tuple(ids.tolist()))])
    gpu = load_gemma4_text(folder, device="cuda", dtype=BF16)
    cpu = load_gemma4_text(folder, dtype=BF16)
    with torch.inference_mode():
        expected = torch.log_softmax(reference(input_ids=ids[None]).logits[0], dim=-1)
        got = gpu.full_logprobs(fused_pass(gpu, layout, torch.device("cuda"))).cpu().double()
        plain = cpu.read_logprobs(cpu(ids, AttentionPlan.for_sequence(length))).double()
    ours, floor = (got - expected).abs(), (plain - expected).abs()
    assert ours.mean() <= 2.5 * floor.mean() and ours.max() <= 4 * floor.max(), (ours.mean(), floor.mean())


@pytest.mark.gpu
def test_image_rows_on_the_gpu_match_transformers(with_vision):  # noqa: F811
    """test_gemma4_small.py's image rows (given embeddings at the placeholders, whose per-layer inputs read the pad
    token's row) through the fused path, against transformers' fp64 forward, bounded as the sequences above."""
    ours, reference = with_vision
    ids, rows, image, outputs = image_rows()
    cpu = ours.to(BF16)
    gpu = copy.deepcopy(cpu).to("cuda")
    plan = kernels.kernel_plan(build_pass([Job(prefix=tuple(ids.tolist()))]), torch.device("cuda"), gpu.tile_rows())
    empty = torch.zeros((0, 1), dtype=torch.long, device="cuda")
    media = (rows.cuda(), image.to(BF16).cuda())
    attention = AttentionPlan(plan.positions, (), empty[:, 0], empty, empty.bool(), kernel=plan, media=media)
    with torch.inference_mode():
        expected = torch.log_softmax(reference(input_ids=ids[None], mm_encoder_outputs=outputs).logits[0], dim=-1)
        got = gpu.full_logprobs(gpu(ids.cuda(), attention)).cpu().double()
        plain_plan = attrs.evolve(AttentionPlan.for_sequence(60), media=(rows, image.to(BF16)))
        plain = cpu.read_logprobs(cpu(ids, plain_plan)).double()
    ours_error, floor = (got - expected).abs(), (plain - expected).abs()
    assert ours_error.mean() <= 2.5 * floor.mean() and ours_error.max() <= 4 * floor.max(), ours_error.mean()


# test_gpu_invariance.py's five compositions, test_gpu_extraction.py's six, test_gpu_graphs.py's replay, on this model
# (marked here: those modules mark theirs module-wide)
test_every_question_keeps_its_bits_in_five_compositions = pytest.mark.gpu(
    gpu_invariance.test_every_question_keeps_its_bits_in_five_compositions
)
outcomes = gpu_extraction.outcomes
test_every_slot_keeps_its_bits_in_six_compositions = pytest.mark.gpu(
    gpu_extraction.test_every_slot_keeps_its_bits_in_six_compositions
)
test_a_replayed_pass_gives_the_eager_bits = pytest.mark.gpu(gpu_graphs.test_a_replayed_pass_gives_the_eager_bits)


def test_the_cpu_bf16_engine_is_within_the_bounds_the_gpu_rests_on(folder):  # noqa: F811
    worst, median = errors(logprobs(Engine(str(folder), device="cpu", quant="bf16")), cpu_fp32(folder))
    assert (worst <= BF16_BOUNDS[0], median <= BF16_BOUNDS[1]) == (True, True), (worst, median)
    assert worst > 0


def cpu_fp32(folder) -> dict:  # noqa: F811
    return logprobs(Engine(str(folder), device="cpu"))
