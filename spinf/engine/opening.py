"""Opening a model (api spec §9.6–9.8): resolve the name, refuse what cannot run, find the checkpoint, choose the
scheme, in that order, before a weight is read.

`check_before_lookup` makes every refusal that the manifest, the settings and the device decide (the family, the
device, the scheme, the memory for the manifest's size) before any lookup or download: ``spinf-serve serve`` calls
it before the server starts, and `open_checkpoint` before it looks for the files. What needs the files (their
format, their exact size, a scale table shipped with them) comes after the lookup. `RUNNABLE_SCHEMES` is what the
Gemma stack runs, with the dtype a checkpoint loads in (the Qwen stack's loader chooses its own).
"""

from __future__ import annotations

import attrs
import torch

from spinf.catalog import Checkpoint, ResolvedModel, resolve_model
from spinf.catalog.manifest import FAMILIES, INT4_MODES
from spinf.engine.gemma4 import fp8_static
from spinf.engine.gemma4.tiny import find_or_generate
from spinf.engine.hardware import (
    INT4_PREFIX,
    DeviceFacts,
    check_hardware,
    check_requested,
    choose_quant,
    device_facts,
    settled_quant,
)
from spinf.engine.qwen35.loading import FLOAT_SCHEMES
from spinf.engine.scales import find_table, missing_table_error, stored_table
from spinf.engine.schemes import SCHEMES
from spinf.errors import ModelError

# The schemes this build runs, with the dtype the checkpoint loads in: fp8s loads bf16 and quantizes every decoder
# linear with the revision's scale table (spinf.engine.scales); fp8, fp8row, w8a16 and w8a8 load bf16 and quantize
# each layer as it arrives (spinf.engine.schemes). On the CPU they run emulated (the tiny model and local folders).
# The int4 modes (``int4-i8`` ...) run the Qwen stack's GPTQ checkpoints, whose loader chooses its own dtypes
# (`spinf.engine.qwen35.loading`).
RUNNABLE_SCHEMES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp8s": torch.bfloat16,
    **dict.fromkeys(SCHEMES, torch.bfloat16),
}
QWEN_FLOAT_SCHEMES = tuple(FLOAT_SCHEMES)  # a Qwen3.5 float checkpoint's (`spinf.engine.qwen35.loading`)


def open_checkpoint(
    model: str | None,
    *,
    device: str,
    quant: str = "",
    model_dir: str = "",
    cache_dirs: list[str] | None = None,
    revision: str = "",
    model_id: str = "",
) -> tuple[ResolvedModel, Checkpoint, str]:
    """Resolve the model (api spec §9.6), find its weights (§9.7), choose and check the scheme (§9.8).

    ``revision`` (the ``revision`` setting) replaces the manifest's pin when given; ``model_id`` (the setting)
    replaces the checkpoint repo that keys the scale-table store. Every refusal that needs no checkpoint comes
    before the lookup (`check_before_lookup`), so a refused start downloads nothing; the others come after it, on
    the files found (their format and exact size, a scale table shipped with them), before a weight is read.
    """
    resolved, facts = check_before_lookup(
        model, device=device, quant=quant, model_dir=model_dir, revision=revision, model_id=model_id
    )
    checkpoint = find_or_generate(resolved, model_dir=model_dir, cache_dirs=cache_dirs)
    model_id = model_id or resolved.model_id
    table = find_table(model_id, checkpoint.revision, checkpoint.folder)
    size = checkpoint.num_bytes()
    _check_family(resolved.served_name, checkpoint.family)
    scheme = choose_quant(
        resolved,
        quant,
        facts.capability,
        weight_format=checkpoint.weight_format,
        has_scale_table=table is not None,
        checkpoint_bytes=size,
        free_bytes=facts.free_bytes,
        family=checkpoint.family,
    )
    check_hardware(resolved, scheme, device, size, weight_format=checkpoint.weight_format, facts=facts)
    _check_runnable(resolved.served_name, checkpoint.family, scheme)
    if scheme == "fp8s" and table is None and checkpoint.weight_format != fp8_static.FORMAT:
        raise missing_table_error(resolved.served_name, model_id, checkpoint.revision, checkpoint.folder)
    return resolved, checkpoint, scheme


