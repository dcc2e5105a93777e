"""The built-in tiny model ``spinf/tiny-gemma4``: random weights, a real tokenizer, generated on first use.

This module owns the tiny model's snapshot: its architecture (``TINY_CONFIG``, a 6-layer Gemma 4 text model of about
0.85M parameters, inside the 12B's "unified" layout with small random media embedders beside it: ``TINY_VISION`` and
``TINY_AUDIO``, engine spec A.14 and B.19), how its weights are drawn, the revision id that names them, and writing
the files into the Hugging Face hub cache layout (``models--spinf--tiny-gemma4/snapshots/<revision>/`` plus
``refs/main``) so that the ordinary loading path serves it like any downloaded model, with no network: the catalog,
which never imports torch, reports a missing snapshot and where it goes (`TinySnapshotMissing`), and
`find_or_generate` writes it there. Tests and the quickstart use it. The weights are drawn here from the config
alone, without instantiating transformers, so the bytes depend neither on transformers' version nor on its
initialisers.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import constants as hub_constants
from safetensors.torch import save as save_safetensors

from spinf.catalog import Checkpoint, ResolvedModel, TinySnapshotMissing, find_checkpoint, generated_checkpoint
from spinf.engine.tiny_tokenizer import json_bytes, tokenizer_bytes, tokenizer_files

logger = logging.getLogger(__name__)

TINY_MODEL_ID = "spinf/tiny-gemma4"
_REPO_FOLDER = "models--" + TINY_MODEL_ID.replace("/", "--")
# Part of the revision: bump it whenever the weights or files written for the same config change.
GENERATOR_VERSION = "spinf tiny-gemma4 generator 2"

TINY_CONFIG: dict[str, Any] = {
    "model_type": "gemma4_unified_text",
    "architectures": ["Gemma4UnifiedForCausalLM"],
    "vocab_size": 8192,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "global_head_dim": 64,
    "num_global_key_value_heads": 1,
    "attention_k_eq_v": True,
    "sliding_window": 32,
    "final_logit_softcapping": 30.0,
    "layer_types": [
        "sliding_attention",
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
    ],
    "tie_word_embeddings": True,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-06,
    "max_position_embeddings": 131072,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
    },
    "use_bidirectional_attention": "vision",
    "dtype": "float32",
}

# The media embedders of the unified layout (transformers' Gemma4UnifiedVisionConfig / AudioConfig): the real
# 48-pixel patches and positional table size (an image at high detail may be 1,120 blocks long on one side), a small
# embedding width; audio frames of 640 samples.
TINY_VISION: dict[str, Any] = {
    "model_type": "gemma4_unified_vision",
    "patch_size": 16,
    "pooling_kernel_size": 3,
    "mm_embed_dim": 32,
    "mm_posemb_size": 1120,
    "output_proj_dims": 32,
    "rms_norm_eps": 1e-06,
}
TINY_AUDIO: dict[str, Any] = {"model_type": "gemma4_unified_audio", "audio_embed_dim": 640, "rms_norm_eps": 1e-06}
# The media tokens of the packaged tokenizer (ids 6 to 11). It has no video soft token of its own: video frames use the
# image soft token, which reads the same (both go through the vision embedder).
TINY_MEDIA_TOKENS: dict[str, int] = {
    "boi_token_id": 6,
    "eoi_token_id": 7,
    "image_token_id": 8,
    "video_token_id": 8,
    "boa_token_id": 9,
    "eoa_token_index": 10,
    "audio_token_id": 11,
}
SNAPSHOT_CONFIG: dict[str, Any] = {
    "model_type": "gemma4_unified",
    "architectures": ["Gemma4UnifiedForConditionalGeneration"],
    "text_config": {k: v for k, v in TINY_CONFIG.items() if k not in ("architectures", "dtype")},
    "vision_config": TINY_VISION,
    "audio_config": TINY_AUDIO,
    **TINY_MEDIA_TOKENS,
    "tie_word_embeddings": True,
    "dtype": "float32",
}
TEXT_PREFIX = "model.language_model."  # where the unified layout keeps the text model's weights

_SEED = 0
_MEDIA_SEED = 1  # the embedders' own stream, so the text weights are those of the text-only generator 1
# Wide enough that next-token distributions are far from flat once the embedding is scaled by sqrt(hidden)
# on the way in and reused as the (tied) output head.
_EMBEDDING_STD = 0.35
# Gemma 4 norms multiply by the weight itself (not 1 + weight), so the weights sit around 1.
_NORM_STD = 0.1

_GENERATION_CONFIG = {"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}


def _revision(config_json: bytes, tokenizer_json: bytes) -> str:
    digest = hashlib.sha1(usedforsecurity=False)
    # Length prefixes keep the three parts from running into each other.
    for part in (GENERATOR_VERSION.encode("utf-8"), config_json, tokenizer_json):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


TINY_REVISION = _revision(json_bytes(SNAPSHOT_CONFIG), tokenizer_bytes())


def tiny_weight_shapes(config: Mapping[str, Any] = TINY_CONFIG) -> dict[str, tuple[int, ...]]:
    """The state-dict keys and shapes of ``Gemma4UnifiedForCausalLM`` for ``config``, written out by hand.

    Covers what ``TINY_CONFIG`` uses: tied embeddings (no ``lm_head.weight``), and ``attention_k_eq_v``
    (full-attention layers reuse the keys as values, so they have no ``v_proj``); and the small models' (E2B/E4B):
    per-layer input embeddings (``hidden_size_per_layer_input``), KV-shared layers (the last
    ``num_kv_shared_layers``: no k/v projections or k norm, as transformers saves them) and ``use_double_wide_mlp``.
    """
    hidden = config["hidden_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config["vocab_size"], hidden),
        "model.norm.weight": (hidden,),
    }
    per_layer = config.get("hidden_size_per_layer_input") or 0
    if per_layer:
        width = config["num_hidden_layers"] * per_layer
        shapes["model.embed_tokens_per_layer.weight"] = (config["vocab_size_per_layer_input"], width)
        shapes["model.per_layer_model_projection.weight"] = (width, hidden)
        shapes["model.per_layer_projection_norm.weight"] = (per_layer,)
    first_shared = len(config["layer_types"]) - (config.get("num_kv_shared_layers") or 0)
    for index, layer_type in enumerate(config["layer_types"]):
        full, shared = layer_type == "full_attention", index >= first_shared
        shapes.update(_layer_shapes(config, f"model.layers.{index}.", full, shared))
    return shapes


def _layer_shapes(
    config: Mapping[str, Any], prefix: str, full_attention: bool, kv_shared: bool = False
) -> dict[str, tuple[int, ...]]:
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    if kv_shared and config.get("use_double_wide_mlp"):
        inner *= 2
    k_eq_v = full_attention and config["attention_k_eq_v"]
    head_dim = config["global_head_dim"] if full_attention else config["head_dim"]
    kv_heads = config["num_global_key_value_heads"] if k_eq_v else config["num_key_value_heads"]
    q_width, kv_width = config["num_attention_heads"] * head_dim, kv_heads * head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "layer_scalar": (1,),
        "self_attn.q_proj.weight": (q_width, hidden),
        "self_attn.q_norm.weight": (head_dim,),
        "self_attn.o_proj.weight": (hidden, q_width),
        "mlp.gate_proj.weight": (inner, hidden),
        "mlp.up_proj.weight": (inner, hidden),
        "mlp.down_proj.weight": (hidden, inner),
    }
    if not kv_shared:
        shapes["self_attn.k_norm.weight"] = (head_dim,)
        shapes["self_attn.k_proj.weight"] = (kv_width, hidden)
        if not k_eq_v:
            shapes["self_attn.v_proj.weight"] = (kv_width, hidden)
    for norm in ("input", "post_attention", "pre_feedforward", "post_feedforward"):
        shapes[f"{norm}_layernorm.weight"] = (hidden,)
    per_layer = config.get("hidden_size_per_layer_input") or 0
    if per_layer:
        shapes["per_layer_input_gate.weight"] = (per_layer, hidden)
        shapes["per_layer_projection.weight"] = (hidden, per_layer)
        shapes["post_per_layer_input_norm.weight"] = (hidden,)
    if config.get("enable_moe_block"):
        shapes.update(_expert_shapes(config))
    return {prefix + name: shape for name, shape in shapes.items()}


def _expert_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """A layer's mixture-of-experts weights (``enable_moe_block``, the 26B A4B), as transformers names them: the
    router, every expert's gate and up stacked ([experts, 2 × width, hidden]) and down, and the block's three norms."""
    hidden, experts, width = config["hidden_size"], config["num_experts"], config["moe_intermediate_size"]
    return {
        "router.proj.weight": (experts, hidden),
        "router.scale": (hidden,),
        "router.per_expert_scale": (experts,),
        "experts.gate_up_proj": (experts, 2 * width, hidden),
        "experts.down_proj": (experts, hidden, width),
        "pre_feedforward_layernorm_2.weight": (hidden,),
        "post_feedforward_layernorm_1.weight": (hidden,),
        "post_feedforward_layernorm_2.weight": (hidden,),
    }


def media_weight_shapes(
    hidden: int, vision: Mapping[str, Any] | None = TINY_VISION, audio: Mapping[str, Any] | None = TINY_AUDIO
) -> dict[str, tuple[int, ...]]:
    """The state-dict keys and shapes of the unified layout's media embedders (``model.embed_vision.``: LayerNorm,
    patch projection, LayerNorm, factorized positional table, LayerNorm, projection into the text width;
    ``model.embed_audio.``: the projection of raw 640-sample frames), written out by hand."""
    shapes: dict[str, tuple[int, ...]] = {}
    if vision is not None:
        patch = (vision["patch_size"] * vision["pooling_kernel_size"]) ** 2 * 3
        width = vision["mm_embed_dim"]
        shapes["model.embed_vision.pos_embedding"] = (vision["mm_posemb_size"], 2, width)
        for name, size in (("patch_ln1", patch), ("patch_ln2", width), ("pos_norm", width)):
            shapes[f"model.embed_vision.{name}.weight"] = (size,)
            shapes[f"model.embed_vision.{name}.bias"] = (size,)
        shapes["model.embed_vision.patch_dense.weight"] = (width, patch)
        shapes["model.embed_vision.patch_dense.bias"] = (width,)
        shapes["model.embed_vision.multimodal_embedder.embedding_projection.weight"] = (
            hidden,
            vision["output_proj_dims"],
        )
    if audio is not None:
        shapes["model.embed_audio.embedding_projection.weight"] = (hidden, audio["audio_embed_dim"])
    return shapes


def snapshot_weight_shapes() -> dict[str, tuple[int, ...]]:
    """Every tensor of the snapshot: the text model under ``model.language_model.``, the media embedders beside it."""
    text = {TEXT_PREFIX + key.removeprefix("model."): shape for key, shape in tiny_weight_shapes().items()}
    return {**text, **media_weight_shapes(TINY_CONFIG["hidden_size"])}


def snapshot_state_dict() -> dict[str, torch.Tensor]:
    """The snapshot's float32 weights: `tiny_state_dict` renamed into the unified layout, and the media embedders
    drawn from a stream of their own in sorted key order."""
    weights = {TEXT_PREFIX + key.removeprefix("model."): value for key, value in tiny_state_dict().items()}
    generator = torch.Generator(device="cpu").manual_seed(_MEDIA_SEED)
    for key, shape in sorted(media_weight_shapes(TINY_CONFIG["hidden_size"]).items()):
        weights[key] = draw_media(key, shape, generator)
    return weights


def draw_media(key: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """One media-embedder weight in float32 on the generator's device (the benchmarks' 12B-sized ones too)."""
    normal = torch.randn(shape, generator=generator, device=generator.device, dtype=torch.float32)
    if key.endswith("pos_embedding"):
        return normal * 0.5  # beside LayerNorm-ed patch states of unit scale: positions matter
    if key.endswith(".bias"):
        return normal * 0.1
    if "_ln" in key or "_norm" in key:  # LayerNorm weights sit around 1
        return 1.0 + normal * 0.1
    return normal / math.sqrt(shape[1])


def tiny_state_dict(config: Mapping[str, Any] = TINY_CONFIG) -> dict[str, torch.Tensor]:
    """The tiny text model's float32 weights, drawn from one seeded CPU generator in sorted key order.

    The revision does not hash these bytes (it names them by config, tokenizer and ``GENERATOR_VERSION``), so
    they rely on torch's CPU normal sampler giving the same stream for a seed; should a torch release change
    it, pin the old stream or bump ``GENERATOR_VERSION``.
    """
    generator = torch.Generator(device="cpu").manual_seed(_SEED)
    weights = {}
    for key, shape in sorted(tiny_weight_shapes(config).items()):
        weights[key] = _draw(key, shape, generator)
    return weights


def _draw(key: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    if key.endswith("layer_scalar"):
        return torch.ones(shape, dtype=torch.float32)
    normal = torch.randn(shape, generator=generator, dtype=torch.float32)
    if key == "model.embed_tokens.weight":
        return normal * _EMBEDDING_STD
    if key.endswith("norm.weight"):
        return 1.0 + normal * _NORM_STD
    # A linear layer: weight is (out_features, in_features); 1/sqrt(in) keeps activations near unit scale.
    return normal / math.sqrt(shape[1])


def snapshot_files() -> dict[str, bytes]:
    """Every file of the snapshot, by name; the same bytes on every call."""
    return {
        "config.json": json_bytes(SNAPSHOT_CONFIG),
        "generation_config.json": json_bytes(_GENERATION_CONFIG),
        "model.safetensors": save_safetensors(snapshot_state_dict(), metadata={"format": "pt"}),
        **tokenizer_files(),
    }


def find_or_generate(resolved: ResolvedModel, **lookup: Any) -> Checkpoint:
    """`find_checkpoint` (``lookup`` is its keywords), generating the tiny model's snapshot where the catalog
    reports it missing."""
    try:
        return find_checkpoint(resolved, **lookup)
    except TinySnapshotMissing as missing:
        return generate_snapshot(missing)


def generate_snapshot(missing: TinySnapshotMissing) -> Checkpoint:
    """The tiny model's snapshot written where the catalog said it goes, checked by `generated_checkpoint`."""
    return generated_checkpoint(missing.resolved, ensure_tiny_snapshot(missing.root))


