"""Gemma 4's media embedders (engine spec A.14): images' 48-pixel blocks and audio's 640-sample frames into rows of
the text model's input.

The 31B's layout has a vision tower (`spinf.engine.gemma4.tower`). The unified 12B layout (transformers'
``Gemma4UnifiedModel``) has none: an image block goes through
LayerNorm, a dense projection, LayerNorm, a factorized 2-D positional embedding (one table row per column and per
row of the block), LayerNorm, then the shared multimodal embedder (a scale-free RMSNorm and a projection into the
text width); an audio frame goes through its own multimodal embedder alone. The outputs replace the placeholder
rows of the pass after the token embedding and its scale (`spinf.engine.gemma4.model.Gemma4Text.forward`), unscaled.

Every row is computed on its own: the norms are row-wise and every product runs through `stable_mm` (blocks of a
fixed row count), so an item's embedding is the same bits whatever else is embedded with it (C.1). They run in
the model's activation dtype (bf16 on a GPU, never quantized; fp32 on the CPU).

`MediaConfig` reads what a checkpoint's ``config.json`` says about media: the marker and placeholder token ids,
which embedders it has (so which kinds it reads), and how image tokens attend (A.14.6).
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from spinf.engine.attention import BIDIRECTIONAL_IN_WINDOW, BIDIRECTIONAL_NONE, BIDIRECTIONAL_OR
from spinf.engine.gemm import stable_mm
from spinf.engine.stack import MediaTokens
from spinf.errors import ModelError

LAYER_NORM_EPS = 1e-5  # torch's LayerNorm default, which the vision embedder's three LayerNorms keep
# The media token ids a Gemma 4 config.json may leave out: transformers' defaults for both layouts (the real ids)
DEFAULT_TOKENS = {
    "boi_token_id": 255_999,
    "eoi_token_id": 258_882,
    "image_token_id": 258_880,
    "video_token_id": 258_884,
    "boa_token_id": 256_000,
    "eoa_token_index": 258_883,
    "audio_token_id": 258_881,
}


@attrs.frozen
class MediaConfig:
    """What a checkpoint reads: ``kinds`` (``image`` and ``video`` with a vision embedder, ``audio`` with an audio
    embedder), the tokens, the embedders' configs, and ``bidirectional``: how the placeholders of one image attend
    to each other, as `spinf.engine.attention` names it: `BIDIRECTIONAL_OR` on every layer, beyond the window too (the
    unified 12B), `BIDIRECTIONAL_IN_WINDOW` on sliding layers and within their window (the 31B), `BIDIRECTIONAL_NONE`
    causal (a text config without
    ``use_bidirectional_attention = "vision"``)."""

    tokens: MediaTokens
    kinds: frozenset[str]
    vision: dict | None = None
    audio: dict | None = None
    bidirectional: int = BIDIRECTIONAL_NONE
    layout: str = "unified"  # "unified" (patch embedder, no tower) or "tower" (the 31B's vision tower)


def read_media_config(folder: str | Path) -> MediaConfig | None:
    """The media side of ``folder/config.json``; None for a text-only checkpoint (a bare text config, or a
    composite one without vision or audio configs)."""
    raw = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    model_type = raw.get("model_type")
    if model_type not in ("gemma4_unified", "gemma4"):
        return None
    vision, audio = raw.get("vision_config"), raw.get("audio_config")
    layout = "unified" if model_type == "gemma4_unified" else "tower"
    if layout == "tower":
        audio = None  # A.14.4: the 31B reads no audio
    kinds = frozenset(({"image", "video"} if vision else set()) | ({"audio"} if audio else set()))
    if not kinds:
        return None
    ids = {**DEFAULT_TOKENS, **{k: v for k, v in raw.items() if k in DEFAULT_TOKENS}}
    try:
        tokens = MediaTokens(
            boi=int(ids["boi_token_id"]),
            eoi=int(ids["eoi_token_id"]),
            image=int(ids["image_token_id"]),
            video=int(ids["video_token_id"]),
            boa=_optional(ids["boa_token_id"]),
            eoa=_optional(raw.get("eoa_token_id", ids["eoa_token_index"])),
            audio=_optional(ids["audio_token_id"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"{folder}/config.json: a media token id is missing or not a number ({exc})") from exc
    if audio and None in (tokens.boa, tokens.eoa, tokens.audio):
        raise ModelError(f"{folder}/config.json: an audio config needs boa_token_id, eoa_token_index, audio_token_id")
    text = raw.get("text_config") or {}
    if not isinstance(text, dict):
        raise ModelError(f"{folder}/config.json: text_config is not an object")
    mode = BIDIRECTIONAL_NONE
    if text.get("use_bidirectional_attention") == "vision":
        mode = BIDIRECTIONAL_OR if layout == "unified" else BIDIRECTIONAL_IN_WINDOW
    return MediaConfig(tokens, kinds, vision, audio, mode, layout)


def _optional(value) -> int | None:
    return None if value is None else int(value)


class VisionEmbedder(nn.Module):
    """The unified layout's image embedder: ``[N, 48*48*3]`` blocks in [0, 1] and their ``(column, row)`` -> ``[N,
    hidden]``."""

    def __init__(self, vision: dict, hidden: int):
        super().__init__()
        patch = (vision["patch_size"] * vision["pooling_kernel_size"]) ** 2 * 3
        width = vision["mm_embed_dim"]
        self.eps = vision.get("rms_norm_eps", 1e-6)
        self.patch_ln1 = nn.LayerNorm(patch, eps=LAYER_NORM_EPS)
        self.patch_dense = nn.Linear(patch, width)
        self.patch_ln2 = nn.LayerNorm(width, eps=LAYER_NORM_EPS)
        self.pos_embedding = nn.Parameter(torch.zeros(vision["mm_posemb_size"], 2, width))
        self.pos_norm = nn.LayerNorm(width, eps=LAYER_NORM_EPS)
        self.projection = nn.Linear(vision["output_proj_dims"], hidden, bias=False)

    def forward(self, patches: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = _layer_norm(patches, self.patch_ln1)
        x = stable_mm(x, self.patch_dense.weight) + self.patch_dense.bias
        x = _layer_norm(x, self.patch_ln2)
        table = self.pos_embedding
        x = x + (table[positions[:, 0], 0] + table[positions[:, 1], 1])
        x = _layer_norm(x, self.pos_norm)
        return stable_mm(_rms(x, self.eps), self.projection.weight)


class AudioEmbedder(nn.Module):
    """The unified layout's audio embedder: ``[n, 640]`` raw frames -> ``[n, hidden]`` (A.14.4)."""

    def __init__(self, audio: dict, hidden: int):
        super().__init__()
        self.eps = audio.get("rms_norm_eps", 1e-6)
        self.projection = nn.Linear(audio["audio_embed_dim"], hidden, bias=False)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return stable_mm(_rms(frames, self.eps), self.projection.weight)


