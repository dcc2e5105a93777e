"""GPU facts the fast path is designed on: GEMM peaks and per-row invariance of the 12B shapes (engine spec B.19).

Run on the GPU machine: ``python benchmarks/gpu_probe.py`` (appends a section to benchmarks/RESULTS.md; where the
working tree has no git history, ``GIT_SHA`` names the revision).
Measures the fp8 ``_scaled_mm`` peak at 16384 x 3840 x 15360 (the MFU denominator), the same product in bf16, and
whether each 12B projection's rows are bit-identical whatever the row count M and the row's offset (fp8 with
per-tensor scales and bf16 output; bf16; the LM head in bf16 with fp32 output).
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path

import torch

HIDDEN = 3840
# (name, in, out) of the 12B's decoder linears with q/k/v and gate/up fused; full layers: k doubles as v
SHAPES = [
    ("qkv sliding", HIDDEN, 16 * 256 + 2 * 8 * 256),
    ("qk full", HIDDEN, 16 * 512 + 512),
    ("o sliding", 16 * 256, HIDDEN),
    ("o full", 16 * 512, HIDDEN),
    ("gate_up", HIDDEN, 2 * 15360),
    ("down", 15360, HIDDEN),
]
ROWS = [1, 2, 3, 5, 16, 17, 64, 100, 129, 384, 1000, 1024, 4097]
OFFSETS = [0, 3, 128, 1000]
FULL = 8192


def timed(fn, repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats / 1000


def fp8(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-448, 448).to(torch.float8_e4m3fn)


def peaks() -> dict[str, float]:
    m, k, n = 16384, 3840, 15360
    a, b = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
    a8, b8 = fp8(a), fp8(b).t()
    one = torch.ones((), device="cuda")
    flops = 2 * m * k * n
    fp8_s = timed(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    a16, b16 = a.bfloat16(), b.bfloat16().t()
    bf16_s = timed(lambda: a16 @ b16)
    return {"fp8 TFLOP/s": flops / fp8_s / 1e12, "bf16 TFLOP/s": flops / bf16_s / 1e12}


def first_variant_rows(product, x: torch.Tensor) -> list[int]:
    """Row counts M at which some row of ``product(x[o:o+M])`` differs from the same row of the full product."""
    full = product(x)
    bad = []
    for rows in ROWS:
        if any(not torch.equal(product(x[o : o + rows]), full[o : o + rows]) for o in OFFSETS if o + rows <= FULL):
            bad.append(rows)
    return bad


def invariance() -> list[str]:
    lines = []
    one = torch.ones((), device="cuda")
    for name, k, n in SHAPES:
        x = torch.randn(FULL, k, device="cuda")
        w = torch.randn(n, k, device="cuda") / k**0.5
        x8, w8 = fp8(x), fp8(w).t()
        bad8 = first_variant_rows(
            lambda t, w8=w8: torch._scaled_mm(t, w8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), x8
        )
        w16 = w.bfloat16().t()
        bad16 = first_variant_rows(lambda t, w16=w16: t @ w16, x.bfloat16())
        lines.append(f"| {name} | {k} x {n} | {bad8 or 'none'} | {bad16 or 'none'} |")
    head = torch.randn(262_144, HIDDEN, device="cuda", dtype=torch.bfloat16) / HIDDEN**0.5
    x = torch.randn(4096, HIDDEN, device="cuda", dtype=torch.bfloat16)
    bad = first_variant_rows(lambda t: torch.mm(t, head.t(), out_dtype=torch.float32), x)
    lines.append(f"| LM head (bf16, fp32 out) | {HIDDEN} x 262144 | – | {bad or 'none'} |")
    return lines


def main() -> None:
    torch.manual_seed(0)
    found = peaks()
    table = invariance()
    revision = (
        os.environ.get("GIT_SHA")
        or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    )
    text = "\n".join(
        [
            f"\n## GPU facts — {datetime.date.today().isoformat()}, revision {revision or 'unknown'}\n",
            f"- command: `python benchmarks/gpu_probe.py`; GPU: {torch.cuda.get_device_name()}, "
            f"torch {torch.__version__}, CUDA {torch.version.cuda}, Python {sys.version.split()[0]}",
            f"- 16384 x 3840 x 15360 product: fp8 `_scaled_mm` {found['fp8 TFLOP/s']:.0f} TFLOP/s, "
            f"bf16 {found['bf16 TFLOP/s']:.0f} TFLOP/s (median of 20 after 3 warm-ups, random data)",
            "- rows differing from the same rows of an 8192-row product, by row count M (offsets 0, 3, 128, 1000):\n",
            "| linear | in x out | fp8 (per-tensor scales, bf16 out) | bf16 |",
            "|---|---|---|---|",
            *table,
        ]
    )
    with Path(__file__).with_name("RESULTS.md").open("a") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
