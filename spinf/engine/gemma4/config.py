"""The text-model configuration the engine needs, read from a checkpoint's ``config.json``.

Reading the JSON ourselves (instead of through transformers' config classes) keeps the engine independent of how
a given transformers release serialises Gemma 4's per-layer overrides: older files carry ``global_head_dim`` and
``num_global_key_value_heads``, newer ones a ``per_layer_config`` table. Both give the same `TextConfig`.

Two layouts are served: the "unified" 12B (``gemma4_unified``) and the 31B (``gemma4``, transformers'
``Gemma4ForConditionalGeneration``), each with its text config nested under ``text_config`` and its text weights
under ``model.language_model.``; the vision tower's weights beside them (``model.vision_tower.``,
``model.embed_vision.``) are not read. A bare text config (``gemma4_text``, ``gemma4_unified_text``) has its
weights under ``model.``. The small models (E2B/E4B) bring per-layer input embeddings (`TextConfig.per_layer_size`)
and KV-shared layers (`LayerSpec.kv_shared`, with double-wide MLPs there when the config asks). The 26B A4B's
mixture-of-experts blocks (``enable_moe_block``: `TextConfig.num_experts` experts beside every layer's MLP,
`LayerSpec.moe`) run in `spinf.engine.gemma4.moe`. Bidirectional text attention, which this decoder does not implement,
is refused by name rather than silently run without.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs

from spinf.catalog.resolve import read_config
from spinf.engine.folder import check_sizes, config_in_file
from spinf.errors import ModelError

GEMMA4_TEXT_TYPES = ("gemma4_unified_text", "gemma4_text")
GEMMA4_TYPES = ("gemma4_unified", "gemma4")
# transformers' defaults where a key is absent (gemma4_text turns per-layer embeddings on by default)
DEFAULTS = {"gemma4_text": {"hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262_144}}


@attrs.frozen
class LayerSpec:
    """One decoder layer's attention shape."""

    is_sliding: bool
    head_dim: int
    num_kv_heads: int
    k_eq_v: bool  # the layer has no v projection: its (un-normed) keys serve as values
    rope_theta: float
    rope_fraction: float  # share of each head's dimensions that rotate ("proportional" rope)
    # the layer computes no keys and values: it attends with those of the last non-shared layer of its kind (the
    # last ``num_kv_shared_layers`` layers of the E2B/E4B models)
    kv_shared: bool = False
    wide_mlp: bool = False  # the MLP is twice ``intermediate_size`` wide (``use_double_wide_mlp``, shared layers)
    moe: bool = False  # experts beside the MLP (``enable_moe_block``, the 26B A4B: `spinf.engine.gemma4.moe`)


@attrs.frozen
class TextConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    layers: tuple[LayerSpec, ...]
    sliding_window: int
    rms_norm_eps: float
    final_logit_softcapping: float | None
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...] = ()  # the config's eos_token_id (an int or a list)
    # per-layer input embeddings (E2B/E4B): each layer's width and the table's rows; 0: none
    per_layer_size: int = 0
    per_layer_vocab: int = 0
    pad_token_id: int = 0  # the per-layer table's row for a media placeholder (transformers looks up the pad token)
    # the mixture-of-experts blocks (26B A4B): experts, how many each token reaches, each expert's MLP width; 0: none
    num_experts: int = 0
    top_k_experts: int = 0
    moe_intermediate_size: int = 0


def read_text_config(folder: str | Path) -> tuple[TextConfig, str]:
    """The text config of the checkpoint in ``folder`` and the weight-name prefix of its text model."""
    path = Path(folder) / "config.json"
    return config_in_file(path, _text_config, read_config(Path(folder)))


def _text_config(raw: dict) -> tuple[TextConfig, str]:
    model_type = raw.get("model_type")
    if model_type in GEMMA4_TYPES:
        text = dict(raw.get("text_config") or {})
        text.setdefault("tie_word_embeddings", raw.get("tie_word_embeddings", True))
        text.setdefault("eos_token_id", raw.get("eos_token_id"))
        config = parse_text_config(text), "model.language_model."
    elif model_type in GEMMA4_TEXT_TYPES:
        config = parse_text_config(raw), "model."
    else:
        raise ModelError(f"model_type {model_type!r} is not a Gemma 4 model; this engine serves Gemma 4")
    check_sizes(config[0], ("vocab_size", "hidden_size", "intermediate_size", "num_heads", "sliding_window"))
    for layer in config[0].layers:
        check_sizes(layer, ("head_dim", "num_kv_heads"))
    if config[0].per_layer_size:
        check_sizes(config[0], ("per_layer_size", "per_layer_vocab"))
    if any(layer.moe for layer in config[0].layers):
        check_sizes(config[0], ("num_experts", "top_k_experts", "moe_intermediate_size"))
        if config[0].top_k_experts > config[0].num_experts:
            raise ModelError(f"top_k_experts = {config[0].top_k_experts} is more than num_experts")
    return config