def ensure_tiny_snapshot(cache_dir: str | Path | None = None) -> Path:
    """The snapshot folder of ``spinf/tiny-gemma4`` under ``cache_dir``, generated first if it is missing.

    ``cache_dir`` defaults to the hub cache (``HF_HUB_CACHE``). Safe against concurrent processes: each one
    writes a private temporary folder and renames it into place; a rename is atomic, so a snapshot folder that
    exists is complete, and the loser of a race discards its copy.
    """
    repo_dir = Path(cache_dir if cache_dir is not None else hub_constants.HF_HUB_CACHE) / _REPO_FOLDER
    snapshot = repo_dir / "snapshots" / TINY_REVISION
    if not snapshot.is_dir():
        _generate(repo_dir, snapshot)
    _write_ref(repo_dir)
    return snapshot


def _generate(repo_dir: Path, snapshot: Path) -> None:
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    # The temporary folder sits in the repo folder, beside snapshots/ (same file system, so the rename is
    # atomic) but not inside it, so cache scanners never list a half-written revision.
    staging = Path(tempfile.mkdtemp(prefix=".tmp-snapshot-", dir=repo_dir))
    try:
        for name, data in snapshot_files().items():
            (staging / name).write_bytes(data)
        # mkdtemp makes the folder private; a hub cache may be shared, so open it like any other snapshot.
        staging.chmod(0o755)
        try:
            os.rename(staging, snapshot)
        except OSError:
            if not snapshot.is_dir():
                raise
            logger.debug("another process generated %s first; discarding this copy", snapshot)
        else:
            logger.info("generated the tiny model %s at %s", TINY_MODEL_ID, snapshot)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_ref(repo_dir: Path) -> None:
    """Points ``refs/main`` at this revision, replacing the file atomically when it says anything else."""
    ref = repo_dir / "refs" / "main"
    if ref.is_file() and ref.read_text(encoding="utf-8") == TINY_REVISION:
        return
    ref.parent.mkdir(parents=True, exist_ok=True)
    # Written beside refs/, not in it, for the same reason as the staging folder of _generate.
    fd, partial = tempfile.mkstemp(prefix=".tmp-ref-", dir=repo_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(TINY_REVISION)
        os.chmod(partial, 0o644)  # mkstemp makes the file private; see the chmod in _generate
        os.replace(partial, ref)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
