"""Probe which CPU primitives give row results that depend on the other rows (run on a new machine or torch).

Usage: ``python contrib/cpu_invariance_probe.py``. Prints one line per primitive: True when a row's result is
bitwise the same whatever the other rows, their number and the row's position.
"""

import torch

from spinf.engine.model import row_stable_mm, rms_norm


def same_rows(fn, make, rows_a, rows_b, keep):
    """fn on two inputs that share their first ``keep`` rows; are those rows' outputs bitwise equal?"""
    a = make(rows_a)
    b = make(rows_b)
    b[:keep] = a[:keep]
    return torch.equal(fn(a)[:keep], fn(b)[:keep])


def main():
    torch.manual_seed(0)
    print("threads", torch.get_num_threads(), "torch", torch.__version__)
    for k, n in [(64, 256), (64, 320), (128, 64), (256, 64), (64, 8192)]:
        w = torch.randn(n, k)
        ok = all(
            same_rows(lambda x: row_stable_mm(x, w), lambda r: torch.randn(r, k), ra, rb, 5)
            for ra, rb in [(7, 300), (130, 700), (128, 129)]
        )
        print(f"row_stable_mm {k}x{n}", ok)
    for p in [37, 200]:
        kk = torch.randn(2, 32, p)
        ok = all(
            same_rows(
                lambda q: torch.bmm(q.transpose(0, 1), kk).transpose(0, 1),
                lambda r: torch.randn(r, 2, 32),
                128,
                128,
                keep,
            )
            for keep in [3, 100]
        )
        vv = torch.randn(2, p, 32)
        ok2 = all(
            same_rows(
                lambda q: torch.bmm(q.transpose(0, 1), vv).transpose(0, 1),
                lambda r: torch.rand(r, 2, p),
                128,
                128,
                keep,
            )
            for keep in [3, 100]
        )
        print(f"bmm scores P={p}", ok, f"bmm values P={p}", ok2)
    for d in [5, 40]:
        ok = same_rows(lambda x: x.sum(-1), lambda r: torch.randn(r, d, 2, 2, 32), 64, 64, 10)
        okc = same_rows(lambda x: torch.cumsum(x, -1)[..., -1], lambda r: torch.rand(r, 2, 2, 32, d), 64, 64, 10)
        print(f"sum over d D={d}", ok, f"cumsum D={d}", okc)
    w = torch.rand(64)
    print(
        "rms_norm",
        all(
            same_rows(lambda x: rms_norm(x, w, 1e-6), lambda r: torch.randn(r, 64), ra, rb, 5)
            for ra, rb in [(7, 3000), (300, 20000)]
        ),
    )
    print(
        "log_softmax",
        all(
            same_rows(lambda x: torch.log_softmax(x, -1), lambda r: torch.randn(r, 8192) * 5, ra, rb, 3)
            for ra, rb in [(128, 256), (5, 1280)]
        ),
    )
    print(
        "softmax rows",
        all(
            same_rows(lambda x: torch.softmax(x, -1), lambda r: torch.randn(r, 300), ra, rb, 3)
            for ra, rb in [(5, 4000)]
        ),
    )
    print("amax", same_rows(lambda x: x.amax(-1), lambda r: torch.randn(r, 300), 5, 4000, 3))


if __name__ == "__main__":
    main()
