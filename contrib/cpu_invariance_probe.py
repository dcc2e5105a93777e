"""Probe whether the CPU primitives the engine uses give row results independent of the other rows.

Usage: ``python contrib/cpu_invariance_probe.py [threads]``. Run it on a new machine or torch build before
trusting the CPU path's bitwise invariance; each line prints True when results are bitwise the same whatever the
neighbouring rows, the row count and (for elementwise ops) the element's offset in the tensor.
"""

import sys

import torch
import torch.nn.functional as F

from spinf.engine.gemm import row_stable_mm
from spinf.engine.norm import rms_norm


def same_rows(fn, a: torch.Tensor, b: torch.Tensor, keep: int) -> bool:
    """Do ``fn(a)`` and ``fn(b)`` agree on the first ``keep`` rows, which ``b`` copies from ``a``?"""
    b = b.clone()
    b[:keep] = a[:keep]
    return torch.equal(fn(a)[:keep], fn(b)[:keep])


def offset_free(fn, x: torch.Tensor, width: int = 128) -> bool:
    """Does an elementwise ``fn`` give a row of ``width`` elements the same result in any row of a tensor of such
    rows (the engine's case: activations ``[rows, width]`` with widths that are multiples of 32)?"""
    ref = fn(x)
    shifted = all(torch.equal(fn(torch.cat([x.new_zeros(s * width), x]))[s * width :], ref) for s in range(1, 40))
    rows = x.numel() // width
    return shifted and all(torch.equal(fn(x[: n * width]), ref[: n * width]) for n in (rows - 7, rows // 2 + 1, 1))


def main() -> None:
    if len(sys.argv) > 1:
        torch.set_num_threads(int(sys.argv[1]))
    torch.manual_seed(0)
    print("threads", torch.get_num_threads(), "torch", torch.__version__)
    for k, n in [(64, 256), (64, 320), (128, 64), (256, 64), (64, 8192)]:
        w = torch.randn(n, k)
        ok = all(
            same_rows(lambda x, w=w: row_stable_mm(x, w), torch.randn(r, k), torch.randn(r, k), 5) for r in (7, 300)
        )
        print(f"row_stable_mm {k}x{n}", ok)
    w = torch.rand(64)
    print("rms_norm", same_rows(lambda x: rms_norm(x, w, 1e-6), torch.randn(3000, 64), torch.randn(3000, 64), 5))
    print(
        "log_softmax", same_rows(lambda x: torch.log_softmax(x, -1), torch.randn(256, 8192), torch.randn(256, 8192), 3)
    )
    x = torch.randn(1000 * 128) * 3
    for name, fn in [
        ("exp", torch.exp),
        ("tanh", torch.tanh),
        ("cos", torch.cos),
        ("gelu", lambda t: F.gelu(t, approximate="tanh")),
    ]:
        print(f"{name} by row", offset_free(fn, x))


if __name__ == "__main__":
    main()
