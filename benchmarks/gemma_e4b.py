"""The Gemma 4 E4B's text shape (per-layer input embeddings, KV-shared layers), for random checkpoints.

Where the numbers come from: NVIDIA Megatron-Bridge's Gemma 4 E4B recipe
(docs.nvidia.com/nemo/megatron-bridge/nightly/apidocs/bridge/bridge.recipes.gemma.h100.gemma4.html, for
``google/gemma-4-E4B-it``): 42 layers, hidden 2,560, MLP 10,240, 8 query heads, 2 KV heads on both kinds (head dim
512 on full layers), five sliding layers then one full, sliding rope theta 10,000 and full 1,000,000 with a quarter
of each head rotating, per-layer inputs 256 wide over a 262,144-id table, keys and values shared by the last 18
layers; and the E4B's ``text_config`` as the Hub's config.json gives it (mirrored in public loaders' tests): head dim
256 on sliding layers, window 512, vocabulary 262,144, ``use_double_wide_mlp`` and ``attention_k_eq_v`` false (so
``num_global_key_value_heads`` is unused), final soft-cap 30, tied embeddings. The folder is a ``gemma4`` checkpoint
(``Gemma4ForConditionalGeneration``, the text model under ``model.language_model.``) without the vision and audio
towers, which the engine does not read for scoring; the shared layers hold no k/v weights, as transformers saves
them (the Hub's files keep unused ones, which the loader leaves unread either way).

`scaled_e4b` shrinks it for CPU runs keeping what the fused path must handle: two periods of five sliding and one
full layer, the last four KV-shared (so both kinds are read from an earlier layer), per-layer inputs 16 wide.
`truncated_e4b` keeps the first layers at full width, as the ``layers`` setting would: the first 24 layers make their
own keys, so only a cut beyond 24 keeps shared layers. ``python benchmarks/gemma_e4b.py`` prints the parameter counts.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gemma12b import decoder_linear_params, truncated  # noqa: E402
from spinf.engine.gemma4.tiny import TINY_CONFIG  # noqa: E402

NUM_LAYERS = 42
NUM_SHARED = 18  # the last 18 layers read the keys and values of layers 22 (sliding) and 23 (full)
GEMMA_E4B_TEXT_CONFIG: dict[str, Any] = {
    **TINY_CONFIG,  # the rope parameters, special ids, activation and norm epsilon are the real model's
    "model_type": "gemma4_text",
    "architectures": ["Gemma4ForCausalLM"],
    "vocab_size": 262_144,
    "hidden_size": 2560,
    "intermediate_size": 10_240,
    "num_hidden_layers": NUM_LAYERS,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "global_head_dim": 512,
    "num_global_key_value_heads": None,
    "attention_k_eq_v": False,
    "sliding_window": 512,
    "final_logit_softcapping": 30.0,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * (NUM_LAYERS // 6),
    "max_position_embeddings": 131_072,
    "hidden_size_per_layer_input": 256,
    "vocab_size_per_layer_input": 262_144,
    "num_kv_shared_layers": NUM_SHARED,
    "use_double_wide_mlp": False,
    "enable_moe_block": False,
    "dtype": "bfloat16",
}


def scaled_e4b(*, periods: int = 2, hidden: int = 64, vocab: int = 8192, window: int = 16) -> dict[str, Any]:
    """The E4B shrunk for CPU runs: ``periods`` × (five sliding, one full) layers, the last four KV-shared,
    ``hidden`` wide with 4 query heads and 2 KV heads (dims 32 and 64), a 4× MLP, per-layer inputs 16 wide over
    ``vocab`` ids (the tiny tokenizer's are below 8192) and a ``window``-token sliding window."""
    return {
        **GEMMA_E4B_TEXT_CONFIG,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": 4 * hidden,
        "num_hidden_layers": 6 * periods,
        "num_attention_heads": 4,
        "head_dim": 32,
        "global_head_dim": 64,
        "sliding_window": window,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * periods,
        "max_position_embeddings": 4096,
        "hidden_size_per_layer_input": 16,
        "vocab_size_per_layer_input": vocab,
        "num_kv_shared_layers": 4,
    }


def truncated_e4b(layers: int) -> dict[str, Any]:
    """The E4B's first ``layers`` layers at full width: its shared layers among them still read layer 22 or 23, so
    below 25 layers none is shared (and below 6 the last layer is a full one, as `truncated` makes it)."""
    cut = truncated(GEMMA_E4B_TEXT_CONFIG, layers)
    return {**cut, "num_kv_shared_layers": max(0, layers - (NUM_LAYERS - NUM_SHARED))}


if __name__ == "__main__":
    config = GEMMA_E4B_TEXT_CONFIG
    linears = decoder_linear_params(config)
    table = config["vocab_size_per_layer_input"] * NUM_LAYERS * config["hidden_size_per_layer_input"]
    embedding = config["vocab_size"] * config["hidden_size"]
    print(f"E4B text: {linears:,} decoder linear parameters (the per-layer inputs' projections among them),")
    print(f"  {table:,} in the per-layer table, {embedding:,} in the embedding (tied head)")
    print(f"  bf16 checkpoint about {2 * (linears + table + embedding) / 2**30:.1f} GiB (norms aside)")
