"""What a Qwen3.5 checkpoint reads besides text: images and video frames through its vision tower (A.14.3).

`read_qwen_media` gives the marker and placeholder ids the compiler writes around each item (``<|vision_start|>``,
the image or video placeholder once per token, ``<|vision_end|>``); `QwenEmbedders` is what the scorer asks for
each pass's items, each embedded by the tower on its own (`spinf.engine.qwen35.vision`), so an item's rows never
depend on what else the pass embeds. No audio: the Qwen models read none.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import torch

from spinf.engine.qwen35.vision import QwenVisionTower, load_vision_tower, read_vision_config
from spinf.engine.stack import MediaTokens

KINDS = frozenset({"image", "video"})


@attrs.frozen
class QwenMedia:
    tokens: MediaTokens
    kinds: frozenset[str] = KINDS


def read_qwen_media(folder: str | Path) -> QwenMedia | None:
    """The media side of a Qwen3.5 checkpoint; None without a vision tower."""
    config = read_vision_config(folder)
    if config is None:
        return None
    tokens = MediaTokens(
        boi=config.vision_start_token_id,
        eoi=config.vision_end_token_id,
        image=config.image_token_id,
        video=config.video_token_id,
    )
    return QwenMedia(tokens)


@attrs.define
class QwenEmbedders:
    """The loaded vision tower, in the scorer's embedders' place (`spinf.engine.stack.Embedders`)."""

    tower: QwenVisionTower
    kinds: frozenset[str] = KINDS

    @torch.inference_mode()
    def embed(self, items: list) -> list[torch.Tensor]:
        """Each item's rows ``[its tokens, hidden]``: the tower's merged embeddings of its patches."""
        return self.tower.embed([(item.patches, item.grid) for item in items])


def load_qwen_embedders(folder: str | Path, *, device: str, dtype: torch.dtype) -> QwenEmbedders:
    return QwenEmbedders(load_vision_tower(folder, dtype=dtype, device=device))
