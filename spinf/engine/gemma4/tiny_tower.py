"""A tiny checkpoint in the 31B's layout (``gemma4``: the text model beside a vision tower) for the tower's tests.

This module owns that checkpoint: its ``config.json`` (the tiny text model of `spinf.engine.gemma4.tiny.TINY_CONFIG` as
a ``gemma4_text`` config with the fields a 31B text config has, a 2-layer 32-wide tower with the real 16-pixel
patches, 3 x 3 pooling and position table, the tiny tokenizer's media token ids), its float32 weights (the text
model's drawn by `spinf.engine.gemma4.tiny.tiny_state_dict`, the tower's from a seeded generator of its own in sorted
key order of `spinf.engine.gemma4.tower.tower_weight_shapes`, both without transformers, so the same bytes on every
call), and the tiny tokenizer's files. transformers' ``Gemma4ForConditionalGeneration`` loads it with no key missing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from spinf.engine.gemma4.tiny import TINY_CONFIG, TINY_MEDIA_TOKENS, snapshot_files, tiny_state_dict
from spinf.engine.gemma4.tower import TowerConfig, tower_weight_shapes

TINY_TOWER_TEXT: dict[str, Any] = {
    **{k: v for k, v in TINY_CONFIG.items() if k not in ("architectures", "dtype")},
    "model_type": "gemma4_text",
    # What a 31B text config says beside the tiny model's fields (benchmarks/gemma31b.py): no per-layer inputs,
    # no shared KV layers, no experts, the plain MLP.
    "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0,
    "enable_moe_block": False,
    "use_double_wide_mlp": False,
}
TINY_TOWER_VISION: dict[str, Any] = {
    "model_type": "gemma4_vision",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "patch_size": 16,
    "pooling_kernel_size": 3,
    "position_embedding_size": 10 * 1024,
    "use_clipped_linears": False,
    "standardize": True,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0},
}
TINY_TOWER_CONFIG: dict[str, Any] = {
    "model_type": "gemma4",
    "architectures": ["Gemma4ForConditionalGeneration"],
    "text_config": TINY_TOWER_TEXT,
    "vision_config": TINY_TOWER_VISION,
    "audio_config": None,
    "vision_soft_tokens_per_image": 280,
    **TINY_MEDIA_TOKENS,
    "tie_word_embeddings": True,
    "dtype": "float32",
}
TEXT_PREFIX = "model.language_model."
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
_SEED = 2  # the tower's own stream (gemma4.tiny draws the text model from 0, its unified embedders from 1)


def tower_state_dict() -> dict[str, torch.Tensor]:
    """The tower's float32 weights: norms and the standardiser's scale ``1 + N(0, 0.1²)``, its bias ``N(0, 0.1²)``,
    the position table ``N(0, 0.5²)`` (positions matter beside unit-scale patch states), matrices ``N(0, 1/in)``."""
    generator = torch.Generator(device="cpu").manual_seed(_SEED)
    shapes = tower_weight_shapes(TowerConfig.from_dict(TINY_TOWER_VISION), TINY_TOWER_TEXT["hidden_size"])
    weights = {}
    for key, shape in sorted(shapes.items()):
        normal = torch.randn(shape, generator=generator, dtype=torch.float32)
        if key.endswith("std_bias"):
            weights[key] = normal * 0.1
        elif len(shape) == 1:
            weights[key] = 1.0 + normal * 0.1
        elif key.endswith("position_embedding_table"):
            weights[key] = normal * 0.5
        else:
            weights[key] = normal / math.sqrt(shape[-1])
    return weights


def write_tiny_tower(folder: str | Path) -> Path:
    """The tiny 31B-layout checkpoint written into ``folder`` (made if missing); returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    text = {TEXT_PREFIX + key.removeprefix("model."): value for key, value in tiny_state_dict(TINY_TOWER_TEXT).items()}
    save_file({**text, **tower_state_dict()}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(TINY_TOWER_CONFIG, indent=2) + "\n", encoding="utf-8")
    files = snapshot_files()
    for name in _TOKENIZER_FILES:
        (folder / name).write_bytes(files[name])
    return folder
