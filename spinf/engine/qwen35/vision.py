"""The Qwen3.5 vision tower (engine spec A.14.3): an image's pixels into rows of the text model's input.

This module owns the tower layout of transformers' ``Qwen3_5VisionModel`` (weights under ``model.visual.``), written
as plain modules like `spinf.engine.gemma4.tower`: its config (`QwenVisionConfig`, transformers' defaults where
``config.json`` leaves a field out, with the image token ids beside it), its checkpoint names and shapes
(`vision_weight_shapes`, which the loader checks and `spinf.engine.qwen35.tiny.write_tiny_vision` draws), the
pixels' way in (`resize`, `patchify`: what transformers' Qwen2-VL PIL image processor gives) and the forward.

An image is cut into 16-pixel patches, each frame duplicated to fill the temporal patch of 2 and the patches of each
2 x 2 merge window kept together; a patch projection, the learned square position table resampled bilinearly to
the image's grid, and 2-D rotary positions (rows on one half of each head's angles, columns on the other) feed a
stack of pre-LayerNorm encoder blocks with bidirectional attention within the image; then each merge window's 4
LayerNormed patches become one row through a 2-layer GELU MLP into the text width. One row per 32 x 32 pixels.

An image's rows never depend on what else is embedded with it (C.1): the products of all images' rows run through
`stable_mm` (blocks of a fixed row count), and everything that is not a product (the norms, the rope, attention,
the GELUs, whose vectorised and scalar CPU paths differ in the last bit) runs on each image's own rows, shaped as
if it were embedded alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from spinf.catalog.resolve import read_config
from spinf.engine.attention import apply_rope
from spinf.engine.folder import check_tower_weights, read_tensors
from spinf.engine.gemm import stable_mm
from spinf.errors import ModelError

VISUAL_PREFIX = "model.visual."
# The pixel layout `patchify` writes (engine spec A.14.3); a checkpoint with other sizes is refused.
PATCH = 16
TEMPORAL = 2
MERGE = 2
BLOCK = PATCH * MERGE  # the pixels of one image token a side
CHANNELS = 3
_EPS = 1e-6  # every LayerNorm of transformers' tower
# transformers' Qwen3_5VisionConfig and Qwen3_5Config defaults: a saved config.json leaves out the fields that equal
# them.
_DEFAULTS = {
    "depth": 27,
    "hidden_size": 1152,
    "hidden_act": "gelu_pytorch_tanh",
    "intermediate_size": 4304,
    "num_heads": 16,
    "in_channels": CHANNELS,
    "patch_size": PATCH,
    "spatial_merge_size": MERGE,
    "temporal_patch_size": TEMPORAL,
    "out_hidden_size": 3584,
    "num_position_embeddings": 2304,
    "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0},
}
_TOKEN_DEFAULTS = {
    "image_token_id": 248056,
    "video_token_id": 248057,
    "vision_start_token_id": 248053,
    "vision_end_token_id": 248054,
}


@attrs.frozen
class QwenVisionConfig:
    """What the tower's shapes and arithmetic read from a ``vision_config``, and the image token ids."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden_size: int
    in_channels: int
    num_position_embeddings: int  # a square table, side ``position_side``
    hidden_act: str
    rope_theta: float
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def position_side(self) -> int:
        return math.isqrt(self.num_position_embeddings)

    @property
    def patch_width(self) -> int:
        """The values of one patch: channels x temporal patch x patch x patch."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @classmethod
    def from_dict(cls, config: dict, where: str = "config.json") -> QwenVisionConfig:
        """The tower config of a checkpoint's ``config.json`` (its ``vision_config`` and top-level token ids); what
        this build does not implement is refused by name."""
        vision = config.get("vision_config")
        if not isinstance(vision, dict):
            raise ModelError(f"{where}: vision_config is not an object")
        raw = {**_DEFAULTS, **{k: v for k, v in vision.items() if v is not None}}
        rope = {**_DEFAULTS["rope_parameters"], **(raw["rope_parameters"] or {})}
        at = f"{where}: vision_config"
        if raw["hidden_act"] != "gelu_pytorch_tanh":
            raise ModelError(f"{at}.hidden_act {raw['hidden_act']!r} is not supported (gelu_pytorch_tanh only)")
        if rope["rope_type"] != "axial":
            raise ModelError(f"{at}.rope_parameters.rope_type {rope['rope_type']!r} is not supported (axial only)")
        # the pixel layout `patchify` writes
        layout = {"patch_size": PATCH, "temporal_patch_size": TEMPORAL, "spatial_merge_size": MERGE, "in_channels": 3}
        for key, value in layout.items():
            if raw[key] != value:
                raise ModelError(f"{at}.{key} {raw[key]!r} is not supported ({value} only)")
        if raw["hidden_size"] % raw["num_heads"] or (raw["hidden_size"] // raw["num_heads"]) % 4:
            raise ModelError(f"{at}: hidden_size / num_heads must be a whole head width, a multiple of 4")
        if math.isqrt(raw["num_position_embeddings"]) ** 2 != raw["num_position_embeddings"]:
            raise ModelError(f"{at}.num_position_embeddings {raw['num_position_embeddings']} is not a square")
        tokens = {key: config.get(key, default) for key, default in _TOKEN_DEFAULTS.items()}
        for key, value in tokens.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ModelError(f"{where}: {key} must be a token id, not {value!r}")
        return cls(
            **{key: int(raw[key]) for key in ("depth", "hidden_size", "intermediate_size", "num_heads")},
            **{key: int(raw[key]) for key in ("out_hidden_size", "num_position_embeddings")},
            **layout,
            hidden_act=raw["hidden_act"],
            rope_theta=float(rope["rope_theta"]),
            **tokens,
        )


def read_vision_config(folder: str | Path) -> QwenVisionConfig | None:
    """The vision tower config of the Qwen3.5 checkpoint in ``folder``; None when it has no ``vision_config``."""
    config = read_config(Path(folder))
    if config.get("vision_config") is None:
        return None
    return QwenVisionConfig.from_dict(config, f"{Path(folder) / 'config.json'}")


def vision_weight_shapes(cfg: QwenVisionConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint names (under ``model.visual.``) and shapes of the tower, as transformers saves them."""
    width, inner, v = cfg.hidden_size, cfg.intermediate_size, VISUAL_PREFIX
    merged = width * cfg.spatial_merge_size**2
    patch = (width, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
    shapes = {
        v + "patch_embed.proj.weight": patch,  # a Conv3d whose kernel is its stride: a product per patch
        v + "patch_embed.proj.bias": (width,),
        v + "pos_embed.weight": (cfg.num_position_embeddings, width),
        v + "merger.norm.weight": (width,),
        v + "merger.norm.bias": (width,),
        v + "merger.linear_fc1.weight": (merged, merged),
        v + "merger.linear_fc1.bias": (merged,),
        v + "merger.linear_fc2.weight": (cfg.out_hidden_size, merged),
        v + "merger.linear_fc2.bias": (cfg.out_hidden_size,),
    }
    block = {
        "norm1.weight": (width,),
        "norm1.bias": (width,),
        "norm2.weight": (width,),
        "norm2.bias": (width,),
        "attn.qkv.weight": (3 * width, width),
        "attn.qkv.bias": (3 * width,),
        "attn.proj.weight": (width, width),
        "attn.proj.bias": (width,),
        "mlp.linear_fc1.weight": (inner, width),
        "mlp.linear_fc1.bias": (inner,),
        "mlp.linear_fc2.weight": (width, inner),
        "mlp.linear_fc2.bias": (width,),
    }
    for i in range(cfg.depth):
        shapes |= {f"{v}blocks.{i}.{name}": shape for name, shape in block.items()}
    return shapes


def _each(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """``fn`` on each image's rows of ``x`` on their own, concatenated back: the image's result is that of the
    image alone."""
    return torch.cat([fn(part) for part in x.split(lengths)])


def _linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    return stable_mm(x, layer.weight) + layer.bias


def _layer_norm(norm: nn.LayerNorm) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, _EPS)


class VisionBlock(nn.Module):
    """One encoder block: LayerNorm, attention within each image (2-D rope on q and k), LayerNorm, GELU MLP."""

    def __init__(self, cfg: QwenVisionConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        width = cfg.hidden_size
        self.norm1 = nn.LayerNorm(width, eps=_EPS)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width, eps=_EPS)
        self.fc1 = nn.Linear(width, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, width)

    def forward(
        self, h: torch.Tensor, rope: list[tuple[torch.Tensor, torch.Tensor]], lengths: list[int]
    ) -> torch.Tensor:
        """``h`` [patches of all images, width]; ``rope``: each image's fp32 (cos, sin) [patches, head_dim];
        ``lengths``: each image's patch count, in order."""
        n = h.shape[0]
        qkv = _linear(_each(_layer_norm(self.norm1), h, lengths), self.qkv).view(n, 3, self.num_heads, self.head_dim)
        parts = zip(qkv.split(lengths), rope, strict=True)
        a = torch.cat([self._attend(part, *angles) for part, angles in parts])  # [patches, width]
        h = h + _linear(a, self.proj)
        inner = _linear(_each(_layer_norm(self.norm2), h, lengths), self.fc1)
        inner = _each(lambda x: F.gelu(x, approximate="tanh"), inner, lengths)
        return h + _linear(inner, self.fc2)

    def _attend(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """One image's attention, every patch to every patch: ``qkv`` [patches, 3, heads, head_dim] -> [patches,
        width]. The rope runs in fp32 and returns to the model dtype, as transformers does."""
        q, k, v = qkv.unbind(1)
        q, k = (apply_rope(t.float(), cos, sin).to(v.dtype) for t in (q, k))
        # [1, heads, patches, d]: a 4-d call takes the fused kernels, on the CPU too, not the math path that would
        # hold a [heads, patches, patches] score matrix.
        q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, scale=self.head_dim**-0.5)
        return out[0].transpose(0, 1).reshape(qkv.shape[0], -1)


class QwenVisionTower(nn.Module):
    """The Qwen3.5 vision tower: each image's patches -> its merged rows ``[patches / 4, out_hidden_size]``."""

    def __init__(self, cfg: QwenVisionConfig):
        super().__init__()
        self.cfg = cfg
        width, merged = cfg.hidden_size, cfg.hidden_size * cfg.spatial_merge_size**2
        self.patch_proj = nn.Linear(cfg.patch_width, width)
        self.pos_embed = nn.Parameter(torch.zeros(cfg.num_position_embeddings, width))
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger_norm = nn.LayerNorm(width, eps=_EPS)
        self.merger_fc1 = nn.Linear(merged, merged)
        self.merger_fc2 = nn.Linear(merged, cfg.out_hidden_size)

    def embed(self, images: Sequence[tuple[np.ndarray | torch.Tensor, tuple[int, int, int]]]) -> list[torch.Tensor]:
        """``images``: each image's patches [t * h * w, 3 * 2 * 16 * 16] (`patchify`'s layout) and grid ``(t, h,
        w)``, t = 1; returns each image's rows ``[h * w / 4, out_hidden_size]`` in the weights' dtype, in order."""
        weight = self.patch_proj.weight
        if not images:
            return []
        grids = [self._check(patches, grid) for patches, grid in images]
        lengths = [rows * cols for rows, cols in grids]
        x = torch.cat([torch.as_tensor(patches).to(weight.device, weight.dtype) for patches, _ in images])
        h = _linear(x, self.patch_proj)  # [patches, width]
        h = h + torch.cat([self._positions(*grid) for grid in grids]).to(h.dtype)
        rope = [self._rope(*grid) for grid in grids]
        for block in self.blocks:
            h = block(h, rope, lengths)
        h = _each(_layer_norm(self.merger_norm), h, lengths).view(-1, self.merger_fc1.in_features)
        merged_lengths = [n // self.cfg.spatial_merge_size**2 for n in lengths]
        inner = _each(F.gelu, _linear(h, self.merger_fc1), merged_lengths)
        return list(_linear(inner, self.merger_fc2).split(merged_lengths))

    def _check(self, patches: np.ndarray | torch.Tensor, grid: tuple[int, int, int]) -> tuple[int, int]:
        """An image's (rows, cols) of patches; ``ValueError`` for a grid or patches this tower does not read."""
        frames, rows, cols = (int(n) for n in grid)
        merge = self.cfg.spatial_merge_size
        if frames != 1 or rows < merge or cols < merge or rows % merge or cols % merge:
            raise ValueError(f"an image's grid is (1, rows, cols), multiples of {merge}, not {tuple(grid)}")
        if tuple(patches.shape) != (rows * cols, self.cfg.patch_width):
            raise ValueError(f"an image of grid {tuple(grid)} has {rows * cols} patches of {self.cfg.patch_width}")
        return rows, cols

    def _merge_order(self, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each patch's row and column in `patchify`'s order (merge windows, then the patches inside one)."""
        m, device = self.cfg.spatial_merge_size, self.pos_embed.device
        row = torch.arange(rows, device=device).view(rows // m, 1, m, 1).expand(-1, cols // m, -1, m)
        col = torch.arange(cols, device=device).view(1, cols // m, 1, m).expand(rows // m, -1, m, -1)
        return row.reshape(-1), col.reshape(-1)

    def _positions(self, rows: int, cols: int) -> torch.Tensor:
        """The position table resampled to the image's grid (bilinear, corners aligned), fp32 [patches, width]."""
        side = self.cfg.position_side
        table = self.pos_embed.float().view(side, side, -1)
        r_taps, r_weights = _bilinear_taps(rows, side, table.device)
        c_taps, c_weights = _bilinear_taps(cols, side, table.device)
        by_row = (table[r_taps] * r_weights[:, :, None, None]).sum(1)  # [rows, side, width]
        grid = (by_row[:, c_taps] * c_weights[None, :, :, None]).sum(2)  # [rows, cols, width]
        row, col = self._merge_order(rows, cols)
        return grid[row, col]

    def _rope(self, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 (cos, sin) [patches, head_dim] of each patch: its row's angles on the first quarter, its column's on
        the second, both repeated on the second half (rotate-half pairs dims i and i + head_dim / 2)."""
        spatial = self.cfg.head_dim // 2
        device = self.pos_embed.device
        inv_freq = 1.0 / (
            self.cfg.rope_theta ** (torch.arange(0, spatial, 2, dtype=torch.float32, device=device) / spatial)
        )
        row, col = self._merge_order(rows, cols)
        by_row, by_col = row[:, None].float() * inv_freq, col[:, None].float() * inv_freq
        angles = torch.cat([by_row, by_col, by_row, by_col], dim=-1)
        return angles.cos(), angles.sin()


def _bilinear_taps(count: int, side: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The 2 table rows and their fp32 weights [count, 2] for each of ``count`` points on an axis of a ``side``-long
    table, the end points on the table's ends (align_corners)."""
    source = torch.arange(count, dtype=torch.float32, device=device) * (side - 1) / max(count - 1, 1)
    low = source.floor()
    frac = source - low
    taps = torch.stack([low, low + 1], dim=-1).long().clamp_(max=side - 1)
    return taps, torch.stack([1 - frac, frac], dim=-1)


def _module_state(raw: dict[str, torch.Tensor], cfg: QwenVisionConfig) -> dict[str, torch.Tensor]:
    """Checkpoint names (without ``model.visual.``) -> this module's names."""
    state = {
        "patch_proj.weight": raw["patch_embed.proj.weight"].reshape(cfg.hidden_size, -1),
        "patch_proj.bias": raw["patch_embed.proj.bias"],
        "pos_embed": raw["pos_embed.weight"],
    }
    for part in ("weight", "bias"):
        state[f"merger_norm.{part}"] = raw[f"merger.norm.{part}"]
        state |= {f"merger_{n}.{part}": raw[f"merger.linear_{n}.{part}"] for n in ("fc1", "fc2")}
    names = {"norm1": "norm1", "norm2": "norm2", "qkv": "attn.qkv", "proj": "attn.proj"}
    names |= {"fc1": "mlp.linear_fc1", "fc2": "mlp.linear_fc2"}
    for i in range(cfg.depth):
        for ours, theirs in names.items():
            state |= {f"blocks.{i}.{ours}.{p}": raw[f"blocks.{i}.{theirs}.{p}"] for p in ("weight", "bias")}
    return state


def load_vision_tower(
    folder: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> QwenVisionTower:
    """The vision tower of the Qwen3.5 checkpoint in ``folder`` (its ``model.visual.`` weights), built on ``meta``
    and assigned on ``device`` in ``dtype``. A checkpoint without a ``vision_config``, a weight missing, of another
    shape, or one this build does not read is a `ModelError` naming it."""
    folder = Path(folder)
    cfg = read_vision_config(folder)
    if cfg is None:
        raise ModelError(f"{folder}: the checkpoint has no vision tower (no vision_config in config.json)")
    raw = {VISUAL_PREFIX + k: t for k, t in read_tensors(folder, VISUAL_PREFIX).items()}
    shapes = vision_weight_shapes(cfg)
    check_tower_weights(folder, raw, shapes)
    raw = {name[len(VISUAL_PREFIX) :]: t for name, t in raw.items()}
    with torch.device("meta"):
        tower = QwenVisionTower(cfg)
    state = {k: t.to(device=device, dtype=dtype) for k, t in _module_state(raw, cfg).items()}
    tower.load_state_dict(state, strict=True, assign=True)
    return tower.eval().requires_grad_(False)
