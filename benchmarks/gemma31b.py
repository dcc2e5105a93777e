"""The Gemma 4 31B's shape (engine spec B.19: ``gemma4``, the text model plus a vision tower), for random checkpoints.

The shape is transformers' own: ``_VARIANTS["gemma-4-31b"]`` and ``_LARGE_MODEL_VISION_CONFIG`` in
src/transformers/models/gemma4/convert_gemma4_weights.py (huggingface/transformers, the script that converts
Google's checkpoints), with the `Gemma4TextConfig` defaults it leaves as they are (head dim 256, global head dim 512,
vocabulary 262,144). Text (``gemma4_text``): 60 layers, five sliding-window layers (window 1,024; 16 KV heads of dim
256) then one full-attention layer (4 KV heads of dim 512 whose keys also serve as values, ``attention_k_eq_v``,
so no ``v_proj``; proportional rope over a quarter of each head), ten times over, the last layer full; 32 query
heads; hidden 5,376; MLP 21,504 (4 × hidden); tied embeddings; final soft-cap 30; no per-layer input embeddings,
no shared KV layers, no experts. Vision (``gemma4_vision``): 27 layers, hidden 1,152, MLP 4,304, 16 heads (and KV
heads) of dim 72, 16-pixel patches, 3 × 3 pooling, standardised output, no clipped linears; 280 soft tokens per
image. Checkpoint names: the text model under ``model.language_model.``, the tower under ``model.vision_tower.``
and its projection into the text model under ``model.embed_vision.``.

`vision_weight_shapes` writes the tower's state-dict shapes out by hand (as
`spinf.engine.gemma4.tiny.tiny_weight_shapes` does the text model's), so a writer needs no transformers;
tests/benchmarks/test_checkpoint.py checks them against transformers' own model. `scaled_31b` shrinks both, keeping the
layer pattern, the head-count ratios (2 query heads per KV head on sliding layers, 8 on full ones, and more than one KV
head there) and the global head dim at twice the sliding one. ``python benchmarks/gemma31b.py`` prints the parameter
counts and the weight bytes under fp8s (benchmarks/gemma31b.md has the figures).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gemma12b import decoder_linear_params  # noqa: E402
from spinf.engine.gemma4.tiny import TINY_CONFIG  # noqa: E402

NUM_LAYERS = 60
GEMMA_31B_TEXT_CONFIG: dict[str, Any] = {
    **TINY_CONFIG,  # the rope parameters, special ids, activation and norm epsilon are the real model's
    "model_type": "gemma4_text",
    "architectures": ["Gemma4ForCausalLM"],
    "vocab_size": 262_144,
    "hidden_size": 5376,
    "intermediate_size": 4 * 5376,
    "num_hidden_layers": NUM_LAYERS,
    "num_attention_heads": 32,
    "num_key_value_heads": 16,
    "head_dim": 256,
    "global_head_dim": 512,
    "num_global_key_value_heads": 4,
    "attention_k_eq_v": True,
    "sliding_window": 1024,
    "final_logit_softcapping": 30.0,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * (NUM_LAYERS // 6),
    "max_position_embeddings": 262_144,
    "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0,
    "enable_moe_block": False,
    "use_double_wide_mlp": False,
    "dtype": "bfloat16",
}
GEMMA_31B_VISION_CONFIG: dict[str, Any] = {
    "model_type": "gemma4_vision",
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 72,
    "patch_size": 16,
    "pooling_kernel_size": 3,
    "position_embedding_size": 10 * 1024,
    "use_clipped_linears": False,
    "standardize": True,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-06,
    "dtype": "bfloat16",
}
SOFT_TOKENS_PER_IMAGE = 280
VISION_PREFIX = "model.vision_tower."
PROJECTION = "model.embed_vision.embedding_projection.weight"  # [text hidden, vision hidden]
_NUM_CHANNELS = 3


def vision_weight_shapes(vision: dict[str, Any], text_hidden: int) -> dict[str, tuple[int, ...]]:
    """Checkpoint names and shapes of the vision tower and its projection (`Gemma4VisionModel`, no clipped
    linears), written out by hand."""
    hidden, inner, dim = vision["hidden_size"], vision["intermediate_size"], vision["head_dim"]
    q_width, kv_width = vision["num_attention_heads"] * dim, vision["num_key_value_heads"] * dim
    shapes: dict[str, tuple[int, ...]] = {
        PROJECTION: (text_hidden, hidden),
        VISION_PREFIX + "patch_embedder.input_proj.weight": (hidden, _NUM_CHANNELS * vision["patch_size"] ** 2),
        VISION_PREFIX + "patch_embedder.position_embedding_table": (2, vision["position_embedding_size"], hidden),
    }
    if vision.get("standardize"):
        shapes[VISION_PREFIX + "std_bias"] = (hidden,)
        shapes[VISION_PREFIX + "std_scale"] = (hidden,)
    layer = {
        "self_attn.q_proj.linear.weight": (q_width, hidden),
        "self_attn.k_proj.linear.weight": (kv_width, hidden),
        "self_attn.v_proj.linear.weight": (kv_width, hidden),
        "self_attn.o_proj.linear.weight": (hidden, q_width),
        "self_attn.q_norm.weight": (dim,),
        "self_attn.k_norm.weight": (dim,),
        "mlp.gate_proj.linear.weight": (inner, hidden),
        "mlp.up_proj.linear.weight": (inner, hidden),
        "mlp.down_proj.linear.weight": (hidden, inner),
        **{f"{norm}_layernorm.weight": (hidden,) for norm in ("input", "post_attention")},
        **{f"{norm}_feedforward_layernorm.weight": (hidden,) for norm in ("pre", "post")},
    }
    for i in range(vision["num_hidden_layers"]):
        shapes.update({f"{VISION_PREFIX}encoder.layers.{i}.{name}": shape for name, shape in layer.items()})
    return shapes


def random_vision_tensors(
    vision: dict[str, Any],
    text_hidden: int,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Random weights for `vision_weight_shapes`, one at a time in sorted order from one generator: 1-d tensors
    ``1 + N(0, 0.1²)`` (norms, the standardiser's scale; its bias too, harmlessly), the rest ``N(0, 1/last dim)``.
    The engine never reads them; they make the folder the size and layout of a real one."""
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    for key, shape in sorted(vision_weight_shapes(vision, text_hidden).items()):
        t = torch.randn(shape, generator=generator, device=device, dtype=dtype)
        if len(shape) == 1:
            t.mul_(0.1).add_(1.0)
        else:
            t.mul_(1 / math.sqrt(shape[-1]))
        yield key, t


