"""Issue 36: our fp8 GEMM (`spinf.engine.kernels.gemm`) against cuBLAS's ``_scaled_mm`` at the 12B's shapes.

Run on the GPU machine: ``python benchmarks/gemm_probe.py [--rows 16384,768] [--json FILE]``. For each of the
decoder's four fp8 shapes (out × in) and row count: cuBLAS's time and TFLOP/s, then ours in every tile configuration
of ``--configs`` (plain, bf16 out) with the share of its bf16 results bit-equal to cuBLAS's; for the gate/up shape
also cuBLAS followed by the `gelu_mul` kernel (what a pass runs today) against our fused GLU (e4m3 out), and whether
our rows keep their bits when the same rows run alone. The fp8 ``_scaled_mm`` peak (8,192³) is measured first: every
TFLOP/s is also shown as a share of it. Nothing is written to RESULTS.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spinf.engine.kernels import gemm  # noqa: E402
from spinf.engine.kernels.rows import gelu_mul  # noqa: E402

SHAPES = ((30_720, 3_840), (3_840, 15_360), (8_192, 3_840), (3_840, 4_096))  # the 12B's (gate/up first)
PLAIN = (
    (128, 256, 128, 8, 3, 8, False),
    (128, 256, 128, 8, 4, 8, False),
    (128, 256, 128, 8, 3, 8, True),
    (128, 128, 128, 8, 4, 8, False),
    (256, 128, 128, 8, 3, 8, False),
    (128, 256, 64, 8, 4, 8, False),
)
GLU = (
    (128, 128, 128, 8, 3, 8, False),
    (128, 128, 128, 8, 4, 8, False),
    (128, 128, 128, 8, 3, 8, True),
    (128, 128, 64, 8, 4, 8, False),
    (128, 64, 128, 8, 4, 4, False),
    (64, 128, 128, 8, 4, 4, False),
)


def timed(fn, repeats: int = 20) -> float:
    """Median milliseconds of ``fn`` over ``repeats`` launches, after three warm ones."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def peak_tflops() -> float:
    n = 8_192
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    one = torch.tensor(1.0, device="cuda")
    ms = timed(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    return 2 * n**3 / ms / 1e9


def equal_share(a: torch.Tensor, b: torch.Tensor) -> float:
    view = torch.int16 if a.dtype == torch.bfloat16 else torch.uint8
    return float((a.view(view) == b.view(view)).float().mean())


def probe(rows: int, n: int, k: int, peak: float, out: list, configs) -> None:
    x = torch.randn(rows, k, device="cuda").to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.float8_e4m3fn)
    # per output row of the weight (gate's and up's differ), times the input's static scale: the row-wise product
    # with a column of ones for the rows, as `spinf.engine.quant.fp8_matmul` runs a fused weight
    scale = torch.cat([torch.full((n // 2,), 0.5 * 0.03), torch.full((n - n // 2,), 0.5 * 0.02)]).cuda()
    ones = torch.ones((rows, 1), device="cuda")
    flops = 2 * rows * n * k

    def cublas():
        return torch._scaled_mm(x, w.t(), scale_a=ones, scale_b=scale[None, :], out_dtype=torch.bfloat16)

    ref = cublas()
    line = {"rows": rows, "shape": f"{n}x{k}", "runner": "cublas", "ms": timed(cublas)}
    out.append(line)
    report(line, flops, peak)
    for tiles in configs["plain"]:
        try:
            mine = gemm.fp8_gemm(x, w, scale, tiles=tiles)
            line = {
                "rows": rows,
                "shape": f"{n}x{k}",
                "runner": f"ours {tiles}",
                "ms": timed(functools.partial(gemm.fp8_gemm, x, w, scale, tiles=tiles)),
            }
            line["equal_bits"] = equal_share(mine, ref)
        except Exception as exc:  # a configuration the compiler refuses (shared memory) is reported, not fatal
            line = {"rows": rows, "shape": f"{n}x{k}", "runner": f"ours {tiles}", "error": repr(exc)[:200]}
        out.append(line)
        report(line, flops, peak)
    if n != SHAPES[0][0]:
        return
    out_scale = 0.25
    today = gelu_mul(ref, out_scale)
    line = {
        "rows": rows,
        "shape": f"{n}x{k}",
        "runner": "cublas + gelu_mul",
        "ms": timed(lambda: gelu_mul(cublas(), out_scale)),
    }
    out.append(line)
    report(line, flops, peak)
    for tiles in configs["glu"]:
        try:
            mine = gemm.fp8_gemm(x, w, scale, glu=True, out_scale=out_scale, tiles=tiles)

            run = functools.partial(gemm.fp8_gemm, x, w, scale, glu=True, out_scale=out_scale, tiles=tiles)
            line = {"rows": rows, "shape": f"{n}x{k}", "runner": f"ours GLU {tiles}", "ms": timed(run)}
            line["equal_bits"] = equal_share(mine, today)
            few = min(rows, 700)
            alone = gemm.fp8_gemm(x[:few].contiguous(), w, scale, glu=True, out_scale=out_scale, tiles=tiles)
            one = gemm.fp8_gemm(x[:1].contiguous(), w, scale, glu=True, out_scale=out_scale, tiles=tiles)
            line["rows_invariant"] = bool(torch.equal(alone.view(torch.uint8), mine[:few].view(torch.uint8))) and bool(
                torch.equal(one.view(torch.uint8), mine[:1].view(torch.uint8))
            )
        except Exception as exc:
            line = {"rows": rows, "shape": f"{n}x{k}", "runner": f"ours GLU {tiles}", "error": repr(exc)[:200]}
        out.append(line)
        report(line, flops, peak)


def report(line: dict, flops: float, peak: float) -> None:
    if "ms" in line:
        tflops = flops / line["ms"] / 1e9
        line["tflops"] = tflops
        extra = "".join(f" {key}={line[key]}" for key in ("equal_bits", "rows_invariant") if key in line)
        head = f"{line['rows']:>6} {line['shape']:>12} {line['ms']:8.3f} ms {tflops:7.0f} TFLOP/s {tflops / peak:6.1%}"
        print(f"{head}  {line['runner']}{extra}", flush=True)
    else:
        print(f"{line['rows']:>6} {line['shape']:>12} failed: {line['runner']}: {line['error']}", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="16384,768")
    p.add_argument("--shapes", default="all", help="'all' or 'glu' (the gate/up shape only)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gemm_probe.py times fp8 GEMMs on a CUDA device (Hopper or later): none is seen")
    peak = peak_tflops()
    print(f"fp8 _scaled_mm peak (8192³): {peak:.0f} TFLOP/s on {torch.cuda.get_device_name()}", flush=True)
    out: list = [{"peak_tflops": peak, "device": torch.cuda.get_device_name()}]
    shapes = SHAPES if args.shapes == "all" else SHAPES[:1]
    for rows in (int(r) for r in args.rows.split(",")):
        for n, k in shapes:
            probe(rows, n, k, peak, out, {"plain": PLAIN, "glu": GLU})
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
