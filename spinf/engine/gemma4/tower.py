"""Gemma 4 31B's vision tower (engine spec A.14.2): an image's 48-pixel blocks into rows of the text model's input.

This module owns the tower layout (transformers' ``Gemma4VisionModel`` with ``Gemma4MultimodalEmbedder``), written
as plain modules like `spinf.engine.gemma4.model`: its config (`TowerConfig`, transformers' defaults where
``config.json`` leaves a field out), its checkpoint names and shapes (`tower_weight_shapes`, which the loader checks
and `spinf.engine.gemma4.tiny_tower` draws), and the forward. Each `VisionItem`'s blocks are re-cut into 16-pixel
patches in the order of transformers' image processor (raster order over the patch grid, HWC inside a patch, each
patch's ``(x, y)``); a patch embedding and a factorized 2-D position table feed a stack of bidirectional encoder layers
(sandwich RMSNorms, 2-D axial rope, GELU-gated MLP) with attention within the image only; each block's 3 x 3
patches are averaged back into one vector (the blocks' raster order, as the processor's pooler orders them),
scaled by ``sqrt(width)`` and standardised, then the multimodal embedder (a scale-free RMSNorm, a projection into
the text width). One row per block: the same token counts as the unified 12B (`spinf.engine.gemma4.embedders`).

An item's rows never depend on what else is embedded with it (C.1): the products of all items' rows run through
`stable_mm` (blocks of a fixed row count), norms are row-wise in fp32, rope angles come from a table by position,
and what is not row-wise (attention, the GELU, whose vectorised and scalar CPU paths differ in the last bit, and
the pooling) runs on each image's own rows, shaped as if it were embedded alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from spinf.engine.attention import apply_rope
from spinf.engine.folder import check_tower_weights, read_tensors
from spinf.engine.gemm import stable_mm
from spinf.engine.norm import rms_norm
from spinf.errors import ModelError

BLOCK = 48  # the side of a `VisionItem` block (spinf.media.tokens.BLOCK; the engine does not import spinf.media)
VISION_PREFIX = "model.vision_tower."
EMBED_PREFIX = "model.embed_vision."
_CHANNELS = 3
# transformers' Gemma4VisionConfig defaults: a saved config.json leaves out the fields that equal them.
_DEFAULTS = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 16,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "head_dim": 64,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0},
    "pooling_kernel_size": 3,
    "patch_size": 16,
    "position_embedding_size": 10 * 1024,
    "use_clipped_linears": False,
    "standardize": False,
}


_LAYER_NORMS = {  # this module's name -> the checkpoint's, in a layer
    "input_norm": "input_layernorm",
    "post_attn_norm": "post_attention_layernorm",
    "pre_ff_norm": "pre_feedforward_layernorm",
    "post_ff_norm": "post_feedforward_layernorm",
}


@attrs.frozen
class TowerConfig:
    """What the tower's shapes and arithmetic read from a ``vision_config``."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    patch_size: int
    pooling: int  # patches per block side
    position_embedding_size: int
    eps: float
    rope_theta: float
    standardize: bool

    @classmethod
    def from_dict(cls, vision: dict, where: str = "vision_config") -> TowerConfig:
        """The tower config of a checkpoint's ``vision_config``; what this build does not implement is refused."""
        raw = {**_DEFAULTS, **{k: v for k, v in vision.items() if v is not None}}
        rope = {**_DEFAULTS["rope_parameters"], **(raw["rope_parameters"] or {})}
        if raw["use_clipped_linears"]:
            raise ModelError(f"{where}: use_clipped_linears is not supported by this build's vision tower")
        if raw["hidden_activation"] != "gelu_pytorch_tanh" or rope["rope_type"] != "axial":
            raise ModelError(f"{where}: the vision tower reads gelu_pytorch_tanh and axial rope only")
        if raw["patch_size"] * raw["pooling_kernel_size"] != BLOCK:
            raise ModelError(f"{where}: patch_size x pooling_kernel_size must be the {BLOCK}-pixel block")
        if raw["head_dim"] % 4 or raw["num_attention_heads"] % raw["num_key_value_heads"]:
            raise ModelError(f"{where}: head_dim must be a multiple of 4 and the heads a multiple of the KV heads")
        return cls(
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=int(raw["num_attention_heads"]),
            num_kv_heads=int(raw["num_key_value_heads"]),
            head_dim=int(raw["head_dim"]),
            patch_size=int(raw["patch_size"]),
            pooling=int(raw["pooling_kernel_size"]),
            position_embedding_size=int(raw["position_embedding_size"]),
            eps=float(raw["rms_norm_eps"]),
            rope_theta=float(rope["rope_theta"]),
            standardize=bool(raw["standardize"]),
        )


