"""The row-invariance probe of benchmarks/schemes.py: each Gemma scheme's GEMM at the 12B's linear shapes.

For every shape (q/k/v and gate/up fused as the engine fuses them) and every product, the row counts M at which some
row of the product of ``x[o : o + M]`` differs in any bit from the same row of the product of all of ``x`` (8,192
rows), as benchmarks/gpu_probe.py measures the per-tensor fp8 product. The products are the engine's own functions
(`spinf.engine.quant.fp8_matmul`, `spinf.engine.schemes`), so the probe measures what the engine runs:

* fp8s, per-tensor weight scale (an unfused linear; the H200 measured it invariant);
* fp8s, per-row weight scales (a fused linear whose projections keep their own scales, from an fp8-static
  checkpoint or quantized at load): the row-wise ``_scaled_mm``;
* the fallback for the latter, should it not be invariant: the per-tensor ``_scaled_mm`` with fp32 output, then the
  per-row scales and the cast to bf16 (one rounding of ``sum · x_scale · w_scale`` either way; GPU only);
* fp8row, w8a16 and w8a8 as the schemes run them (w8a8's int32 sums are exact, so only its padding below 17 rows
  and its epilogue could move a row), and bf16 (the engine pads it to 512 rows).

Then each product's time on 16,384 rows of the gate/up shape, its input's quantization included (fp8s's by the
Triton quantizer the fused path runs). On the CPU the same code runs the emulations on small shapes.
"""

from __future__ import annotations

import time

import torch

from spinf.engine.gemm import gpu_mm, row_stable_mm
from spinf.engine.quant import Fp8Weight, activation_scale, fp8_matmul, quantize
from spinf.engine.schemes import SCHEMES, Int8Weight, fp8_per_row

HIDDEN = 3840
# (name, in, the output rows of each fused part) of the 12B's decoder linears; full layers: k doubles as v
SHAPES_12B = [
    ("qkv sliding", HIDDEN, (16 * 256, 8 * 256, 8 * 256)),
    ("qk full", HIDDEN, (16 * 512, 512)),
    ("o sliding", 16 * 256, (HIDDEN,)),
    ("o full", 16 * 512, (HIDDEN,)),
    ("gate_up", HIDDEN, (15360, 15360)),
    ("down", 15360, (HIDDEN,)),
]
SHAPES_SMALL = [("qkv", 64, (128, 32, 32)), ("o", 128, (64,)), ("gate_up", 64, (128, 128)), ("down", 128, (64,))]
ROWS = [1, 2, 3, 5, 16, 17, 64, 100, 129, 384, 1000, 1024, 4097]
OFFSETS = [0, 3, 128, 1000]
FULL = 8192
COLUMNS = ["fp8s per-tensor", "fp8s per-row", "fp8s per-row, fallback", "fp8row", "w8a16", "w8a8", "bf16"]
BF16 = torch.bfloat16


def per_row_fallback(xq: torch.Tensor, weight: Fp8Weight, x_scale: float) -> torch.Tensor:
    """fp8s with per-row weight scales through the per-tensor ``_scaled_mm``: fp32 ``sum · x_scale`` (exact: a
    power of two), times the row scales, then bf16."""
    scale_a, one = (torch.tensor(value, dtype=torch.float32, device=xq.device) for value in (x_scale, 1.0))
    sums = torch._scaled_mm(xq, weight.data.t(), scale_a=scale_a, scale_b=one, out_dtype=torch.float32)
    return (sums * weight.scale[None, :]).to(BF16)


