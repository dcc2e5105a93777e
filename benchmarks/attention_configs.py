"""Times the tree-attention kernel's tile configurations on real pass layouts (J1's first pass, J3), per head dim.

Run on the GPU machine: ``python benchmarks/attention_configs.py``. For the 12B's two layer kinds (sliding: head dim
256, 16 query heads over 8 KV heads, window 1024; full: head dim 512, 16 query heads over one KV head) it times one
kernel call per (M, HG, BN, BP, warps, stages) candidate on random q/k/v and prints milliseconds per call. The fixed
configuration in `spinf.engine.kernels.attention.CONFIGS` is chosen from these figures (every candidate gives each
row the same bits wherever it sits; they differ only in speed and in low bits between configurations).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_jobsets import job_bodies, parse_body, tiny_tokenizer  # noqa: E402
from benchmarks.gpu_probe import timed  # noqa: E402
from spinf.engine.compiler import EngineShape, compile_request  # noqa: E402
from spinf.engine.kernels import kernel_plan, tile_rows, tree_attention_kernel  # noqa: E402
from spinf.engine.layout import build_pass  # noqa: E402
from spinf.engine.packing import pack  # noqa: E402

CANDIDATES = {  # (M = query rows × heads per program, HG, BN, BP, warps, stages); the first is the fixed one
    256: [
        (64, 0, 32, 16, 4, 2),
        (64, 0, 32, 32, 4, 2),
        (64, 1, 32, 16, 4, 2),
        (32, 0, 64, 16, 4, 2),
        (64, 0, 16, 16, 4, 2),
    ],
    512: [
        (32, 0, 32, 32, 4, 2),
        (32, 0, 32, 16, 4, 2),
        (32, 8, 32, 32, 4, 2),
        (64, 4, 32, 16, 8, 1),
        (32, 4, 32, 16, 4, 2),
    ],
}
KINDS = {256: (16, 8, 1024), 512: (16, 1, None)}


def first_pass(name: str):
    """The pass layout the engine would run first for the job set's body (its jobs packed as the packer packs)."""
    bodies, _ = job_bodies(name, None)
    jobs = compile_request(parse_body(bodies[0]), tiny_tokenizer(), EngineShape(16_384, 65_536)).jobs
    members = pack([job.num_tokens for job in jobs], 16_384)[0]
    return build_pass([jobs[i] for i in members])


def main() -> None:
    device = torch.device("cuda")
    for name in ("J1", "J3"):
        layout = first_pass(name)
        depth = max((len(p) for p in layout.paths), default=0)
        print(f"{name}: {layout.num_tokens} rows, {len(layout.spans)} jobs, deepest path {depth}", flush=True)
        for dim, candidates in CANDIDATES.items():
            heads, kv_heads, window = KINDS[dim]
            plan = kernel_plan(layout, device, [tile_rows(dim, heads // kv_heads, c) for c in candidates])
            n = layout.num_tokens
            q, k, v = (
                torch.randn(n, h, dim, device=device, dtype=torch.bfloat16) for h in (heads, kv_heads, kv_heads)
            )
            reference = None
            for config in candidates:
                try:
                    seconds = timed(lambda a=(q, k, v, plan, window, config): tree_attention_kernel(*a), 10)
                    out = tree_attention_kernel(q, k, v, plan, window, config)
                except Exception as exc:  # noqa: BLE001 - a configuration that does not compile is reported
                    print(f"  d={dim} {config}: failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                reference = out if reference is None else reference
                diff = (out.float() - reference.float()).abs().max().item()
                print(
                    f"  d={dim} {config}: {seconds * 1000:.3f} ms (max |Δ| vs first {diff:.2e})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