def parse_text_config(raw: dict) -> TextConfig:
    """A `TextConfig` from a Gemma 4 text-config dict (either serialisation of the per-layer overrides)."""
    check_supported(raw)
    layer_types = raw.get("layer_types") or [
        "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(raw["num_hidden_layers"])
    ]
    rope = raw.get("rope_parameters") or {}
    overrides = {int(k): v for k, v in (raw.get("per_layer_config") or {}).items()}
    global_head_dim = raw.get("global_head_dim", 512)
    k_eq_v = bool(raw.get("attention_k_eq_v", False))
    global_kv = raw.get("num_global_key_value_heads") if k_eq_v else None
    shared = kv_shared_layers(raw, layer_types)
    wide = bool(raw.get("use_double_wide_mlp", False))
    moe = bool(raw.get("enable_moe_block", False))
    layers = []
    for i, kind in enumerate(layer_types):
        sliding = kind == "sliding_attention"
        head_dim, kv_heads = raw.get("head_dim", 256), raw["num_key_value_heads"]
        if not sliding:
            override = overrides.get(i, {"head_dim": global_head_dim, "num_key_value_heads": global_kv})
            head_dim = override.get("head_dim") or head_dim
            kv_heads = override.get("num_key_value_heads") or kv_heads
        params = rope.get(kind) or {}
        fraction = params.get("partial_rotary_factor", 1.0) if params.get("rope_type") == "proportional" else 1.0
        layers.append(
            LayerSpec(
                is_sliding=sliding,
                head_dim=head_dim,
                num_kv_heads=kv_heads,
                k_eq_v=k_eq_v and not sliding,
                rope_theta=float(params.get("rope_theta", 10_000.0 if sliding else 1_000_000.0)),
                rope_fraction=float(fraction),
                kv_shared=i in shared,
                wide_mlp=wide and i in shared,
                moe=moe,
            )
        )
    defaults = DEFAULTS.get(raw.get("model_type", "gemma4_unified_text"), {})
    per_layer_size = raw.get("hidden_size_per_layer_input", defaults.get("hidden_size_per_layer_input")) or 0
    return TextConfig(
        model_type=raw.get("model_type", "gemma4_unified_text"),
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_heads=raw["num_attention_heads"],
        layers=tuple(layers),
        sliding_window=raw.get("sliding_window", 1024),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        final_logit_softcapping=raw.get("final_logit_softcapping"),
        tie_word_embeddings=raw.get("tie_word_embeddings", True),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_ids(raw.get("eos_token_id")),
        per_layer_size=per_layer_size,
        per_layer_vocab=raw.get("vocab_size_per_layer_input", defaults.get("vocab_size_per_layer_input", 0))
        if per_layer_size
        else 0,
        pad_token_id=raw.get("pad_token_id") or 0,
        **(_experts(raw) if moe else {}),
    )


def _experts(raw: dict) -> dict[str, int]:
    """The mixture-of-experts sizes of a config with ``enable_moe_block`` (each checked by `_text_config`)."""
    return {name: raw.get(name) for name in ("num_experts", "top_k_experts", "moe_intermediate_size")}


def kv_shared_layers(raw: dict, layer_types: Sequence[str]) -> set[int]:
    """The indices of the layers that reuse another's keys and values (transformers' ``kv_sharing_modes``): the
    last ``num_kv_shared_layers``, each reading the last earlier non-shared layer of its kind, which must exist."""
    count = raw.get("num_kv_shared_layers") or 0
    first = len(layer_types) - count
    if count < 0 or first < 1:
        raise ModelError(f"num_kv_shared_layers = {count!r}: some layer before the shared ones must make keys")
    missing = set(layer_types[first:]) - set(layer_types[:first])
    if missing:
        raise ModelError(f"num_kv_shared_layers = {count}: no earlier layer of kind {sorted(missing)[0]!r} to share")
    return set(range(first, len(layer_types)))


def _ids(value) -> tuple[int, ...]:
    """A config's token id or list of ids as a tuple (none: empty)."""
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (value,)


def check_supported(raw: dict) -> None:
    """`ModelError` naming the key of ``raw`` that turns on a Gemma 4 feature this decoder does not run."""
    if raw.get("use_bidirectional_attention") == "all":
        raise ModelError("text_config.use_bidirectional_attention = 'all': only causal text attention is supported")