def _layer_norm(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """LayerNorm computed in fp32 row by row, rounded to ``x``'s dtype."""
    return F.layer_norm(x.float(), norm.normalized_shape, norm.weight.float(), norm.bias.float(), norm.eps).to(x.dtype)


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """The scale-free RMSNorm before a multimodal projection, in fp32."""
    from spinf.engine.norm import rms_norm

    return rms_norm(x, None, eps)


@attrs.define(eq=False)
class MediaEmbedders:
    """A checkpoint's loaded embedders and its `MediaConfig`; ``kinds`` are those this engine reads (``--media``
    may load fewer: a kind switched off loads no embedder)."""

    config: MediaConfig
    vision: nn.Module | None
    audio: nn.Module | None
    device: torch.device
    dtype: torch.dtype

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(
            ({"image", "video"} if self.vision is not None else set())
            | ({"audio"} if self.audio is not None else set())
        )

    @torch.inference_mode()
    def embed(self, items: list) -> list[torch.Tensor]:
        """Each item's embedding rows ``[its placeholders, hidden]`` in the model's dtype: every vision item in one
        batch of blocks, every audio item in one batch of frames (row by row the same bits as one at a time)."""
        out: list[torch.Tensor | None] = [None] * len(items)
        for kind, run in (("vision", self._vision_rows), ("audio", self._audio_rows)):
            picked = [i for i, item in enumerate(items) if item.embedder == kind]
            if not picked:
                continue
            rows = run([items[i] for i in picked])
            for i, part in zip(picked, rows.split([items[i].num_tokens for i in picked]), strict=True):
                out[i] = part
        return out  # type: ignore[return-value]

    def _vision_rows(self, items: list) -> torch.Tensor:
        if self.vision is None:
            raise ModelError("this engine loaded no vision embedder")
        if self.config.layout == "tower":  # the 31B's tower re-cuts each item's blocks itself
            return self.vision(items)
        blocks = torch.from_numpy(np.concatenate([item.blocks for item in items]))
        positions = torch.from_numpy(np.concatenate([item.positions for item in items]))
        patches = blocks.to(self.device, non_blocking=True).float().div_(255).to(self.dtype)
        return self.vision(patches, positions.to(self.device, non_blocking=True))

    def _audio_rows(self, items: list) -> torch.Tensor:
        if self.audio is None:
            raise ModelError("this engine loaded no audio embedder")
        frames = torch.from_numpy(np.concatenate([item.frames for item in items]))
        return self.audio(frames.to(self.device, non_blocking=True).to(self.dtype))


def load_embedders(
    folder: str | Path, config: MediaConfig, kinds: frozenset[str], hidden: int, *, device: str, dtype: torch.dtype
) -> MediaEmbedders | None:
    """The embedders of the ``kinds`` asked (those the checkpoint has), their weights read from ``folder``; None
    when no kind is asked."""
    from spinf.engine.folder import read_tensors

    want_vision = bool({"image", "video"} & kinds & config.kinds)
    want_audio = "audio" in kinds & config.kinds
    if not (want_vision or want_audio):
        return None
    vision = audio = None
    if want_vision and config.layout == "tower":
        from spinf.engine.gemma4.tower import load_tower

        vision = load_tower(folder, config.vision, hidden, device=device, dtype=dtype)
    elif want_vision:
        raw = read_tensors(Path(folder), "model.embed_vision.")
        raw["projection.weight"] = raw.pop("multimodal_embedder.embedding_projection.weight", None)
        vision = _loaded(VisionEmbedder(config.vision, hidden), raw, folder, device, dtype)
    if want_audio:
        raw = read_tensors(Path(folder), "model.embed_audio.")
        raw["projection.weight"] = raw.pop("embedding_projection.weight", None)
        audio = _loaded(AudioEmbedder(config.audio, hidden), raw, folder, device, dtype)
    return MediaEmbedders(config, vision, audio, torch.device(device), dtype)


def _loaded(module: nn.Module, raw: dict, folder, device: str, dtype: torch.dtype) -> nn.Module:
    missing = sorted(k for k, v in raw.items() if v is None) + sorted(set(module.state_dict()) - set(raw))
    if missing:
        raise ModelError(f"{folder}: the checkpoint lacks the media weight {missing[0]!r}")
    state = {k: v.to(device=device, dtype=dtype) for k, v in raw.items() if k in module.state_dict()}
    module.load_state_dict(state, strict=True, assign=True)
    return module.eval().requires_grad_(False)