def gemma4_config(text_config: dict[str, Any], vision_config: dict[str, Any] | None, dtype: torch.dtype) -> dict:
    """``config.json`` of a ``gemma4`` checkpoint: the text config nested, the vision tower's (or none), no audio."""
    name = str(dtype).removeprefix("torch.")
    return {
        "model_type": "gemma4",
        "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": {**{k: v for k, v in text_config.items() if k != "architectures"}, "dtype": name},
        "vision_config": None if vision_config is None else {**vision_config, "dtype": name},
        "audio_config": None,
        "vision_soft_tokens_per_image": SOFT_TOKENS_PER_IMAGE,
        "tie_word_embeddings": True,
        "dtype": name,
    }


def scaled_31b(
    *, periods: int = 2, hidden: int = 64, vocab: int = 8192, window: int = 16
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The 31B's text and vision configs shrunk for CPU tests: ``periods`` × (five sliding, one full) layers,
    ``hidden`` wide with 16 query heads (8 KV heads of dim 32 on sliding layers, 2 of dim 64 on full ones), a 4×
    MLP, ``vocab`` ids (the tiny tokenizer's ids are below 8192) and a ``window``-token sliding window; a 2-layer,
    32-wide tower."""
    text = {
        **GEMMA_31B_TEXT_CONFIG,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": 4 * hidden,
        "num_hidden_layers": 6 * periods,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 32,
        "global_head_dim": 64,
        "num_global_key_value_heads": 2,
        "sliding_window": window,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * periods,
        "max_position_embeddings": 4096,
    }
    vision = {
        **GEMMA_31B_VISION_CONFIG,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "position_embedding_size": 64,
    }
    return text, vision


def weight_bytes(text: dict[str, Any] = GEMMA_31B_TEXT_CONFIG, vision: dict[str, Any] | None = None) -> dict:
    """Bytes of the weights on the device under fp8s: decoder linears at 1 byte each, the embedding (tied head),
    the norms and the layer scalars in bf16, and the vision tower (not loaded by this build) in bf16 if given."""
    from spinf.engine.gemma4.tiny import tiny_weight_shapes

    shapes = tiny_weight_shapes(text)
    linears = decoder_linear_params(text)
    embedding = math.prod(shapes["model.embed_tokens.weight"])
    small = sum(math.prod(s) for k, s in shapes.items() if not k.endswith("_proj.weight")) - embedding
    tower = sum(math.prod(s) for s in vision_weight_shapes(vision, text["hidden_size"]).values()) if vision else 0
    return {
        "linear_params": linears,
        "embedding_params": embedding,
        "other_params": small,
        "vision_params": tower,
        "fp8s_text_bytes": linears + 2 * (embedding + small),
        "bf16_text_bytes": 2 * (linears + embedding + small),
        "vision_bf16_bytes": 2 * tower,
    }


if __name__ == "__main__":
    found = weight_bytes(GEMMA_31B_TEXT_CONFIG, GEMMA_31B_VISION_CONFIG)
    gib = 2**30
    print(f"31B text: {found['linear_params']:,} decoder linear parameters, {found['embedding_params']:,} in the")
    print(f"  embedding (tied head), {found['other_params']:,} in norms and layer scalars")
    print(f"  fp8s on the device: {found['fp8s_text_bytes']:,} bytes ({found['fp8s_text_bytes'] / gib:.2f} GiB)")
    print(f"  bf16 checkpoint: {found['bf16_text_bytes']:,} bytes ({found['bf16_text_bytes'] / gib:.2f} GiB)")
    print(f"vision tower: {found['vision_params']:,} parameters, {found['vision_bf16_bytes'] / gib:.2f} GiB in bf16")
