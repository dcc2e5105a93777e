"""A Gemma 4 checkpoint folder into the engine's model (`spinf.engine.gemma4.model`), layer by layer.

The model is built on the ``meta`` device; the checkpoint's text weights are memory-mapped from its safetensors
shards and assigned one decoder layer at a time, q/k/v and gate/up fused, each layer quantized as soon as it is on
the device when the scheme asks (fp8s with a scale table, or a scheme of `spinf.engine.schemes`), so the float
weights of the whole model never sit there at once. A pre-quantized fp8-static checkpoint's linears are taken as
they are (`spinf.engine.gemma4.fp8_static`). The small models' (E2B/E4B) per-layer input weights are read beside them
and stay in the model dtype; their KV-shared layers have no k/v weights to read (the Hub's files hold some all the
same: as transformers' loader does, this one leaves them unread).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs
import torch
from torch import nn

from spinf.engine.folder import read_tensors
from spinf.engine.gemma4 import fp8_static
from spinf.engine.gemma4.config import LayerSpec, read_text_config
from spinf.engine.gemma4.model import Gemma4Text
from spinf.engine.gemma4.moe import checkpoint_state
from spinf.engine.head import DEFAULT_HEAD, check_mode
from spinf.engine.schemes import SCHEMES
from spinf.errors import ModelError


def _layer_state(
    raw: dict[str, torch.Tensor], i: int, spec: LayerSpec, *, linears: bool = True
) -> dict[str, torch.Tensor]:
    """Checkpoint names of layer ``i`` -> this module's names, with q/k/v and gate/up fused; without the linears'
    weights when ``linears`` is false (an fp8-static checkpoint's, which `spinf.engine.gemma4.fp8_static` takes)."""
    p = f"layers.{i}."
    qkv = ["q_proj"] if spec.kv_shared else ["q_proj", "k_proj"] + ([] if spec.k_eq_v else ["v_proj"])
    weights = {}
    if linears:
        weights = {
            "wqkv.weight": torch.cat([raw.pop(f"{p}self_attn.{n}.weight") for n in qkv]),
            "wo.weight": raw.pop(f"{p}self_attn.o_proj.weight"),
            "w_gate_up.weight": torch.cat([raw.pop(f"{p}mlp.{n}.weight") for n in ("gate_proj", "up_proj")]),
            "w_down.weight": raw.pop(f"{p}mlp.down_proj.weight"),
        }
    if not spec.kv_shared:
        weights["k_norm"] = raw.pop(f"{p}self_attn.k_norm.weight")
    if spec.moe:  # the 26B A4B's router and experts
        weights.update(checkpoint_state(raw, p))
    if f"{p}per_layer_input_gate.weight" in raw:  # E2B/E4B
        weights["per_layer_gate.weight"] = raw.pop(f"{p}per_layer_input_gate.weight")
        weights["per_layer_proj.weight"] = raw.pop(f"{p}per_layer_projection.weight")
        weights["post_per_layer_norm"] = raw.pop(f"{p}post_per_layer_input_norm.weight")
    return {
        **weights,
        "q_norm": raw.pop(f"{p}self_attn.q_norm.weight"),
        "input_norm": raw.pop(f"{p}input_layernorm.weight"),
        "post_attn_norm": raw.pop(f"{p}post_attention_layernorm.weight"),
        "pre_ff_norm": raw.pop(f"{p}pre_feedforward_layernorm.weight"),
        "post_ff_norm": raw.pop(f"{p}post_feedforward_layernorm.weight"),
        "layer_scalar": raw.pop(f"{p}layer_scalar", torch.ones(1)),
    }


def load_gemma4_text(
    folder: str | Path,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    scales: Mapping[str, float] | None = None,
    layers: int = 0,
    scheme: str | None = None,
    lm_head: str = DEFAULT_HEAD,
) -> Gemma4Text:
    """Build the model on ``meta`` and assign the checkpoint's text weights (memory-mapped safetensors), layer by
    layer; with fp8s ``scales``, or a ``scheme`` that quantizes on the fly (`spinf.engine.schemes.SCHEMES`), each
    layer is quantized as soon as it is on the device, so the float weights of the whole model never sit there at
    once. ``layers`` (unless 0) keeps only the first that many decoder layers (the ``layers`` setting); the
    others' weights are never read. ``lm_head`` is the head's precision mode (`spinf.engine.head`)."""
    folder = Path(folder)
    cfg, prefix = read_text_config(folder)
    if layers:
        if layers > len(cfg.layers):
            raise ModelError(f"{folder}: the checkpoint has {len(cfg.layers)} layers, fewer than the {layers} asked")
        cfg = attrs.evolve(cfg, layers=cfg.layers[:layers])
    with torch.device("meta"):
        model = Gemma4Text(cfg)
    if scales is not None:
        model.check_scales(scales)
    model.head_mode = check_mode(lm_head)
    on_the_fly = SCHEMES.get(scheme) if scales is None else None  # fp8s is quantized by its scales
    prequantized = fp8_static.is_fp8_static(folder)
    if prequantized and scales is not None:
        raise ModelError(f"{folder}: an fp8-static checkpoint brings its own input scales; a scale table is not used")
    if prequantized and any(spec.moe for spec in cfg.layers):  # its experts' fp8 layout is not one we know
        raise ModelError(f"{folder}: a pre-quantized MoE checkpoint (the 26B A4B) is not read: use a bf16 one")
    if prequantized and (cfg.per_layer_size or any(spec.kv_shared for spec in cfg.layers)):  # untried layouts
        raise ModelError(f"{folder}: a pre-quantized E2B/E4B checkpoint is not read: use a bf16 one")
    raw = read_tensors(folder, prefix)
    raw.pop("lm_head.weight", None)  # tied to the embedding in every Gemma 4 checkpoint we serve

    def placed(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(device=device, dtype=dtype) for k, v in state.items()}

    try:
        top = placed({"embed.weight": raw.pop("embed_tokens.weight"), "final_norm": raw.pop("norm.weight")})
        model.embed.load_state_dict({"weight": top["embed.weight"]}, assign=True)
        model.final_norm = nn.Parameter(top["final_norm"], requires_grad=False)
        if cfg.per_layer_size:
            _load_per_layer(model, placed(_per_layer_state(raw, len(cfg.layers) * cfg.per_layer_size)))
        for i, (layer, spec) in enumerate(zip(model.layers, cfg.layers, strict=True)):
            if prequantized:  # an fp8-static checkpoint: its fp8 linears as they are, or dequantized for the scheme
                fp8 = fp8_static.take_layer(raw, i, spec, device)
                state = _layer_state(raw, i, spec, linears=False)
                if scheme in fp8_static.READS_FP8:
                    layer.load_fp8(placed(state), fp8, SCHEMES.get(scheme))
                    continue
                state.update({f"{name}.weight": weight.dequantized() for name, (weight, _) in fp8.items()})
            else:
                state = _layer_state(raw, i, spec)
            layer.load_state_dict(placed(state), assign=True, strict=True)
            if scales is not None:
                layer.to_fp8s(scales)
            elif on_the_fly is not None:
                layer.to_scheme(on_the_fly)
    except KeyError as exc:
        raise ModelError(f"{folder}: the checkpoint lacks the weight {exc.args[0]!r}") from exc
    return model.eval().requires_grad_(False)


def _per_layer_state(raw: dict[str, torch.Tensor], width: int) -> dict[str, torch.Tensor]:
    """The per-layer input weights of the model (E2B/E4B), the columns of the first ``width`` // size layers only
    (each layer's slice is independent of the others', so the ``layers`` setting cuts them exactly)."""
    return {
        "embed_per_layer.weight": raw.pop("embed_tokens_per_layer.weight")[:, :width],
        "per_layer_model_proj.weight": raw.pop("per_layer_model_projection.weight")[:width],
        "per_layer_proj_norm": raw.pop("per_layer_projection_norm.weight"),
    }


def _load_per_layer(model: Gemma4Text, state: dict[str, torch.Tensor]) -> None:
    model.embed_per_layer.load_state_dict({"weight": state["embed_per_layer.weight"]}, assign=True)
    model.per_layer_model_proj.load_state_dict({"weight": state["per_layer_model_proj.weight"]}, assign=True)
    model.per_layer_proj_norm = nn.Parameter(state["per_layer_proj_norm"], requires_grad=False)
