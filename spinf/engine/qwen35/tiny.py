"""A tiny random Qwen3.5 checkpoint in the published layout, for the CPU tests of the hybrid stack.

`write_tiny_qwen35` writes a ``qwen3_5`` checkpoint (transformers' ``Qwen3_5ForConditionalGeneration`` layout: the
text config under ``text_config``, the text weights under ``model.language_model.``, an untied ``lm_head``) without a
vision tower, so transformers' ``Qwen3_5ForCausalLM`` loads it with no missing or unexpected keys. The architecture
(``TINY_TEXT_CONFIG``) has 4 Gated DeltaNet and 2 full-attention layers of width 64; the tokenizer is the tiny
Gemma's (ids below its 8,192). The weights are drawn here from one seeded generator in sorted key order, without
instantiating transformers, so their bytes depend on neither transformers' version nor its initialisers; the decay
parameters are drawn so that the recurrent state carries over tens of tokens (the tests need long memory).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from spinf.engine.tiny_tokenizer import tokenizer_files

TINY_TEXT_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5_text",
    "vocab_size": 8192,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "layer_types": [
        "linear_attention",
        "linear_attention",
        "full_attention",
        "linear_attention",
        "linear_attention",
        "full_attention",
    ],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-06,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "attention_bias": False,
    # rope on the first 8 of 32 dims; the 4 rotary pairs split into 3-D sections as the 27B's [11, 11, 10] split 32
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
}
TINY_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5",
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "text_config": TINY_TEXT_CONFIG,
    "tie_word_embeddings": False,
    "dtype": "float32",
}
TEXT_PREFIX = "model.language_model."
_SEED = 0


def tiny_weight_shapes(config: dict[str, Any] = TINY_TEXT_CONFIG) -> dict[str, tuple[int, ...]]:
    """The checkpoint's keys and shapes (transformers' Qwen3.5 text model under `TEXT_PREFIX`, and ``lm_head``)."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    shapes = {
        TEXT_PREFIX + "embed_tokens.weight": (vocab, hidden),
        TEXT_PREFIX + "norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    for i, kind in enumerate(config["layer_types"]):
        layer = _linear_shapes(config) if kind == "linear_attention" else _attention_shapes(config)
        inner = config["intermediate_size"]
        layer |= {
            "mlp.gate_proj.weight": (inner, hidden),
            "mlp.up_proj.weight": (inner, hidden),
            "mlp.down_proj.weight": (hidden, inner),
            "input_layernorm.weight": (hidden,),
            "post_attention_layernorm.weight": (hidden,),
        }
        shapes |= {f"{TEXT_PREFIX}layers.{i}.{name}": shape for name, shape in layer.items()}
    return shapes


def _attention_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    hidden, dim = config["hidden_size"], config["head_dim"]
    q_width, kv_width = config["num_attention_heads"] * dim, config["num_key_value_heads"] * dim
    return {
        "self_attn.q_proj.weight": (2 * q_width, hidden),  # per head: the query, then its output gate
        "self_attn.k_proj.weight": (kv_width, hidden),
        "self_attn.v_proj.weight": (kv_width, hidden),
        "self_attn.o_proj.weight": (hidden, q_width),
        "self_attn.q_norm.weight": (dim,),
        "self_attn.k_norm.weight": (dim,),
    }


def _linear_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    hidden, heads = config["hidden_size"], config["linear_num_value_heads"]
    key_dim = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    value_dim = heads * config["linear_value_head_dim"]
    conv_dim = 2 * key_dim + value_dim
    return {
        "linear_attn.in_proj_qkv.weight": (conv_dim, hidden),
        "linear_attn.in_proj_z.weight": (value_dim, hidden),
        "linear_attn.in_proj_b.weight": (heads, hidden),
        "linear_attn.in_proj_a.weight": (heads, hidden),
        "linear_attn.conv1d.weight": (conv_dim, 1, config["linear_conv_kernel_dim"]),
        "linear_attn.dt_bias": (heads,),
        "linear_attn.A_log": (heads,),
        "linear_attn.norm.weight": (config["linear_value_head_dim"],),
        "linear_attn.out_proj.weight": (hidden, value_dim),
    }


def tiny_state_dict(config: dict[str, Any] = TINY_TEXT_CONFIG) -> dict[str, torch.Tensor]:
    """The float32 weights, drawn from one seeded CPU generator in sorted key order."""
    generator = torch.Generator(device="cpu").manual_seed(_SEED)
    return {key: _draw(key, shape, generator) for key, shape in sorted(tiny_weight_shapes(config).items())}


