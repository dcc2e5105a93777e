"""The Triton kernels against the plain torch code they replace, over edge-case shapes.

On a GPU the kernels run compiled; elsewhere through Triton's interpreter (tests/conftest.py sets
``TRITON_INTERPRET=1`` when no GPU is visible), so their logic is checked on every machine. Per-row bitwise
independence (a row's bits never depend on what shares the launch) is checked on both.
"""

from __future__ import annotations

import random
import zlib

import pytest
import torch

triton = pytest.importorskip("triton")

from spinf.engine import kernels  # noqa: E402
from spinf.engine.attention import (  # noqa: E402
    BIDIRECTIONAL_IN_WINDOW,
    BIDIRECTIONAL_OR,
    apply_rope,
    attention_plan,
    tree_attention,
)
from spinf.engine.gemma4.config import LayerSpec  # noqa: E402
from spinf.engine.gemma4.layer import rope_inv_freq  # noqa: E402
from spinf.engine.layout import build_pass  # noqa: E402
from spinf.engine.norm import rms_norm  # noqa: E402
from spinf.engine.quant import quantize  # noqa: E402
from spinf.engine.trie import Job  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BF16 = torch.bfloat16
# The interpreter multiplies bf16 tiles wrongly (numpy has no bf16), so on the CPU attention is checked in fp32;
# the GPU checks the bf16 kernel the model runs.
ATTENTION_DTYPE = BF16 if DEVICE.type == "cuda" else torch.float32


def random_job(rng: random.Random, prefix_len: int, prompts: int, depth: int) -> Job:
    job = Job(prefix=tuple(rng.randrange(1, 500) for _ in range(prefix_len)))
    for _ in range(prompts):
        stem = [7, 8, 9][: rng.randrange(0, 4)]  # shared stems make forks
        job.trie.insert(stem + [rng.randrange(1, 500) for _ in range(rng.randrange(1, depth + 1))])
    return job