def tower_weight_shapes(cfg: TowerConfig, text_hidden: int) -> dict[str, tuple[int, ...]]:
    """Checkpoint names and shapes of the tower (``model.vision_tower.``) and its projection into the text width
    (``model.embed_vision.``), as transformers saves them."""
    width, inner, dim = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q_out, kv_out = cfg.num_heads * dim, cfg.num_kv_heads * dim
    shapes = {
        EMBED_PREFIX + "embedding_projection.weight": (text_hidden, width),
        VISION_PREFIX + "patch_embedder.input_proj.weight": (width, _CHANNELS * cfg.patch_size**2),
        VISION_PREFIX + "patch_embedder.position_embedding_table": (2, cfg.position_embedding_size, width),
    }
    if cfg.standardize:
        shapes |= {VISION_PREFIX + "std_bias": (width,), VISION_PREFIX + "std_scale": (width,)}
    layer = {
        **{
            f"self_attn.{n}_proj.linear.weight": (out, width)
            for n, out in (("q", q_out), ("k", kv_out), ("v", kv_out))
        },
        "self_attn.o_proj.linear.weight": (width, q_out),
        "self_attn.q_norm.weight": (dim,),
        "self_attn.k_norm.weight": (dim,),
        "mlp.gate_proj.linear.weight": (inner, width),
        "mlp.up_proj.linear.weight": (inner, width),
        "mlp.down_proj.linear.weight": (width, inner),
        **{f"{n}.weight": (width,) for n in _LAYER_NORMS.values()},
    }
    for i in range(cfg.num_layers):
        shapes |= {f"{VISION_PREFIX}encoder.layers.{i}.{name}": shape for name, shape in layer.items()}
    return shapes


class TowerLayer(nn.Module):
    """One encoder layer: bidirectional attention within each image, then the gated MLP, each between RMSNorms."""

    def __init__(self, cfg: TowerConfig):
        super().__init__()
        self.eps, self.head_dim = cfg.eps, cfg.head_dim
        self.groups = cfg.num_heads // cfg.num_kv_heads
        q_out, kv_out = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv_sizes = (q_out, kv_out, kv_out)
        self.wqkv = nn.Linear(cfg.hidden_size, q_out + 2 * kv_out, bias=False)
        self.wo = nn.Linear(q_out, cfg.hidden_size, bias=False)
        self.w_gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.w_down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.q_norm = nn.Parameter(torch.ones(cfg.head_dim))
        self.k_norm = nn.Parameter(torch.ones(cfg.head_dim))
        for name in _LAYER_NORMS:
            self.register_parameter(name, nn.Parameter(torch.ones(cfg.hidden_size)))

    def forward(self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], lengths: list[int]) -> torch.Tensor:
        """``h`` [patches of all images, width]; ``lengths``: each image's patch count, in order."""
        n, d = h.shape[0], self.head_dim
        q, k, v = stable_mm(rms_norm(h, self.input_norm, self.eps), self.wqkv.weight).split(self.qkv_sizes, dim=-1)
        q = _rope_2d(rms_norm(q.view(n, -1, d), self.q_norm, self.eps), *rope)  # [n, heads, d]
        k = _rope_2d(rms_norm(k.view(n, -1, d), self.k_norm, self.eps), *rope)
        v = rms_norm(v.view(n, -1, d), None, self.eps)
        parts = zip(q.split(lengths), k.split(lengths), v.split(lengths), strict=True)
        a = torch.cat([self._attend(*part) for part in parts])  # [n, heads, d]
        h = h + rms_norm(stable_mm(a.view(n, -1), self.wo.weight), self.post_attn_norm, self.eps)
        gate, up = stable_mm(rms_norm(h, self.pre_ff_norm, self.eps), self.w_gate_up.weight).chunk(2, dim=-1)
        act = torch.cat([F.gelu(part, approximate="tanh") for part in gate.split(lengths)]) * up
        return h + rms_norm(stable_mm(act, self.w_down.weight), self.post_ff_norm, self.eps)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One image's attention, every patch to every patch; q and k are RMS-normed, so no 1/sqrt(d) scale."""
        # [1, heads, patches, d]: a 4-d call takes the fused (flash) kernels, on the CPU too, not the math path
        # that would hold a [heads, patches, patches] score matrix (6 GiB for an image of 1,120 blocks in fp32).
        q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, scale=1.0, enable_gqa=self.groups > 1)
        return out[0].transpose(0, 1)  # [patches, heads, d]


