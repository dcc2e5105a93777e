"""The Qwen3.5 row kernels' program sizes and warps, timed at the 27B's widths, each checked against the engine's.

Run on the GPU machine: ``python benchmarks/qwen_rows.py [--rows 16384] [--kernels conv,qk,gated,gate,silu,rope]``
(``--results [FILE]`` appends the table to benchmarks/RESULTS.md or FILE). ``--device cpu`` is the smoke run
under Triton's interpreter (``TRITON_INTERPRET=1``, a few rows): the settings and the bit checks, no times.

Each kernel is called through its public function in `spinf.engine.kernels.qwen_rows` (the convolution and the
q/k norms through ``gdn_inputs``, which runs the gates too) with the module's tile settings (``CONV_COLUMNS``,
``QK_WARPS``, …) set for the call and put back after it. Every setting's outputs are compared with those of the
engine's own settings, bit for bit: the elementwise kernels must give the same bits at any tile; a kernel with a
sum inside (the norms) may not, since Triton lays a sum out by the program's shape.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import RESULTS, append_section  # noqa: E402

KERNELS = ("conv", "qk", "gated", "gate", "silu", "rope")


@contextlib.contextmanager
def settings(values: dict[str, int]) -> Iterator[None]:
    """`spinf.engine.kernels.qwen_rows`'s module settings set to ``values`` inside the block."""
    from spinf.engine.kernels import qwen_rows

    before = {name: getattr(qwen_rows, name) for name in values}
    for name, value in values.items():
        setattr(qwen_rows, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(qwen_rows, name, value)


def cases(rows: int, device: torch.device) -> dict[str, tuple[Callable[[], object], list[dict[str, int]]]]:
    """Per kernel: a call at the 27B's widths on ``rows`` rows, and the settings to try."""
    from spinf.engine.kernels import qwen_rows as R

    gen = torch.Generator(device="cpu").manual_seed(0)
    bf = torch.bfloat16

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(bf).to(device)

    # the GDN input projection's rows: q, k (16 heads of 128 each), v (48 × 128), then z and b/a beyond
    channels, taps_n = 10240, 4
    projected = randn(rows, channels + 6144 + 96)
    conv = randn(channels, taps_n, scale=0.5)
    r = torch.arange(rows)[:, None]
    back = r - (taps_n - 1 - torch.arange(taps_n)[None, :])
    taps = torch.where(back >= 0, back + 1, 0).to(device)
    b, a = randn(rows, 48), randn(rows, 48)
    dt_bias, a_log = randn(48), randn(48, scale=0.1)

    def gdn() -> object:
        return R.gdn_inputs(
            projected[:, :channels], taps, conv, b, a, dt_bias, a_log, key_heads=16, value_heads=48, dk=128, dv=128
        )

    o, z, w = randn(rows, 48, 128), randn(rows, 6144 + 64)[:, 64:], randn(128)
    att, fused = randn(rows, 24, 256), randn(rows, 2 * 6144 + 2048)
    gate_up = randn(rows, 2 * 17408, scale=3.0)
    cos, sin = torch.randn(rows, 64, generator=gen).to(device), torch.randn(rows, 64, generator=gen).to(device)
    norm_weight = randn(256)
    warps = (1, 2, 4, 8)
    return {
        "conv": (gdn, [{"CONV_COLUMNS": c, "CONV_WARPS": n} for c in (256, 512, 1024, 2048) for n in warps]),
        "qk": (gdn, [{"QK_WARPS": n} for n in warps]),
        "gated": (
            lambda: R.gated_norm(o, z, w, 1e-6),
            [{"GATED_HEADS": h, "GATED_WARPS": n} for h in (2, 4, 8, 16) for n in (*warps, 16)],
        ),
        "gate": (
            lambda: R.sigmoid_mul(att, fused[:, 256:], 256, 512, blocks=True),
            [{"GATE_COLUMNS": c, "GATE_WARPS": n} for c in (256, 512, 1024, 2048) for n in warps],
        ),
        "silu": (
            lambda: R.silu_mul(gate_up, blocks=True),
            [{"QUANT_COLUMNS": c, "QUANT_WARPS": n} for c in (512, 1024, 2048) for n in warps],
        ),
        "rope": (
            lambda: R.qk_rope(fused, 24, 512, 256, norm_weight, cos, sin, 1e-6, 0.0625),
            [{"ROPE_HEADS": h, "ROPE_WARPS": n} for h in (1, 2, 4, 8) for n in (*warps, 16)],
        ),
    }


def tensors(result: object) -> list[torch.Tensor]:
    return list(result) if isinstance(result, tuple) else [result]


def timed_ms(call: Callable[[], object], device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    from benchmarks.gpu_probe import timed

    return timed(call, 20) * 1e3


def sweep(kernels: list[str], rows: int, device: torch.device) -> list[str]:
    """The table's lines: per kernel, the engine's settings, then every setting tried, its time and its bits."""
    from spinf.engine.kernels import qwen_rows

    lines = ["| kernel | settings | time (ms) | bits against the engine's settings |", "|---|---|---|---|"]
    table = cases(rows, device)
    for name in kernels:
        call, tries = table[name]
        want = [t.clone() for t in tensors(call())]
        engine = {key: getattr(qwen_rows, key) for key in tries[0]}
        tries = [engine] + [t for t in tries if t != engine]
        for values in tries:
            label = ", ".join(f"{key} {value}" for key, value in values.items())
            if values is engine:
                label += " (the engine's)"
            try:
                with settings(values):
                    got = tensors(call())
                    ms = timed_ms(call, device)
            except Exception as exc:  # noqa: BLE001 - a setting that does not compile is a line, not the end
                lines.append(f"| {name} | {label} | failed: {type(exc).__name__} | |")
                continue
            same = len(got) == len(want) and all(torch.equal(g, x) for g, x in zip(got, want, strict=True))
            time = "–" if ms is None else f"{ms:.3f}"
            lines.append(f"| {name} | {label} | {time} | {'same' if same else 'DIFFER'} |")
            print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=None, help="rows per call (16,384 on a GPU, 4 on the CPU)")
    p.add_argument("--kernels", default=",".join(KERNELS), help=f"of {','.join(KERNELS)}")
    p.add_argument("--device", default="cuda")
    p.add_argument("--results", nargs="?", const=str(RESULTS), default=None, help="append the table here")
    args = p.parse_args(argv)
    kernels = [k for k in args.kernels.split(",") if k]
    if unknown := sorted(set(kernels) - set(KERNELS)):
        p.error(f"unknown kernels {unknown}; these exist: {', '.join(KERNELS)}")
    device = torch.device(args.device)
    rows = args.rows or (16384 if device.type == "cuda" else 4)
    lines = sweep(kernels, rows, device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "the CPU (Triton's interpreter)"
    head = f"`python benchmarks/qwen_rows.py --rows {rows} --kernels {','.join(kernels)}` on {where}"
    print(head)
    if args.results:
        title = f"Qwen3.5 row kernels: program sizes and warps at {rows:,} rows"
        append_section(title, head + "\n\n" + "\n".join(lines), Path(args.results))


if __name__ == "__main__":
    main()
