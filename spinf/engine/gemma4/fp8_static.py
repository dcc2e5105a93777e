"""The fp8-static checkpoint format (engine spec B.8, api spec §9.8): compressed-tensors' float-quantized layout.

Per decoder linear the checkpoint holds an e4m3 ``weight [out, in]``, a ``weight_scale`` and an ``input_scale`` (one
value each: tensor strategy, ``dynamic: false``); everything else is as in a bf16 checkpoint. `format_problem` reads
``config.json``'s ``quantization_config`` and names, in one line, anything that is not that layout (another method,
format, bit width, strategy, dynamic scales, output or KV-cache quantization, sparsity, transforms, a decoder linear
left unquantized). It reads the config as compressed-tensors and the reference engine do: a key left out has
compressed-tensors' default (``symmetric`` true, ``dynamic`` false), and a null ``symmetric`` or ``dynamic`` is read
as that default; ``targets`` may be the class ``Linear``, module names or ``re:`` regexes (matched from the start of
the module name, as compressed-tensors matches them), across any number of groups, less the ``ignore`` list, as long
as together they name every decoder linear.

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
import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path

import torch

from spinf.engine.gemma4.config import GEMMA4_TYPES, LayerSpec, parse_text_config
from spinf.engine.quant import Fp8Weight
from spinf.engine.scales import FUSED_PROJECTIONS, VALUES_PROJECTION
from spinf.errors import ModelError

FORMAT = "fp8-static"
# the table id of part 8 of the system fingerprint (api spec §11) when the input scales come from the checkpoint
CHECKPOINT_TABLE = "checkpoint"
# The schemes that run an fp8-static checkpoint's fp8 weights as they are: fp8s with its input scales, fp8 with dynamic
# ones. Any other scheme gets the weights dequantized (fp32, per row) and quantizes them itself.
READS_FP8 = ("fp8s", "fp8")
# The layout this reader accepts, field by field, for both the weights and the input activations.
_ARGS = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False}
# compressed-tensors' defaults of the fields a writer may leave out (its ``type`` defaults to int, its ``strategy`` is
# inferred: neither is the layout unless written); for the last two a null means the default, as the reference reads it
_DEFAULTS = {"num_bits": 8, "symmetric": True, "dynamic": False}
_NULL_MEANS_DEFAULT = ("symmetric", "dynamic")


def projections(spec: LayerSpec) -> dict[str, tuple[str, ...]]:
    """The engine's fused linears of a layer and the checkpoint projections each is made of, in order."""
    return {
        name: tuple(part for part in parts if not (spec.k_eq_v and part == VALUES_PROJECTION))
        for name, parts in FUSED_PROJECTIONS.items()
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
    return _coverage_problem(config, [group["targets"] for group in groups.values()], quant.get("ignore"))


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
            value = args.get(key, _DEFAULTS.get(key))
            if value is None and key in _NULL_MEANS_DEFAULT:
                value = _DEFAULTS[key]
            if value != wanted:
                return f"{part}.{key} is {args.get(key)!r}, not {wanted!r}"
    return _targets_problem(group.get("targets"))


def _targets_problem(targets: object) -> str | None:
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        return f"targets are {targets!r}, not a list of module classes, names or re: patterns"
    for target in targets:
        if target.startswith("re:"):
            try:
                re.compile(target.removeprefix("re:"))
            except re.error as exc:
                return f"target {target!r} is not a regular expression: {exc}"
    return None


def _matches(name: str, targets: object) -> bool:
    """Whether a linear named ``name`` is one of ``targets``, as compressed-tensors matches a target: the class
    ``Linear``, the exact name, or a ``re:`` pattern matched from the start of the name."""
    if not isinstance(targets, list):
        return False
    return any(
        target == "Linear"
        or target == name
        or (target.startswith("re:") and re.match(target.removeprefix("re:"), name) is not None)
        for target in targets
        if isinstance(target, str)
    )


def _coverage_problem(config: Mapping, targets: list[list[str]], ignore: object) -> str | None:
    """The first decoder linear that no group targets, or that ``ignore`` leaves out, by its module name."""
    for name in _decoder_linears(config):
        if not any(_matches(name, group) for group in targets) or _matches(name, ignore):
            return f"the targets leave {name} unquantized (every decoder linear must be fp8)"
    return None


def _decoder_linears(config: Mapping) -> list[str]:
    """The module names of the text model's decoder linears (none when the config cannot say: the loader then
    names what is missing)."""
    unified = config.get("model_type") in GEMMA4_TYPES
    text, prefix = (config.get("text_config") or {}, "model.language_model.") if unified else (config, "model.")
    try:
        specs = parse_text_config(dict(text)).layers
    except (ModelError, KeyError, TypeError, ValueError):
        return []
    return [
        f"{prefix}layers.{index}.{part}"
        for index, spec in enumerate(specs)
        for parts in projections(spec).values()
        for part in parts
    ]


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
