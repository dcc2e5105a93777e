"""The chunked gated delta rule on the GPU: flash-linear-attention's Triton kernels, each pinned to one configuration.

A job's fixed prefix (its BOS and content, up to where a join cut could fall: `spinf.engine.trie.Job.fixed`) is the
one long run of the recurrence that no question changes; `spinf.engine.qwen35.chunked` gives it to
``chunk_gated_delta_rule`` of fla (PyPI ``fla-core``) as variable-length sequences, 64-token chunks counted from the
BOS, and the token-by-token kernel (`spinf.engine.kernels.gdn`) goes on from the final states.

fla picks each kernel's launch configuration by timing the candidates on first use, so two processes could run the
same sequence with different tiles (and a different grouping of sums). Its config cache (``FLA_CACHE_MODE``) is how
fla takes a configuration instead: ``default`` mode reads one ``default_config`` per kernel from
``FLA_CONFIG_DIR/<kernel>.json`` and never times. This package carries two sets (`CONFIGS`): ``sm90``, what fla's
own autotuning chose on an H200 (`benchmarks/fla_pins.py`: 1.45 ms for a 16,384-token sequence at the 27B's
shape, against 2.32 ms with the portable set), and ``portable``, small tiles and two stages that fit the shared
memory of any GPU fla runs on. This module sets that mode and the directory for the GPU (`config_dir`) before fla
is imported, turns fla's backend dispatch off (a faster backend installed later
would change the bits), and checks after the import that fla took the settings; when it did not (fla imported
earlier with other settings) or fla is missing, `chunked_kernel` says why and the engine stays token by token.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger("spinf.engine")

CONFIGS = Path(__file__).with_name("fla_configs")
# the fla kernels a forward of `chunk_gated_delta_rule` launches (chunk size 64, no l2norm or gate in the kernel)
PINNED_KERNELS = (
    "chunk_local_cumsum_scalar_kernel",
    "chunk_gated_delta_rule_fwd_kkt_solve_kernel",
    "recompute_w_u_fwd_kernel",
    "chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
    "chunk_fwd_kernel_o",
)


def config_dir() -> Path:
    """The pinned configurations for this process's GPU: Hopper's (compute capability 9.0), else the portable ones."""
    return CONFIGS / ("sm90" if torch.cuda.get_device_capability() == (9, 0) else "portable")


CHUNK = 64  # tokens per chunk: fla's chunk size, asked explicitly, and what the engine's chunk tables count in
FLA_SERIES = "0.6."  # the fla-core release series the pins were written for (pyproject's `gpu` extra)
ChunkedFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


@functools.cache
def chunked_kernel() -> tuple[ChunkedFn | None, str]:
    """fla's ``chunk_gated_delta_rule`` with every kernel pinned, or None and the reason it is not used (logged,
    once)."""
    fn, why = _load()
    if fn is None:
        log.warning("the Qwen recurrence runs token by token everywhere: %s", why)
    else:
        log.info("the Qwen recurrence runs each fixed prefix chunked: %s", why)
    return fn, why


def _load() -> tuple[ChunkedFn | None, str]:
    folder = config_dir()
    missing = [name for name in PINNED_KERNELS if not (folder / f"{name}.json").is_file()]
    if missing:
        return None, f"the pinned fla configurations are missing: {', '.join(missing)}"
    already = "fla" in sys.modules
    os.environ.update(
        {"FLA_CACHE_MODE": "default", "FLA_CONFIG_DIR": str(folder), "FLA_DISABLE_BACKEND_DISPATCH": "1"}
    )
    try:
        import fla
        from fla import backends
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.utils import cache
    except ImportError as exc:
        return None, f"flash-linear-attention (fla-core) is not importable: {exc}"
    version = getattr(fla, "__version__", "unknown")
    if not version.startswith(FLA_SERIES):
        return None, f"fla-core {version} is installed; the pins and kernel names are those of {FLA_SERIES}x"
    # both are read once, when fla is first imported: a process that imported it earlier keeps its own settings
    if cache.FLA_CACHE_MODE.value != "default" or not getattr(backends, "_DISPATCH_DISABLED", False):
        why = "fla was imported before the engine set its settings" if already else "fla ignored its settings"
        return None, f"{why}; its kernels would pick their configurations by timing, or another backend would run"
    return chunk_gated_delta_rule, f"fla-core {version}, the configurations pinned in {folder.name}"


def chunked_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial: torch.Tensor,
    cu_seqlens: torch.Tensor,
    cu_host: torch.Tensor,
    chunk_indices: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequences ``cu_seqlens`` of packed rows q, k [T, Hv, dk], v [T, Hv, dv], g (log decay) and beta [T, Hv],
    each from its state ``initial`` [N, Hv, dk, dv] fp32: -> o [T, Hv, dv] in v's dtype and the final states
    [N, Hv, dk, dv] fp32. q comes scaled (fla's ``scale`` is 1) and q, k normalized."""
    fn, why = chunked_kernel()
    if fn is None:
        raise RuntimeError(f"the chunked delta rule is not available: {why}")
    o, final = fn(
        q.unsqueeze(0),
        k.unsqueeze(0),
        v.unsqueeze(0),
        g.unsqueeze(0),
        beta.unsqueeze(0),
        scale=1.0,
        initial_state=initial,
        output_final_state=True,
        cu_seqlens=cu_seqlens,
        cu_seqlens_cpu=cu_host,
        chunk_indices=chunk_indices,
        chunk_size=CHUNK,  # the chunk table was made for it
    )
    return o.squeeze(0), final