def run_both(
    jobs, heads: int, kv_heads: int, dim: int, window: int | None, seed: int = 0, config=None, bidirectional=0
):
    layout = build_pass(jobs)
    n = layout.num_tokens
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(n, h, dim, generator=gen).to(ATTENTION_DTYPE) for h in (heads, kv_heads, kv_heads))
    reference = tree_attention(q, k, v, attention_plan(layout, torch.device("cpu")), window, bidirectional)
    plan = kernels.kernel_plan(layout, DEVICE, [kernels.tile_rows(dim, heads // kv_heads, config)])
    got = kernels.tree_attention_kernel(
        q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), plan, window, config, bidirectional=bidirectional
    )
    return layout, reference, got.cpu()


class _Image:
    """A media item of the layout's kind: ``num_tokens`` placeholders read by the vision embedder."""

    embedder = "vision"

    def __init__(self, num_tokens: int):
        self.num_tokens = num_tokens


@pytest.mark.parametrize("bidirectional", [BIDIRECTIONAL_OR, BIDIRECTIONAL_IN_WINDOW])
@pytest.mark.parametrize("window", [None, 8])
def test_image_placeholders_attend_to_their_whole_image(bidirectional, window):
    # Two jobs with images in their prefixes (one longer than a key tile and the window), branch rows after.
    rng = random.Random(3)
    first, second = random_job(rng, 60, 4, 3), random_job(rng, 30, 3, 2)
    first.media = ((1, _Image(40)), (43, _Image(5)))
    second.media = ((2, _Image(20)),)
    layout, reference, got = run_both([first, second], 4, 2, 32, window, bidirectional=bidirectional)
    torch.testing.assert_close(got.float(), reference.float(), atol=2e-2, rtol=2e-2)  # bf16 on a GPU
    causal = tree_attention(*_qkv(layout, 4, 2, 32), attention_plan(layout, torch.device("cpu")), window)
    assert (causal[1:41].float() - reference[1:41].float()).abs().max() > 0.1  # they saw keys after themselves


def _qkv(layout, heads, kv_heads, dim, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = layout.num_tokens
    return tuple(torch.randn(n, h, dim, generator=gen).to(ATTENTION_DTYPE) for h in (heads, kv_heads, kv_heads))


SHAPES = [
    # (prefix lengths, prompts per job, path depth, window)
    ([1], 1, 1, None),
    ([31, 32, 33], 3, 4, None),
    ([5], 40, 6, None),  # more branch rows than a tile
    ([70], 0, 1, None),  # prefix only, over two key tiles
    ([45, 2], 5, 9, 8),  # sliding window shorter than the paths
    ([100], 4, 3, 40),  # window inside the prefix
    ([3, 64, 17], 12, 12, 16),
]


@pytest.mark.parametrize(("prefixes", "prompts", "depth", "window"), SHAPES)
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(4, 2, 32), (4, 1, 64), (16, 1, 32)])
def test_tree_attention_matches_the_torch_reference(prefixes, prompts, depth, window, heads, kv_heads, dim):
    rng = random.Random(len(prefixes) * 100 + prompts)
    jobs = [random_job(rng, p, prompts, depth) for p in prefixes]
    _, reference, got = run_both(jobs, heads, kv_heads, dim, window)
    assert torch.isfinite(got.float()).all()
    torch.testing.assert_close(got.float(), reference.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(("heads", "kv_heads"), [(16, 1), (8, 2)])
@pytest.mark.parametrize("config", [(32, 4, 32, 16, 4, 1), (16, 2, 16, 32, 4, 1)])
def test_a_program_can_take_part_of_a_kv_heads_group(heads, kv_heads, config):
    """With HG below the group size, a KV head's query heads are spread over several programs."""
    rng = random.Random(5)
    jobs = [random_job(rng, 40, 7, 6), random_job(rng, 9, 3, 3)]
    _, reference, got = run_both(jobs, heads, kv_heads, 32, 12, config=config)
    torch.testing.assert_close(got.float(), reference.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dim", [256, 512])
def test_tree_attention_at_the_12b_head_dims(dim):
    rng = random.Random(dim)
    jobs = [random_job(rng, 70, 6, 5), random_job(rng, 3, 2, 2)]
    _, reference, got = run_both(jobs, 4 if dim == 256 else 16, 2 if dim == 256 else 1, dim, None)
    torch.testing.assert_close(got.float(), reference.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(("kv_heads", "dim", "window"), [(16, 256, 24), (4, 512, None)])
def test_tree_attention_at_the_31b_head_dims_and_groups(kv_heads, dim, window):
    """The 31B's 32 query heads: 2 per KV head on its sliding layers, 8 per KV head (4 of them) on its full ones."""
    rng = random.Random(dim + kv_heads)
    jobs = [random_job(rng, 40, 5, 4), random_job(rng, 3, 2, 2)]
    _, reference, got = run_both(jobs, 32, kv_heads, dim, window)
    torch.testing.assert_close(got.float(), reference.float(), atol=2e-2, rtol=2e-2)


def test_a_rows_bits_do_not_depend_on_what_shares_the_pass():
    rng = random.Random(3)
    target = random_job(rng, 37, 6, 5)
    crowd = [random_job(rng, 50, 20, 7) for _ in range(2)]
    heads, kv_heads, dim = 4, 2, 32
    gen = torch.Generator().manual_seed(1)
    # the same q/k/v values for the target's rows, wherever the target sits
    rows = target.num_tokens
    tq, tk, tv = (torch.randn(rows, h, dim, generator=gen).to(ATTENTION_DTYPE) for h in (heads, kv_heads, kv_heads))

    def target_out(jobs, at):
        layout = build_pass(jobs)
        n = layout.num_tokens
        q, k, v = (torch.randn(n, h, dim).to(ATTENTION_DTYPE) for h in (heads, kv_heads, kv_heads))
        start = layout.spans[at][0]
        for full, part in ((q, tq), (k, tk), (v, tv)):
            full[start : start + rows] = part
        plan = kernels.kernel_plan(layout, DEVICE, [kernels.tile_rows(dim, heads // kv_heads)])
        out = kernels.tree_attention_kernel(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), plan, 16)
        return out[start : start + rows].cpu()

    alone = target_out([target], 0)
    assert torch.equal(alone, target_out([crowd[0], target, crowd[1]], 1))
    assert torch.equal(alone, target_out([crowd[1], crowd[0], target], 2))


def test_a_questions_bits_do_not_depend_on_its_siblings():
    """Per-question invariance inside a job: a prompt's rows get the same bits alone, among siblings that fork
    off its path at various depths, and after siblings that shift it to other tile offsets."""
    prefix = tuple(range(11, 11 + 29))
    target = [7, 8, 9, 30, 31, 32, 33, 34, 35, 36]
    siblings = [[7, 8, 9, 40, 41], [7, 8, 50], [7, 8, 9, 30, 31, 32, 60, 61, 62], [70] * 23, [7, 80, 81, 82]]
    heads, kv_heads, dim = 4, 2, 32

    def values(key, h):  # the same q/k/v for the same node (prefix position or token path), wherever it sits
        gen = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
        return torch.randn(h, dim, generator=gen).to(ATTENTION_DTYPE)

    def target_out(prompts):
        job = Job(prefix=prefix)
        for prompt in prompts:
            job.trie.insert(prompt)
        layout = build_pass([job])
        keys = [("p", i) for i in range(len(prefix))]
        keys += [("b", tuple(layout.token_ids[r] for r in path)) for path in layout.paths]
        q, k, v = (
            torch.stack([values((key, name), h) for key in keys])
            for name, h in (("q", heads), ("k", kv_heads), ("v", kv_heads))
        )
        plan = kernels.kernel_plan(layout, DEVICE, [kernels.tile_rows(dim, heads // kv_heads)])
        out = kernels.tree_attention_kernel(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), plan, 32).cpu()
        wanted = {tuple(target[: d + 1]) for d in range(len(target))}
        return {key: out[r] for r, key in enumerate(keys) if key[0] == "b" and key[1] in wanted}

    alone = target_out([target])
    for prompts in ([*siblings, target], [siblings[3], target, *siblings[:3]], [siblings[2], target]):
        crowd = target_out(prompts)
        assert alone.keys() == crowd.keys()
        for key, out in alone.items():
            assert torch.equal(out, crowd[key]), (key, (out - crowd[key]).abs().max().item())


def test_norm_rows_matches_rms_norm_and_the_quantizer():
    x = (torch.randn(37, 96) * 3).to(BF16)
    w = torch.rand(96) + 0.5
    reference = rms_norm(x, w, 1e-6)
    got = kernels.norm_rows(x.to(DEVICE), w.to(DEVICE), 1e-6).cpu()
    torch.testing.assert_close(got.float(), reference.float(), atol=1e-2, rtol=1e-2)
    unweighted = kernels.norm_rows(x.to(DEVICE), None, 1e-6).cpu()
    torch.testing.assert_close(unweighted.float(), rms_norm(x, None, 1e-6).float(), atol=1e-2, rtol=1e-2)


def test_add_norm_is_the_residual_update():
    h, y = (torch.randn(19, 64) * 4).to(BF16), (torch.randn(19, 64) * 9).to(BF16)
    w, scalar = torch.rand(64) + 0.5, torch.tensor([0.75])
    reference = (h + rms_norm(y, w, 1e-6)) * scalar.to(BF16)
    got = kernels.add_norm(h.to(DEVICE), y.to(DEVICE), w.to(DEVICE), 1e-6, scalar.to(DEVICE)).cpu()
    torch.testing.assert_close(got.float(), reference.float(), atol=2e-2, rtol=2e-2)  # a bf16 step or two


def test_add_norm_can_also_open_the_next_block():
    h, y = (torch.randn(7, 64) * 4).to(BF16).to(DEVICE), (torch.randn(7, 64) * 9).to(BF16).to(DEVICE)
    w, w_next, scalar = (torch.rand(64) + 0.5).to(DEVICE), (torch.rand(64) + 0.5).to(DEVICE), torch.tensor([0.5])
    plain = kernels.add_norm(h, y, w, 1e-6, scalar.to(DEVICE))
    fused, normed = kernels.add_norm(h, y, w, 1e-6, scalar.to(DEVICE), next_weight=w_next)
    assert torch.equal(fused, plain)
    assert torch.equal(normed, kernels.norm_rows(plain, w_next, 1e-6))


def test_gelu_mul_matches_torch_and_quantizes():
    gu = (torch.randn(9, 2 * 1500) * 2).to(BF16)  # more columns than one program handles
    gate, up = gu.chunk(2, dim=-1)
    reference = torch.nn.functional.gelu(gate, approximate="tanh") * up
    got = kernels.gelu_mul(gu.to(DEVICE)).cpu()
    torch.testing.assert_close(got.float(), reference.float(), atol=2e-2, rtol=2e-2)


# Triton's interpreter rounds to e4m3 wrongly (ties away from zero, and some values to the wrong binade), so the
# quantizing kernels are checked bit for bit on the GPU only.
@pytest.mark.gpu
def test_the_fused_quantizers_round_exactly_like_the_reference():
    x = (torch.randn(37, 96) * 3).to(BF16).to(DEVICE)
    w = (torch.rand(96) + 0.5).to(DEVICE)
    normed = kernels.norm_rows(x, w, 1e-6)
    quantized = kernels.norm_rows(x, w, 1e-6, scale=0.25)
    assert quantized.dtype == torch.float8_e4m3fn
    assert torch.equal(quantized.float(), quantize(normed, 0.25).float())  # quantized once, from the bf16 norm
    gu = (torch.randn(9, 2 * 1500) * 2).to(BF16).to(DEVICE)
    assert torch.equal(kernels.gelu_mul(gu, scale=0.5).float(), quantize(kernels.gelu_mul(gu), 0.5).float())
    h = (torch.randn(37, 96) * 3).to(BF16).to(DEVICE)
    _, quantized_next = kernels.add_norm(h, x, w, 1e-6, next_weight=w, next_scale=0.5)
    _, normed_next = kernels.add_norm(h, x, w, 1e-6, next_weight=w)
    assert torch.equal(quantized_next.float(), quantize(normed_next, 0.5).float())
    rng = random.Random(9)
    layout = build_pass([random_job(rng, 40, 5, 4), random_job(rng, 9, 3, 3)])
    n = layout.num_tokens
    q, k, v = (torch.randn(n, heads, 256, device=DEVICE).to(BF16) for heads in (4, 2, 2))
    plan = kernels.kernel_plan(layout, DEVICE, [kernels.tile_rows(256, 2)])
    plain = kernels.tree_attention_kernel(q, k, v, plan, 16)
    quantized = kernels.tree_attention_kernel(q, k, v, plan, 16, out_scale=0.25)
    assert torch.equal(quantized.float(), quantize(plain, 0.25).float())  # the o projection's input, in the kernel
    edge = torch.tensor([[1.0, -3000.0, 0.126, 500.0, -1.9375, 2.625, 1.0625]]).to(BF16).to(DEVICE)
    assert torch.equal(kernels.quantize_rows(edge, 2.0).float(), quantize(edge, 2.0).float())
    assert torch.equal(kernels.quantize_rows(edge, 1.0).float(), quantize(edge, 1.0).float())


@pytest.mark.parametrize("k_eq_v", [False, True])
def test_prepare_qkv_normalises_and_rotates_like_the_model(k_eq_v):
    heads, kv_heads, dim, n = 4, 2, 32, 11
    spec = LayerSpec(
        is_sliding=True, head_dim=dim, num_kv_heads=kv_heads, k_eq_v=k_eq_v, rope_theta=10_000.0, rope_fraction=0.5
    )
    sizes = (heads * dim, kv_heads * dim) if k_eq_v else (heads * dim, kv_heads * dim, kv_heads * dim)
    qkv = (torch.randn(n, sum(sizes)) * 3).to(BF16)
    positions = torch.tensor([0, 1, 2, 3, 4, 5, 6, 6, 7, 900, 5000])
    q_norm, k_norm = torch.rand(dim) + 0.5, torch.rand(dim) + 0.5
    inv = rope_inv_freq(spec)
    freqs = positions[:, None].float() * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(BF16), emb.sin().to(BF16)
    parts = qkv.split(sizes, dim=-1)
    raw_k = parts[1].view(n, -1, dim)
    expected = (
        apply_rope(rms_norm(parts[0].view(n, -1, dim), q_norm, 1e-6), cos, sin),
        apply_rope(rms_norm(raw_k, k_norm, 1e-6), cos, sin),
        rms_norm(raw_k if k_eq_v else parts[2].view(n, -1, dim), None, 1e-6),
    )
    got = kernels.prepare_qkv(
        qkv.to(DEVICE),
        positions.to(DEVICE, torch.int32),
        inv.to(DEVICE),
        kernels.qkv_norm_weights(q_norm, k_norm).to(DEVICE),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=dim,
        k_eq_v=k_eq_v,
        eps=1e-6,
    )
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g.cpu().float(), e.float(), atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("cap", [None, 30.0])
def test_softcap_logsumexp_matches_torch(cap):
    logits = torch.randn(5, 10_000) * 40  # not a multiple of the kernel's block
    capped = logits if cap is None else torch.tanh(logits / cap) * cap
    got = kernels.softcap_logsumexp(logits.to(DEVICE), cap).cpu()
    torch.testing.assert_close(got, torch.logsumexp(capped, dim=-1), atol=1e-4, rtol=1e-5)


def test_the_dynamic_quantizer_makes_each_rows_scale_and_rounds_int8_like_torch():
    """fp8row's and w8a8's per-row quantizer (and fp8's by a device scale), against spinf.engine.schemes' torch
    arithmetic: the scales and the int8 values bit for bit everywhere; the e4m3 values on the GPU only (above)."""
    from spinf.engine.schemes import quantize_tokens, tensor_scale

    x = (torch.randn(21, 5000) * torch.logspace(-3, 3, 21)[:, None]).to(BF16)  # wider than one 4096-column step
    x[4] = 0
    x[7] = (torch.rand(5000) * 200 - 100).to(BF16)
    x[7, :4] = torch.tensor([0.5, 1.5, -2.5, 127.0])  # amax 127: scale 1, so ties, which round to even
    for int8 in (True, False):
        got, got_scale = kernels.quantize_dynamic(x.to(DEVICE), int8=int8)
        want, want_scale = quantize_tokens(x, int8=int8)
        assert torch.equal(got_scale.cpu(), want_scale)
        if int8 or DEVICE.type == "cuda":
            assert torch.equal(got.cpu().float(), want.float())
        if int8:
            assert got[7, :4].tolist() == [0, 2, -2, 127]
    scale = tensor_scale(x).to(DEVICE)
    got, same = kernels.quantize_dynamic(x.to(DEVICE), scale=scale)
    assert same is scale and got.dtype == torch.float8_e4m3fn
    if DEVICE.type == "cuda":
        assert torch.equal(got.cpu().float(), quantize(x, scale.cpu()).float())
    assert kernels.quantize_dynamic(x[:0].to(DEVICE), int8=True)[0].shape == (0, 5000)