def products(weight: torch.Tensor, sizes: tuple[int, ...], x_scale: float, cuda: bool) -> dict:
    """Each column's product as a function of bf16 input rows (None: not run for this shape)."""
    tensor, rows = Fp8Weight.from_float(weight), Fp8Weight.from_float(weight, sizes)
    fused = len(sizes) > 1
    quantizer = _fused_quantizer(cuda)
    int8, e4m3_rows, plain = Int8Weight.from_float(weight), fp8_per_row(weight), weight.to(BF16)
    return {
        "fp8s per-tensor": lambda t: fp8_matmul(quantizer(t, x_scale), tensor, x_scale),
        "fp8s per-row": (lambda t: fp8_matmul(quantizer(t, x_scale), rows, x_scale)) if fused else None,
        "fp8s per-row, fallback": (lambda t: per_row_fallback(quantizer(t, x_scale), rows, x_scale))
        if fused and cuda
        else None,
        "fp8row": lambda t: SCHEMES["fp8row"].linear(t, e4m3_rows, BF16),
        "w8a16": lambda t: SCHEMES["w8a16"].linear(t, int8, BF16),
        "w8a8": lambda t: SCHEMES["w8a8"].linear(t, int8, BF16),
        "bf16": (lambda t: gpu_mm(t, plain)) if cuda else (lambda t: row_stable_mm(t, plain)),
    }


def _fused_quantizer(cuda: bool):
    if not cuda:
        return quantize
    from spinf.engine.kernels import quantize_rows

    return quantize_rows


def variant_rows(product, x: torch.Tensor, rows_list: list[int], offsets: list[int]) -> list[int]:
    full = product(x)
    bad = []
    for rows in rows_list:
        starts = [o for o in offsets if o + rows <= x.shape[0]]
        if any(not torch.equal(product(x[o : o + rows]), full[o : o + rows]) for o in starts):
            bad.append(rows)
    return bad


def seconds_of(fn, cuda: bool, repeats: int = 10) -> float:
    if cuda:
        from benchmarks.gpu_probe import timed

        return timed(fn, repeats)
    fn()
    started = time.perf_counter()
    for _ in range(3):
        fn()
    return (time.perf_counter() - started) / 3


def probe_lines(device: torch.device, *, small: bool = False) -> list[str]:
    """The probe's two tables as Markdown lines."""
    cuda = device.type == "cuda"
    shapes, full = (SHAPES_SMALL, 512) if small else (SHAPES_12B, FULL)
    rows_list = [r for r in ROWS if r < full]
    gen = torch.Generator(device=device).manual_seed(0)
    lines = ["| linear | in x out | " + " | ".join(COLUMNS) + " |", "|---|---|" + "---|" * len(COLUMNS)]
    timing_shape = None
    for name, k, sizes in shapes:
        n = sum(sizes)
        x = torch.randn(full, k, device=device, generator=gen).to(BF16)
        parts = [torch.randn(rows, k, device=device, generator=gen) / k**0.5 * 2.0**i for i, rows in enumerate(sizes)]
        weight = torch.cat(parts)  # each projection at another scale, as q, k and v are
        x_scale = activation_scale(float(x.float().abs().max()))
        found = []
        for product in products(weight, sizes, x_scale, cuda).values():
            if product is None:
                found.append("–")
                continue
            bad = variant_rows(product, x, rows_list, OFFSETS)
            found.append(", ".join(map(str, bad)) if bad else "none")
        lines.append(f"| {name} | {k} x {n} | " + " | ".join(found) + " |")
        if name == "gate_up":
            timing_shape = (k, weight, sizes, x_scale)
        del x, weight, parts
    if timing_shape is not None:
        lines += ["", *timing_lines(device, *timing_shape, rows=512 if small else 16384)]
    return lines


def timing_lines(device, k: int, weight: torch.Tensor, sizes, x_scale: float, *, rows: int) -> list[str]:
    cuda = device.type == "cuda"
    x = torch.randn(rows, k, device=device).to(BF16)
    flops = 2 * rows * k * weight.shape[0]
    out = [f"| product of {rows:,} rows, {k} → {weight.shape[0]} | time | TFLOP/s |", "|---|---|---|"]
    for column, product in products(weight, sizes, x_scale, cuda).items():
        if product is None:
            continue
        seconds = seconds_of(lambda product=product: product(x), cuda)
        out.append(f"| {column} | {seconds * 1000:.3f} ms | {flops / seconds / 1e12:.0f} |")
    return out
