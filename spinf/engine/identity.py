"""What an engine says of itself: its ``system_fingerprint`` (api spec §11), and the platform half of the ``/v0/info``
engine object (§3.6: the device, torch, CUDA, transformers, Python, and, ours beyond it, the rest of the numerics
stack). Both read the installed software and the device; the model's half is `Engine.info`'s.
"""

from __future__ import annotations

import hashlib
import os
import platform
from importlib.metadata import PackageNotFoundError, version

import torch

from spinf._version import __version__

# The numerics stack beside torch and transformers, by distribution: the kernels (triton; fla-core for the Qwen
# stack's linear attention), the tokenizer, the checkpoint reader and numpy, whose versions decide the scores.
_STACK = {"triton": "triton", "tokenizers": "tokenizers", "safetensors": "safetensors", "numpy": "numpy"}
_OPTIONAL_STACK = {"fla": "fla-core"}


def image() -> str:
    """The build the process runs (the container's ``GIT_SHA``), part 4 of the fingerprint."""
    return os.environ.get("GIT_SHA") or "unknown"


def capability(device: torch.device) -> str:
    """The GPU's compute capability (``9.0``), or ``cpu``."""
    if device.type != "cuda":
        return "cpu"
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}.{minor}"


def fingerprint(
    *, model_id: str, revision: str, quant: str, device: torch.device, head: str, scale_table: str | None, layers: int
) -> str:
    """``fp_`` + 10 hex digits of sha256 over the parts of api spec §11, in order: the checkpoint, its revision, the
    scheme, the build, the engine's version, the device's capability, the LM head's precision, and under fp8s the
    scale table; ``layers`` (ours, beyond §11) only for a truncated model, whose scores are another model's."""
    parts = [model_id, revision, quant, image(), __version__, capability(device), head]
    if quant == "fp8s":
        parts.append(scale_table)
    if layers:
        parts.append(f"layers {layers}")
    return "fp_" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:10]


def platform_info(device: torch.device) -> dict:
    """The platform's fields of ``/v0/info``'s engine object (api spec §3.6), in its order, then `stack_versions`."""
    import transformers

    cuda = device.type == "cuda"
    return {
        "gpu": torch.cuda.get_device_name(device) if cuda else "cpu",
        "capability": capability(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        **stack_versions(),  # ours, beyond §3.6: the rest of the numerics stack (constraints/*.txt pin it)
    }


def stack_versions() -> dict[str, str | None]:
    """The installed versions of `_STACK` (None for one not installed: triton off Linux) and of `_OPTIONAL_STACK`
    where installed, read from the distributions' metadata without importing them."""

    def installed(distribution: str) -> str | None:
        try:
            return version(distribution)
        except PackageNotFoundError:
            return None

    versions = {key: installed(distribution) for key, distribution in _STACK.items()}
    optional = {key: installed(distribution) for key, distribution in _OPTIONAL_STACK.items()}
    return versions | {key: found for key, found in optional.items() if found is not None}