def check_before_lookup(
    model: str | None,
    *,
    device: str,
    quant: str = "",
    model_dir: str = "",
    revision: str = "",
    model_id: str = "",
) -> tuple[ResolvedModel, DeviceFacts]:
    """The model resolved as `open_checkpoint` resolves it, and the device's facts, after every refusal that needs
    no checkpoint and no network: what the manifest (family, format, schemes, size), the settings (quant, device)
    and the device (there at all, its compute capability, its free memory) decide. `open_checkpoint` calls it before
    the lookup, ``spinf-serve serve`` before the server starts: a refused start downloads nothing.

    In order: the family; the catalog model's need of a GPU; the scheme (`settled_quant`: the automatic choice
    when the lookup cannot change it) against the manifest's schemes, the compute capability, and the free memory
    for the manifest's ``bytes`` (only at its pinned revision); the format and scheme this build loads. For a repo
    outside the catalog only what holds whatever its format is checked (`check_requested`). A folder given (the
    model or ``model_dir``) is never fetched: beyond the device, its checks wait for its files.
    """
    resolved = resolve_model(model)
    if revision and revision != resolved.revision:
        resolved = attrs.evolve(resolved, revision=revision)
    facts = device_facts(device)
    if model_dir or resolved.local_folder is not None:
        return resolved, facts
    name, manifest = resolved.served_name, resolved.manifest
    if resolved.family is not None:
        _check_family(name, resolved.family)
    size = manifest.source.bytes if manifest is not None and resolved.revision == manifest.source.revision else None
    model_id = model_id or resolved.model_id
    stored = resolved.revision is not None and stored_table(model_id, resolved.revision) is not None
    scheme = settled_quant(
        resolved, quant, facts.capability, has_scale_table=stored, checkpoint_bytes=size, free_bytes=facts.free_bytes
    )
    if scheme is None:
        check_requested(resolved, quant, device, facts)
    else:
        check_hardware(resolved, scheme, device, size, facts=facts)
    if resolved.weight_format is not None:
        _check_runnable(name, resolved.family, scheme)
    return resolved, facts


def _check_family(name: str, family: str) -> None:
    if family not in FAMILIES:
        raise ModelError(f"{name}: the {family} stack is not available in this build")


def _check_runnable(name: str, family: str | None, scheme: str | None) -> None:
    """Refuses a scheme the model's stack does not run, saying what would run instead; ``scheme`` None: not settled
    yet, ``family`` None: not known yet (a Hub repo before its config is read). The int4 modes run the Qwen3.5
    stack's GPTQ checkpoints; that stack's float checkpoints run fp32 or bf16, the Gemma stack every other scheme.

    Whether fp8s has its scale table is asked after the lookup, since a checkpoint may ship its own.
    """
    if scheme is None or family is None:
        return
    int4 = scheme.startswith(INT4_PREFIX)
    if family == "qwen35" and not int4 and scheme not in QWEN_FLOAT_SCHEMES:
        raise ModelError(
            f"{name}: the {scheme} scheme runs the Gemma 4 stack only; a Qwen3.5 checkpoint runs "
            f"{' or '.join(QWEN_FLOAT_SCHEMES)} (float weights) or the int4 modes {', '.join(INT4_MODES)} (GPTQ)"
        )
    if family != "qwen35" and int4:
        raise ModelError(
            f"{name}: the {scheme} scheme runs GPTQ checkpoints of the Qwen3.5 stack only; a Gemma 4 checkpoint runs "
            f"{', '.join(RUNNABLE_SCHEMES)}"
        )