def _draw(key: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    if key.endswith("A_log"):  # decay rates A in [0.02, 0.3): with dt_bias near -1, exp(g) sits around 0.9
        return torch.log(0.02 + 0.28 * torch.rand(shape, generator=generator))
    normal = torch.randn(shape, generator=generator, dtype=torch.float32)
    if key.endswith("dt_bias"):
        return normal * 0.5 - 1.0
    if key.endswith("linear_attn.norm.weight"):  # the gated norm multiplies by its weight itself
        return 1.0 + normal * 0.1
    if key.endswith("norm.weight"):  # every other norm multiplies by (1 + weight)
        return normal * 0.1
    if key.endswith("embed_tokens.weight"):
        return normal
    if key.endswith("conv1d.weight"):
        return normal * 0.5
    if key == "lm_head.weight":  # wide enough that next-token distributions are far from flat
        return normal * (3.0 / math.sqrt(shape[1]))
    return normal / math.sqrt(shape[1])


def write_tiny_qwen35(folder: str | Path) -> Path:
    """Write the tiny checkpoint's files into ``folder`` (created if needed); return the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG, indent=2) + "\n")
    for name, data in tokenizer_files().items():  # the tiny Gemma's, so transformers tokenizes as the engine does
        (folder / name).write_bytes(data)
    save_file(tiny_state_dict(), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def write_tiny_decider(folder: str | Path) -> Path:
    """Write a tiny decision model into ``folder`` (engine spec A.15): the tiny checkpoint without ``lm_head.weight``
    (its other tensors unchanged) and a readout head (`spinf.engine.qwen35.readout`) of 255 codes at temperature 0.7.

    The codes are ``" yes"`` and ``" no"``, then, in ascending id order, every id whose token decodes to one ASCII
    digit or letter, or to a space and 1 to 6 lowercase ASCII letters, and which that text encodes back to alone,
    until there are 255 (the tokenizer is fixed, so the rule picks the same ids every time)."""
    import re

    from safetensors.torch import load_file

    from spinf.engine.qwen35.readout import write_readout
    from spinf.engine.tokenizer import TextTokenizer

    folder = write_tiny_qwen35(folder)
    weights = load_file(str(folder / "model.safetensors"))
    del weights["lm_head.weight"]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer = TextTokenizer.from_folder(folder)
    num_codes, plain = 255, re.compile(r"[0-9A-Za-z]| [a-z]{1,6}")
    codes = [tokenizer.tok(" yes")[0], tokenizer.tok(" no")[0]]
    for token_id in range(TINY_TEXT_CONFIG["vocab_size"]):
        if len(codes) == num_codes:
            break
        text = tokenizer.decode([token_id])
        if token_id not in codes and plain.fullmatch(text) and tokenizer.tok(text) == (token_id,):
            codes.append(token_id)
    write_readout(folder, hidden_size=TINY_TEXT_CONFIG["hidden_size"], token_ids=codes, temperature=0.7, seed=_SEED)
    return folder


# A small tower of the published layout: the real 16-pixel patches, temporal patch of 2 and 2 x 2 merge (the pixel
# layout of engine spec A.14.3), a narrow width and an 8 x 8 position table (resampled to every image's grid).
TINY_VISION_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5_vision",
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "in_channels": 3,
    "out_hidden_size": TINY_TEXT_CONFIG["hidden_size"],
    "num_position_embeddings": 64,
    "hidden_act": "gelu_pytorch_tanh",
}
# The image markers and placeholder of the tiny tokenizer (the tiny Gemma's <start_of_image>, <end_of_image> and
# <image_soft_token>). It has no video placeholder, and transformers' Qwen3.5 tells image from video placeholders by
# id, so the video one is <audio_soft_token>, a special token the Qwen stack never reads otherwise.
TINY_VISION_TOKENS: dict[str, int] = {
    "vision_start_token_id": 6,
    "vision_end_token_id": 7,
    "image_token_id": 8,
    "video_token_id": 11,
}
_VISION_SEED = 1  # the tower's own stream, so the text weights stay those of `write_tiny_qwen35`


def tiny_vision_state_dict() -> dict[str, torch.Tensor]:
    """The tower's float32 weights under ``model.visual.``, drawn from one seeded CPU generator in sorted key
    order: norms around 1 (weights) and 0 (biases), other biases small, matrices scaled by 1/sqrt(fan-in)."""
    from spinf.engine.qwen35.vision import QwenVisionConfig, vision_weight_shapes

    cfg = QwenVisionConfig.from_dict({"vision_config": TINY_VISION_CONFIG, **TINY_VISION_TOKENS})
    generator = torch.Generator(device="cpu").manual_seed(_VISION_SEED)
    weights = {}
    for key, shape in sorted(vision_weight_shapes(cfg).items()):
        normal = torch.randn(shape, generator=generator, dtype=torch.float32)
        if "norm" in key:
            weights[key] = normal * 0.1 + (1.0 if key.endswith("weight") else 0.0)
        elif key.endswith("bias"):
            weights[key] = normal * 0.1
        elif key.endswith("pos_embed.weight"):
            weights[key] = normal * 0.5
        else:
            weights[key] = normal / math.sqrt(math.prod(shape[1:]))
    return weights


def write_tiny_vision(folder: str | Path) -> Path:
    """Turn the tiny checkpoint that `write_tiny_qwen35` wrote into ``folder`` into one with a vision tower: its
    config gains ``TINY_VISION_CONFIG`` and ``TINY_VISION_TOKENS``, its ``model.safetensors`` the tower's weights
    (the text tensors unchanged). transformers' ``Qwen3_5ForConditionalGeneration`` loads it with no missing or
    unexpected keys. Returns the folder."""
    from safetensors.torch import load_file

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    config |= {"vision_config": TINY_VISION_CONFIG, **TINY_VISION_TOKENS}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights = load_file(str(folder / "model.safetensors")) | tiny_vision_state_dict()
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder
