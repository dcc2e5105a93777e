"""The 12B Gemma 4 "unified" text model's shape (engine spec B.19), built with random weights on any device.

``GEMMA_12B_TEXT_CONFIG`` is a ``gemma4_unified_text`` config in the 12B shape: 48 layers, every 6th (5, 11, …, 47)
a full-attention layer with head dim 512 and one KV head whose keys also serve as values; sliding layers (window
1024) with 8 KV heads of dim 256; 16 query heads; hidden 3840; vocabulary 262,144; tied embeddings; soft-cap 30.

Both builders draw the same checkpoint-named tensors (`random_tensors`) from one seeded generator on the target
device, so nothing is downloaded and transformers' model (`build_random_transformers_model`) and ours
(`build_random_engine_model`) hold identical weights for a given device, dtype and seed; `benchmarks.checkpoint`
writes the same tensors to a checkpoint folder, which is how the benchmarks give them to the engine. Modules are
built on ``meta`` and the tensors assigned. `scaled` shrinks the shape so the same code runs on a CPU in tests;
`truncated` keeps the width and drops layers. ``python benchmarks/gemma12b.py`` prints the decoder's linear
parameter count.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.baseline import assign_weights  # noqa: E402
from spinf.engine.gemma4.config import TextConfig, parse_text_config  # noqa: E402
from spinf.engine.gemma4.loading import _layer_state  # noqa: E402
from spinf.engine.gemma4.model import Gemma4Text  # noqa: E402
from spinf.engine.gemma4.tiny import TINY_CONFIG, tiny_weight_shapes  # noqa: E402

NUM_LAYERS = 48
GEMMA_12B_TEXT_CONFIG: dict[str, Any] = {
    **TINY_CONFIG,  # the rope parameters, special ids, activation and norm epsilon are the real model's
    "vocab_size": 262_144,
    "hidden_size": 3840,
    "intermediate_size": 15_360,
    "num_hidden_layers": NUM_LAYERS,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "global_head_dim": 512,
    "num_global_key_value_heads": 1,
    "attention_k_eq_v": True,
    "sliding_window": 1024,
    "final_logit_softcapping": 30.0,
    "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(NUM_LAYERS)],
    "dtype": "bfloat16",
}
# engine spec B.19: "about 10.9 B parameters sit in the decoder's linear layers"
EXPECTED_LINEAR_PARAMS = 10.9e9

_NORM_STD = 0.1  # Gemma 4 norms multiply by the weight itself, so the weights sit around 1


def decoder_linear_params(config: dict[str, Any] | TextConfig) -> int:
    """Weights of the decoder's linear layers (q, k, v, o, gate, up, down; a KV-shared layer's q and o only, and
    the per-layer inputs' projections of the E2B/E4B); embeddings and norms not counted."""
    cfg = config if isinstance(config, TextConfig) else parse_text_config(config)
    hidden = cfg.hidden_size
    total = 3 * len(cfg.layers) * cfg.per_layer_size * hidden  # the table's projection, each gate and projection
    for spec in cfg.layers:
        q_out, kv_out = cfg.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        kv = 0 if spec.kv_shared else kv_out * (1 if spec.k_eq_v else 2)
        inner = cfg.intermediate_size * (2 if spec.wide_mlp else 1)
        total += hidden * (q_out + kv) + q_out * hidden + 3 * hidden * inner
    if cfg.num_experts:  # the router and the experts one token reaches: what a token multiplies
        total += len(cfg.layers) * hidden * (cfg.num_experts + 3 * cfg.top_k_experts * cfg.moe_intermediate_size)
    return total


def check_12b_shape(config: dict[str, Any] = GEMMA_12B_TEXT_CONFIG) -> int:
    """The linear parameter count, after checking it is the spec's "about 10.9 B" (within 0.5 %)."""
    count = decoder_linear_params(config)
    if abs(count / EXPECTED_LINEAR_PARAMS - 1) > 0.005:
        raise ValueError(f"the config has {count:,} decoder linear parameters, not about 10.9 B")
    return count


def scaled(
    config: dict[str, Any] = GEMMA_12B_TEXT_CONFIG,
    *,
    layers: int = 2,
    hidden: int = 64,
    vocab: int | None = 8192,
    window: int | None = None,
) -> dict[str, Any]:
    """The same architecture shrunk for CPU tests: ``layers`` layers (the last one full attention, as in the real
    model), ``hidden`` wide with 4 query heads, a 4× MLP, head dims 32/64, and ``vocab`` ids (None keeps it).

    The tiny tokenizer's ids are below 8192, so the default vocabulary still fits every token the benchmarks send.
    """
    return {
        **config,
        "hidden_size": hidden,
        "intermediate_size": 4 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "global_head_dim": 64,
        "layer_types": [
            "full_attention" if (i + 1) % 6 == 0 or i == layers - 1 else "sliding_attention" for i in range(layers)
        ],
        "vocab_size": vocab or config["vocab_size"],
        "sliding_window": window or config["sliding_window"],
    }


