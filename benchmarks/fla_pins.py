"""fla's chunked delta rule at the 27B's GDN shape: the engine's pinned configurations against fla's own autotuning.

``python benchmarks/fla_pins.py`` runs two child processes on the GPU, one with the engine's pins
(`spinf.engine.kernels.chunked`) and one with fla left to time its candidates, each on the same inputs (48 value
heads, 128 × 128 states, bf16): one 16,384-token sequence and 8 of 1,800. Each prints its ms per call and, for the
autotuned one, the configuration fla chose for every kernel (what to pin when the pins fall behind).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CASES = {"one sequence of 16,384": [16384], "8 sequences of 1,800": [1800] * 8}


def child(pinned: bool) -> None:
    import torch

    if __package__ in (None, ""):  # run as a script: the repository root on the path, as the other benchmarks do
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.gpu_probe import timed

    if pinned:
        from spinf.engine.kernels.chunked import chunked_kernel

        fn, why = chunked_kernel()
        if fn is None:
            raise SystemExit(why)
    else:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fn
    device = torch.device("cuda")
    heads, dk, dv = 48, 128, 128
    out = {}
    for name, lengths in CASES.items():
        n = sum(lengths)
        gen = torch.Generator(device=device).manual_seed(0)
        q = torch.nn.functional.normalize(torch.randn(1, n, heads, dk, device=device, generator=gen), dim=-1)
        k = torch.nn.functional.normalize(torch.randn(1, n, heads, dk, device=device, generator=gen), dim=-1)
        v = torch.randn(1, n, heads, dv, device=device, generator=gen)
        q, k, v = (t.to(torch.bfloat16) for t in (q * dk**-0.5, k, v))
        g = torch.log(0.9 + 0.1 * torch.rand(1, n, heads, device=device, generator=gen))
        beta = torch.rand(1, n, heads, device=device, generator=gen)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64, device=device)
        initial = torch.zeros(len(lengths), heads, dk, dv, device=device)

        def call(q=q, k=k, v=v, g=g, beta=beta, initial=initial, cu=cu):
            return fn(q, k, v, g, beta, scale=1.0, initial_state=initial, output_final_state=True, cu_seqlens=cu)

        out[name] = round(timed(call, 10) * 1000, 3)
    chosen = {}
    if not pinned:
        from fla.ops.common import chunk_delta_h, chunk_o
        from fla.ops.gated_delta_rule import chunk_fwd, wy_fast
        from fla.ops.utils import cumsum
        from triton.runtime import autotuner

        for module, name in [
            (cumsum, "chunk_local_cumsum_scalar_kernel"),
            (chunk_fwd, "chunk_gated_delta_rule_fwd_kkt_solve_kernel"),
            (wy_fast, "recompute_w_u_fwd_kernel"),
            (chunk_delta_h, "chunk_gated_delta_rule_fwd_kernel_h_blockdim64"),
            (chunk_o, "chunk_fwd_kernel_o"),
        ]:
            tuner = getattr(module, name)
            while not isinstance(tuner, autotuner.Autotuner):
                tuner = tuner.fn
            chosen[name] = sorted({f"{c.kwargs} w{c.num_warps} s{c.num_stages}" for c in tuner.cache.values()})
    print(json.dumps({"pinned": pinned, "ms": out, "chosen": chosen}))


def main() -> None:
    rows = []
    for pinned in (True, False):
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLA_")}
        done = subprocess.run(
            [sys.executable, __file__, "--child", "pinned" if pinned else "autotuned"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            print(done.stderr[-3000:])
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print("| configurations | " + " | ".join(CASES) + " |")
    print("|---|" + "---|" * len(CASES))
    for row in rows:
        label = "the engine's pins" if row["pinned"] else "fla's autotuning"
        print(f"| {label} | " + " | ".join(f"{row['ms'][name]:.3f} ms" for name in CASES) + " |")
    for row in rows:
        for name, configs in row["chosen"].items():
            print(f"autotuned {name}: {', '.join(configs)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2] == "pinned")
    else:
        main()
