"""The fp8-static checkpoint format (engine spec B.8, api spec §9.8): compressed-tensors' float-quantized layout.

Per decoder linear the checkpoint holds an e4m3 ``weight [out, in]``, a ``weight_scale`` and an ``input_scale`` (one
value each: tensor strategy, ``dynamic: false``); everything else is as in a bf16 checkpoint. `format_problem` reads
``config.json``'s ``quantization_config`` and names, in one line, anything that is not exactly that layout (another
method, format, bit width, strategy, dynamic scales, output or KV-cache quantization, sparsity, transforms).

`take_layer` pops one decoder layer's linears and fuses them as the engine runs them (q/k/v into ``wqkv``, gate/up
into ``w_gate_up``): the fp8 data is concatenated as it is and each projection keeps its own weight scale, so the
fused weight carries one scale per output row (`Fp8Weight.fuse`). Quantizing the bf16 original at load does the same
per projection (`Fp8Weight.from_float` with the projections' sizes), so a checkpoint and its bf16 original quantized
with the same input scales score bit for bit alike. A fused linear's projections read the same input, so their
input scales are normally equal; when a checkpoint's are not, the largest is used for all (no projection's input
is clipped more than the checkpoint asked).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from pathlib import Path

import torch

from spinf.engine.config import LayerSpec
from spinf.engine.quant import Fp8Weight
from spinf.errors import ModelError

FORMAT = "fp8-static"
# the table id of part 8 of the system fingerprint (api spec §11) when the input scales come from the checkpoint
CHECKPOINT_TABLE = "checkpoint"
# The schemes that run an fp8-static checkpoint's fp8 weights as they are: fp8s with its input scales, fp8 with dynamic
# ones. Any other scheme gets the weights dequantized (fp32, per row) and quantizes them itself.
READS_FP8 = ("fp8s", "fp8")
# The layout this reader accepts, field by field, for both the weights and the input activations.
_ARGS = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False}


def projections(spec: LayerSpec) -> dict[str, tuple[str, ...]]:
    """The engine's fused linears of a layer and the checkpoint projections each is made of, in order."""
    qkv = ("self_attn.q_proj", "self_attn.k_proj") + (() if spec.k_eq_v else ("self_attn.v_proj",))
    return {
        "wqkv": qkv,
        "wo": ("self_attn.o_proj",),
        "w_gate_up": ("mlp.gate_proj", "mlp.up_proj"),
        "w_down": ("mlp.down_proj",),
    }


def format_problem(config: Mapping) -> str | None:
    """Why ``config.json``'s ``quantization_config`` is not the fp8-static layout, or None when it is."""
    quant = config.get("quantization_config")
    if not isinstance(quant, Mapping):
        return "config.json has no quantization_config"
    if quant.get("quant_method") != "compressed-tensors":
        return f"quant_method is {quant.get('quant_method')!r}, not 'compressed-tensors'"
    for key in ("sparsity_config", "transform_config", "kv_cache_scheme"):
        if quant.get(key):
            return f"{key} is set ({key.split('_')[0]} is not part of the fp8-static layout)"
    groups = quant.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        return "quantization_config has no config_groups"
    for name, group in groups.items():
        problem = _group_problem(group, quant.get("format"))
        if problem is not None:
            return f"config group {name!r}: {problem}"
    return None


def _group_problem(group: object, top_format: object) -> str | None:
    if not isinstance(group, Mapping):
        return "not a table"
    if (group.get("format") or top_format) != "float-quantized":
        return f"format is {group.get('format') or top_format!r}, not 'float-quantized'"
    if group.get("output_activations"):
        return "output activations are quantized"
    for part in ("weights", "input_activations"):
        args = group.get(part)
        if not isinstance(args, Mapping):
            return f"{part} are not quantized (fp8-static quantizes both weights and input activations)"
        for key, wanted in _ARGS.items():
            if args.get(key) != wanted:
                return f"{part}.{key} is {args.get(key)!r}, not {wanted!r}"
    targets = group.get("targets")
    if targets != ["Linear"]:
        return f"targets are {targets!r}, not ['Linear']"
    return None


def check_format(config: Mapping, where: str) -> None:
    """`ModelError` naming ``where`` when the quantization config is not the fp8-static layout."""
    problem = format_problem(config)
    if problem is not None:
        raise ModelError(f"{where}: not an fp8-static checkpoint this engine reads: {problem}")


def is_fp8_static(folder: str | Path) -> bool:
    """Whether the checkpoint in ``folder`` is pre-quantized (a ``quantization_config``); `ModelError` when it is, but
    not in the fp8-static layout."""
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read the model config {path}: {exc}") from exc
    if "quantization_config" not in config:
        return False
    check_format(config, str(path))
    return True


def _tensor(raw: MutableMapping[str, torch.Tensor], name: str) -> torch.Tensor:
    try:
        return raw.pop(name)
    except KeyError:
        raise ModelError(f"the fp8-static checkpoint lacks {name!r}") from None


def _scale(raw: MutableMapping[str, torch.Tensor], name: str) -> torch.Tensor:
    """A per-tensor scale as an fp32 scalar; `ModelError` for any other shape or a value that is not positive."""
    value = _tensor(raw, name)
    if value.numel() != 1 or not value.is_floating_point():
        shape = tuple(value.shape)
        raise ModelError(f"{name}: a tensor-strategy scale is one floating-point value, got shape {shape}")
    value = value.float().reshape(())
    if not (torch.isfinite(value) and value > 0):
        raise ModelError(f"{name}: a scale must be a positive finite number, got {float(value)}")
    return value


def take_projection(raw: MutableMapping[str, torch.Tensor], name: str) -> tuple[Fp8Weight, float]:
    """Pop one projection (``name`` without ``.weight``): its fp8 weight and its input scale."""
    weight = _tensor(raw, f"{name}.weight")
    if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
        got = f"{weight.dtype} {tuple(weight.shape)}"
        raise ModelError(f"{name}.weight: expected a 2-D float8_e4m3fn tensor, got {got}")
    return Fp8Weight(weight, _scale(raw, f"{name}.weight_scale")), float(_scale(raw, f"{name}.input_scale"))


def take_layer(
    raw: MutableMapping[str, torch.Tensor], index: int, spec: LayerSpec, device: torch.device | str
) -> dict[str, tuple[Fp8Weight, float]]:
    """Pop layer ``index``'s fp8 linears from ``raw`` (names relative to the text model), fused and on ``device``:
    the engine's linear name -> (fp8 weight with per-row scales, input scale)."""
    fused = {}
    for name, parts in projections(spec).items():
        taken = [take_projection(raw, f"layers.{index}.{part}") for part in parts]
        weight = Fp8Weight.fuse([w for w, _ in taken]) if len(taken) > 1 else taken[0][0]
        weight = Fp8Weight(weight.data.to(device), weight.scale.to(device))
        fused[name] = (weight, max(scale for _, scale in taken))
    return fused
