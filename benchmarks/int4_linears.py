"""Where an i8 linear's time goes at the 27B's shapes, and which tiles to run (issue 17, engine spec B.14.3).

    python benchmarks/int4_linears.py [--out FILE] [--rows 16,64,128,256,512,2048,16384] [--ptx]

On a GPU, for each of the 27B's int4 linears (random packed weights, the outlier channels of the split scheme where
it applies) and each row count: the one-pass activation quantizer, the unpacking kernel, the int8 product over an
unpacked weight at several tiles and at the one the engine picks (`product_tile`), and the whole
forward as the engine runs it (weight unpacked per call, or kept unpacked), against a bf16 GEMM and
``torch._int_mm`` of the same shape. Every tile's result is compared bit for bit with the default tile's (a tile must
not change a bit). Prints a markdown table, and writes it to ``--out``; ``--ptx`` adds the tensor-core instructions
each compiled kernel uses (wgmma or mma.sync), its registers and spills.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.gpu_probe import timed
from spinf.engine.kernels.int4 import Tile, int8_mm, product_tile
from spinf.engine.qwen35.gptq import GROUP, Int4Weight
from spinf.engine.qwen35.int4 import Int4Linear

# the 27B's int4 linears: name, outputs, inputs, split scheme (norm-fed)
SHAPES = (
    ("GDN in_proj qkv+z", 16_384, 5120, True),
    ("attention q/k/v", 14_336, 5120, True),
    ("MLP gate+up", 34_816, 5120, True),
    ("GDN out / attention o", 5120, 6144, False),
    ("MLP down", 5120, 17_408, False),
)
PRODUCT_TILES = (
    Tile(64, 64, 4, 4),
    Tile(64, 128, 4, 5),
    Tile(128, 256, 8, 4),
    Tile(128, 128, 8, 3),
    Tile(128, 256, 8, 3),
    Tile(128, 128, 4, 4),
    Tile(64, 128, 4, 4),
    Tile(128, 64, 4, 4),
    Tile(256, 128, 8, 3),
    # persistent programs over grouped tiles, TMA reads (`Tile.persistent`)
    Tile(128, 256, 8, 3, persistent=True),
    Tile(128, 256, 8, 4, persistent=True),
    Tile(128, 128, 8, 4, persistent=True),
    Tile(128, 128, 4, 4, persistent=True),
    Tile(64, 128, 4, 4, persistent=True),
    Tile(128, 64, 4, 4, persistent=True),
    Tile(256, 128, 8, 3, persistent=True),
    Tile(128, 256, 8, 3, persistent=True, group=16),
    Tile(64, 128, 4, 3, persistent=True, per_sm=2),
    Tile(128, 128, 8, 4, persistent=True, per_sm=2),
)


def linear(out: int, width: int, split: bool, device: torch.device) -> Int4Linear:
    gen = torch.Generator(device=device).manual_seed(out + width)
    q = torch.randint(0, 256, (out, width // 2), generator=gen, device=device, dtype=torch.int32).to(torch.uint8)
    scales = (torch.rand((out, width // GROUP), generator=gen, device=device) / 300 + 1e-3).half()
    return Int4Linear([Int4Weight(q, scales)], "i8", list(range(3, 64 * 80, 80)) if split else None)


def label(tile: Tile) -> str:
    persistent = f" p g{tile.group}" + (f" ×{tile.per_sm}/SM" if tile.per_sm > 1 else "") if tile.persistent else ""
    return f"{tile.rows}×{tile.cols} w{tile.warps} s{tile.stages}{persistent}"


def probe(rows: list[int]) -> list[str]:
    device = torch.device("cuda")
    lines = [
        "| linear | rows | quantize | unpack | product, best tile | product, the engine's tile "
        "| forward (unpacked per call) | forward (kept int8) | bf16 GEMM | _int_mm | bits over the tiles |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    tiles_seen: list[str] = []
    for name, out, width, split in SHAPES:
        lines += shape_lines(name, out, width, split, rows, device, tiles_seen)
        torch.cuda.empty_cache()
    return lines + ["", "Every tile, ms:", "", *tiles_seen]


def shape_lines(name, out, width, split, rows, device, tiles_seen) -> list[str]:
    lines = []
    lin = linear(out, width, split, device)
    dense = torch.randn((out, width), device=device, dtype=torch.bfloat16)
    wq = lin._gpu_weight(int8=True)
    unpack = timed(lambda: lin._gpu_weight(int8=True), 10)
    ms = lambda t: f"{1000 * t:.3f} ms"  # noqa: E731
    for m in rows:
        x = torch.randn((m, width), device=device).bfloat16()
        xq, x_scale, scheme = lin.gpu_quantized(x)
        t_quant = timed(lambda x=x: lin.gpu_quantized(x), 10)
        want = int8_mm(xq, x_scale, wq, lin.w_scale, torch.bfloat16, **scheme)  # at the engine's tile
        same, times = True, {}
        for tile in PRODUCT_TILES:
            fn = lambda tile=tile, xq=xq, x_scale=x_scale, scheme=scheme: int8_mm(  # noqa: E731
                xq, x_scale, wq, lin.w_scale, torch.bfloat16, tile=tile, **scheme
            )
            same &= torch.equal(fn(), want)
            times[label(tile)] = timed(fn, 10)
        pick = min(times, key=times.get)
        engine_tile = label(product_tile(m, not split))
        tiles_seen.append(f"- {name}, {m} rows: " + ", ".join(f"{k} {1000 * v:.3f}" for k, v in times.items()))
        forward = timed(lambda x=x: lin(x), 10)
        lin.int8 = wq
        kept = timed(lambda x=x: lin(x), 10)
        lin.int8 = None
        bf16 = timed(lambda x=x: x @ dense.t(), 10)
        xq32 = xq if m >= 32 else torch.cat([xq, xq.new_zeros((32 - m, width))])
        int_mm = timed(lambda xq32=xq32: torch._int_mm(xq32, wq.t()), 10)
        cells = [
            ms(t_quant),
            ms(unpack),
            f"{ms(times[pick])} ({pick})",
            f"{ms(times[engine_tile])} ({engine_tile})",
            ms(forward),
            ms(kept),
            ms(bf16),
            ms(int_mm),
            "same" if same else "DIFFER",
        ]
        line = f"| {name}, {out} × {width} | {m} | " + " | ".join(cells) + " |"
        print(line, flush=True)
        lines.append(line)
    return lines


def mma_lines() -> list[str]:
    """The tensor-core instructions in the PTX of every product kernel compiled so far (wgmma on Hopper, or
    mma.sync), with registers and spills: one line per compiled specialization."""
    from spinf.engine.kernels import int4 as kernels

    lines = []
    for name, kernel in (("pointer", kernels._int8_kernel), ("persistent TMA", kernels._int8_tma_kernel)):
        for cache in kernel.device_caches.values():
            for compiled in cache[0].values():
                ops = sorted(set(re.findall(r"\b(wgmma\.mma_async[\w.]*|mma\.sync[\w.]*)", compiled.asm["ptx"])))
                regs, spills = getattr(compiled, "n_regs", "?"), getattr(compiled, "n_spills", "?")
                lines.append(f"- {name}: {', '.join(ops) or 'no MMA'}; {regs} registers, {spills} spills")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rows", default="16,64,128,256,512,2048,16384")
    parser.add_argument("--ptx", action="store_true", help="also list the MMA instructions the kernels compiled to")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("int4_linears.py times GPU kernels: no CUDA device here")
    lines = probe([int(r) for r in args.rows.split(",")])
    if args.ptx:
        mma = mma_lines()
        print("\n".join(mma), flush=True)
        lines += ["", "Tensor-core instructions:", "", *mma]
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