def _rope_2d(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Axial rope: the first half of each head rotates by the patch's x, the second half by its y."""
    half = x.shape[-1] // 2
    parts = zip(x.split(half, dim=-1), cos.split(half, dim=-1), sin.split(half, dim=-1), strict=True)
    return torch.cat([apply_rope(part, c, s) for part, c, s in parts], dim=-1)


class TowerEmbedder(nn.Module):
    """The 31B's vision embedder: `VisionItem`s -> their rows ``[sum of blocks, text hidden]``, in item order."""

    def __init__(self, cfg: TowerConfig, hidden: int):
        super().__init__()
        self.cfg = cfg
        width = cfg.hidden_size
        self.patch_proj = nn.Linear(_CHANNELS * cfg.patch_size**2, width, bias=False)
        self.pos_table = nn.Parameter(torch.zeros(2, cfg.position_embedding_size, width))  # [x or y, position, width]
        self.layers = nn.ModuleList(TowerLayer(cfg) for _ in range(cfg.num_layers))
        if cfg.standardize:
            self.register_buffer("std_bias", torch.zeros(width))
            self.register_buffer("std_scale", torch.ones(width))
        self.projection = nn.Linear(width, hidden, bias=False)
        # cos and sin of each position's rope angles [position, head_dim / 4]; set by `place_rope`.
        self.register_buffer("rope_cos", torch.zeros(cfg.position_embedding_size, cfg.head_dim // 4), persistent=False)
        self.register_buffer("rope_sin", torch.zeros(cfg.position_embedding_size, cfg.head_dim // 4), persistent=False)

    def place_rope(self) -> None:
        """The rope tables, computed in fp32 on the weights' device and kept in their dtype."""
        cfg, weight = self.cfg, self.projection.weight
        spatial = cfg.head_dim // 2
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, spatial, 2, dtype=torch.float32) / spatial))
        angles = torch.arange(cfg.position_embedding_size, dtype=torch.float32)[:, None] * inv_freq
        self.rope_cos = angles.cos().to(weight.device, weight.dtype)
        self.rope_sin = angles.sin().to(weight.device, weight.dtype)

    def forward(self, items: Sequence) -> torch.Tensor:
        """``items``: `VisionItem`s (``blocks`` [N, 48*48*3] uint8 in raster order, ``positions`` [N, 2]); returns
        every item's N rows concatenated in item order, ``[sum of N, text hidden]`` in the weights' dtype."""
        weight = self.projection.weight
        if not items:
            return weight.new_zeros((0, weight.shape[0]))
        grids = [_grid(item) for item in items]
        longest = max(max(grid) for grid in grids) * self.cfg.pooling
        if longest > self.cfg.position_embedding_size:
            raise ValueError(f"an image {longest} patches a side is beyond the position table")
        blocks = torch.from_numpy(np.concatenate([item.blocks for item in items]))
        blocks = blocks.to(weight.device, non_blocking=True).split([rows * cols for rows, cols in grids])
        patches = torch.cat([self._recut(part, *grid) for part, grid in zip(blocks, grids, strict=True)])
        x, y = (torch.cat(axis) for axis in zip(*(self._patch_xy(*grid) for grid in grids), strict=True))
        h = self._embed_patches(patches, x, y)  # [patches, width]
        cos_x, cos_y, sin_x, sin_y = self.rope_cos[x], self.rope_cos[y], self.rope_sin[x], self.rope_sin[y]
        rope = (torch.cat([cos_x, cos_x, cos_y, cos_y], dim=-1), torch.cat([sin_x, sin_x, sin_y, sin_y], dim=-1))
        lengths = [rows * cols * self.cfg.pooling**2 for rows, cols in grids]
        for layer in self.layers:
            h = layer(h, rope, lengths)
        pooled = torch.cat([self._pool(part, *grid) for part, grid in zip(h.split(lengths), grids, strict=True)])
        pooled = pooled * math.sqrt(self.cfg.hidden_size)  # in fp32 until standardised, as transformers does
        if self.cfg.standardize:
            pooled = (pooled - self.std_bias.float()) * self.std_scale.float()
        return stable_mm(rms_norm(pooled.to(weight.dtype), None, self.cfg.eps), weight)

    def _recut(self, blocks: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        """An image's blocks [rows * cols, 48*48*3] as its patches [patches, 16*16*3]: raster order over the patch
        grid (rows * 3 by cols * 3), HWC inside a patch, as transformers' processor cuts the whole image."""
        k, p = self.cfg.pooling, self.cfg.patch_size
        grid = blocks.view(rows, cols, k, p, k, p, _CHANNELS)  # [row, col, patch row, y, patch col, x, channel]
        return grid.permute(0, 2, 1, 4, 3, 5, 6).reshape(rows * k * cols * k, p * p * _CHANNELS)

    def _patch_xy(self, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each patch's column and row in the patch grid, in `_recut`'s order."""
        side = cols * self.cfg.pooling
        index = torch.arange(rows * self.cfg.pooling * side, device=self.projection.weight.device)
        return index % side, index // side

    def _embed_patches(self, patches: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """uint8 patches to [-1, 1] (fp32, then the weights' dtype), projected, plus the x and y table rows."""
        pixels = patches.float().div_(255).sub_(0.5).mul_(2).to(self.patch_proj.weight.dtype)
        return stable_mm(pixels, self.patch_proj.weight) + (self.pos_table[0][x] + self.pos_table[1][y])

    def _pool(self, h: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        """An image's patch states [patches, width] averaged over each block's k x k patches: [blocks, width] fp32,
        blocks in raster order."""
        k = self.cfg.pooling
        per_block = h.view(rows, k, cols, k, -1).permute(0, 2, 1, 3, 4).reshape(rows * cols, k * k, -1)
        return per_block.float().mean(dim=1)


def _grid(item) -> tuple[int, int]:
    """An item's (rows, cols) of blocks; its blocks must be in raster order (as `spinf.media.images` cuts them)."""
    positions = np.asarray(item.positions)
    count = len(positions)
    cols = int(positions[:, 0].max()) + 1 if count else 0
    index = np.arange(count)
    if not count or count % cols or not np.array_equal(positions, np.stack([index % cols, index // cols], axis=1)):
        raise ValueError("a vision item's blocks must fill a grid in raster order, positions (column, row)")
    if item.blocks.shape != (count, BLOCK * BLOCK * _CHANNELS):
        raise ValueError(
            f"a vision item's blocks must be [{count}, {BLOCK * BLOCK * _CHANNELS}], not {item.blocks.shape}"
        )
    return count // cols, cols


def _module_state(raw: dict[str, torch.Tensor], cfg: TowerConfig) -> dict[str, torch.Tensor]:
    """Checkpoint names -> this module's names, q/k/v and gate/up fused."""
    v = VISION_PREFIX
    state = {
        "patch_proj.weight": raw[v + "patch_embedder.input_proj.weight"],
        "pos_table": raw[v + "patch_embedder.position_embedding_table"],
        "projection.weight": raw[EMBED_PREFIX + "embedding_projection.weight"],
    }
    if cfg.standardize:
        state |= {"std_bias": raw[v + "std_bias"], "std_scale": raw[v + "std_scale"]}
    for i in range(cfg.num_layers):
        src, dst = f"{v}encoder.layers.{i}.", f"layers.{i}."
        state[dst + "wqkv.weight"] = torch.cat([raw[f"{src}self_attn.{n}_proj.linear.weight"] for n in "qkv"])
        state[dst + "wo.weight"] = raw[src + "self_attn.o_proj.linear.weight"]
        state[dst + "w_gate_up.weight"] = torch.cat([raw[f"{src}mlp.{n}_proj.linear.weight"] for n in ("gate", "up")])
        state[dst + "w_down.weight"] = raw[src + "mlp.down_proj.linear.weight"]
        state |= {dst + n: raw[f"{src}self_attn.{n}.weight"] for n in ("q_norm", "k_norm")}
        state |= {dst + ours: raw[f"{src}{theirs}.weight"] for ours, theirs in _LAYER_NORMS.items()}
    return state


def load_tower(
    folder: str | Path, vision_config: dict, hidden: int, *, device: str | torch.device, dtype: torch.dtype
) -> TowerEmbedder:
    """The tower of ``folder`` (its ``model.vision_tower.`` and ``model.embed_vision.`` weights) for a text model
    ``hidden`` wide, built on ``meta`` and assigned on ``device`` in ``dtype``. A weight missing, of another shape,
    or one this build does not read is a `ModelError` naming it."""
    folder = Path(folder)
    cfg = TowerConfig.from_dict(vision_config, f"{folder}/config.json: vision_config")
    raw = {VISION_PREFIX + k: t for k, t in read_tensors(folder, VISION_PREFIX).items()}
    raw |= {EMBED_PREFIX + k: t for k, t in read_tensors(folder, EMBED_PREFIX).items()}
    shapes = tower_weight_shapes(cfg, hidden)
    check_tower_weights(folder, raw, shapes)
    with torch.device("meta"):
        tower = TowerEmbedder(cfg, hidden)
    state = {k: t.to(device=device, dtype=dtype) for k, t in _module_state(raw, cfg).items()}
    tower.load_state_dict(state, strict=True, assign=True)
    tower.place_rope()
    return tower.eval().requires_grad_(False)
