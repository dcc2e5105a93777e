"""The Gemma 4 26B A4B's text shape (``enable_moe_block``: 128 experts beside every layer's MLP), for random
checkpoints.

The dimensions are those of the published ``google/gemma-4-26B-A4B`` checkpoint's ``config.json`` (its
``text_config``, as public repositories that read that file quote it): 30 layers, five sliding-window layers
(window 1,024; 8 KV heads of dim 256) then one full-attention layer (2 KV heads of dim 512 whose keys also serve as
values, ``attention_k_eq_v``; proportional rope over a quarter of each head), five times; 16 query heads; hidden
2,816; a dense MLP 2,112 wide in every layer and beside it 128 experts 704 wide, of which each token reaches 8
(``top_k_experts``); vocabulary 262,144; tied embeddings; final soft-cap 30; no per-layer input embeddings, no
shared KV layers. The rope parameters, special ids, activation and norm epsilon are those every Gemma 4 shares
(`spinf.engine.gemma4.tiny.TINY_CONFIG`). The Hub's folder holds a vision tower beside the text model, which the engine
does not read; the benchmarks write the text model alone, in the same ``gemma4`` layout
(`benchmarks.gemma31b.gemma4_config`).

`scaled_26b` shrinks it for CPU runs, keeping the layer pattern, the head ratios and experts that outnumber the
chosen. ``python benchmarks/gemma26b.py`` prints the parameter counts: all, and those one token multiplies.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gemma12b import decoder_linear_params  # noqa: E402
from spinf.engine.gemma4.tiny import TINY_CONFIG  # noqa: E402

NUM_LAYERS = 30
GEMMA_26B_A4B_TEXT_CONFIG: dict[str, Any] = {
    **TINY_CONFIG,
    "model_type": "gemma4_text",
    "architectures": ["Gemma4ForCausalLM"],
    "vocab_size": 262_144,
    "hidden_size": 2816,
    "intermediate_size": 2112,
    "num_hidden_layers": NUM_LAYERS,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "global_head_dim": 512,
    "num_global_key_value_heads": 2,
    "attention_k_eq_v": True,
    "sliding_window": 1024,
    "final_logit_softcapping": 30.0,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * (NUM_LAYERS // 6),
    "max_position_embeddings": 262_144,
    "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0,
    "use_double_wide_mlp": False,
    "enable_moe_block": True,
    "num_experts": 128,
    "top_k_experts": 8,
    "moe_intermediate_size": 704,
    "dtype": "bfloat16",
}


def scaled_26b(*, periods: int = 1, hidden: int = 64, vocab: int = 8192, window: int = 16) -> dict[str, Any]:
    """The 26B A4B shrunk for CPU runs: ``periods`` × (five sliding, one full) layers, ``hidden`` wide with 8 query
    heads (4 KV heads of dim 32 on sliding layers, 1 of dim 64 on full ones), a dense MLP of ``hidden`` and 16
    experts of ``hidden`` / 4 with 4 chosen, ``vocab`` ids (the tiny tokenizer's are below 8192), a ``window``-token
    window."""
    return {
        **GEMMA_26B_A4B_TEXT_CONFIG,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": hidden,
        "num_hidden_layers": 6 * periods,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "global_head_dim": 64,
        "num_global_key_value_heads": 1,
        "sliding_window": window,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * periods,
        "max_position_embeddings": 4096,
        "num_experts": 16,
        "top_k_experts": 4,
        "moe_intermediate_size": hidden // 4,
    }


def expert_params(config: dict[str, Any] = GEMMA_26B_A4B_TEXT_CONFIG) -> int:
    """Every expert's weights over all layers (gate, up and down of each), the router's not counted."""
    per_expert = 3 * config["hidden_size"] * config["moe_intermediate_size"]
    return config["num_hidden_layers"] * config["num_experts"] * per_expert


if __name__ == "__main__":
    config = GEMMA_26B_A4B_TEXT_CONFIG
    active = decoder_linear_params(config)
    idle = expert_params(config) * (config["num_experts"] - config["top_k_experts"]) // config["num_experts"]
    print(f"decoder linear parameters: {active + idle:,} in all, {active:,} multiplied per token")