def truncated(config: dict[str, Any] = GEMMA_12B_TEXT_CONFIG, layers: int = NUM_LAYERS) -> dict[str, Any]:
    """The 12B shape at full width with only its first ``layers`` layers; below 6 the last one is a full-attention
    layer (as in `scaled`), so both layer kinds and both attention kernels still run."""
    kinds = config["layer_types"][:layers]
    if "full_attention" not in kinds:
        kinds = [*kinds[:-1], "full_attention"]
    return {**config, "num_hidden_layers": layers, "layer_types": kinds}


def random_tensors(
    config: dict[str, Any] = GEMMA_12B_TEXT_CONFIG,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Random weights under the checkpoint's names (``model.embed_tokens.weight`` …), drawn on ``device`` one at a
    time, so a writer holds one tensor on the device at once.

    Sensible scales: linears ``N(0, 1/in)``, norms ``1 + N(0, 0.1²)``, the embedding ``N(0, 1/hidden)`` (unit
    scale once multiplied by sqrt(hidden) on the way in), layer scalars 1. Keys are drawn in sorted order from
    one generator, so the bytes depend only on the config, device, dtype and seed.
    """
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    hidden = config["hidden_size"]
    for key, shape in sorted(tiny_weight_shapes(config).items()):
        if key.endswith("layer_scalar"):
            yield key, torch.ones(shape, device=device, dtype=dtype)
            continue
        t = torch.randn(shape, generator=generator, device=device, dtype=dtype)
        if key == "model.embed_tokens.weight":
            t.mul_(1 / math.sqrt(hidden))
        elif key == "model.embed_tokens_per_layer.weight":  # unit scale once multiplied by sqrt(its width)
            t.mul_(1 / math.sqrt(config["hidden_size_per_layer_input"]))
        elif key.endswith("norm.weight") or len(shape) == 1:  # norms, and the router's scales (26B A4B)
            t.mul_(_NORM_STD).add_(1.0)
        else:  # a linear layer: ([experts,] out_features, in_features)
            t.mul_(1 / math.sqrt(shape[-1]))
        yield key, t


def random_checkpoint(
    config: dict[str, Any] = GEMMA_12B_TEXT_CONFIG,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Every tensor of `random_tensors` at once, by name."""
    return dict(random_tensors(config, device=device, dtype=dtype, seed=seed))


def build_random_engine_model(
    device: str | torch.device,
    dtype: torch.dtype,
    *,
    config: dict[str, Any] = GEMMA_12B_TEXT_CONFIG,
    seed: int = 0,
) -> Gemma4Text:
    """Our `Gemma4Text` on ``device`` with `random_checkpoint`'s weights, fused as `load_gemma4_text` fuses them."""
    cfg = parse_text_config(config)
    drawn = random_checkpoint(config, device=device, dtype=dtype, seed=seed)
    raw = {key.removeprefix("model."): drawn.pop(key) for key in list(drawn)}
    state = {"embed.weight": raw.pop("embed_tokens.weight"), "final_norm": raw.pop("norm.weight")}
    for i, spec in enumerate(cfg.layers):
        state.update({f"layers.{i}.{k}": v for k, v in _layer_state(raw, i, spec).items()})
    if raw:
        raise ValueError(f"random weights the engine model does not use: {sorted(raw)}")
    with torch.device("meta"):
        model = Gemma4Text(cfg)
    model.load_state_dict(state, assign=True, strict=True)
    return model.eval()


def transformers_config(config: dict[str, Any] = GEMMA_12B_TEXT_CONFIG):
    """transformers' config object for a text-config dict."""
    from transformers import AutoConfig

    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    return AutoConfig.for_model(config["model_type"], **kwargs)


def build_random_transformers_model(
    device: str | torch.device,
    dtype: torch.dtype,
    *,
    config: dict[str, Any] = GEMMA_12B_TEXT_CONFIG,
    seed: int = 0,
    attn_implementation: str | None = None,
    state: dict[str, torch.Tensor] | None = None,
):
    """transformers' ``AutoModelForCausalLM`` for ``config`` on ``device``, holding `random_checkpoint`'s weights
    (or ``state``, under the same names: a checkpoint folder's, `benchmarks.checkpoint.text_state`).

    Built on ``meta``; the buffers that are not weights (rope frequencies, the embedding scale) are recreated on
    ``device`` by the model's own initialiser, then the weights are assigned and the head tied.
    """
    from transformers import AutoModelForCausalLM

    device = torch.device(device)
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(transformers_config(config), dtype=dtype, **extra)
    if state is None:
        state = random_checkpoint(config, device=device, dtype=dtype, seed=seed)
    else:
        state = {key: t.to(device=device, dtype=dtype) for key, t in state.items()}
    return assign_weights(model, state, device, tied=("lm_head.weight",))


if __name__ == "__main__":
    count = check_12b_shape()
    print(f"12B shape: {count:,} decoder linear parameters ({count / 1e9:.2f} B; engine spec B.19: about 10.9 B)")
