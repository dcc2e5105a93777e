"""The 31B's vision tower (`spinf.engine.gemma4.tower`) against transformers' ``Gemma4Model.get_image_features``, on
the tiny 31B-layout checkpoint of `spinf.engine.gemma4.tiny_tower`.

The items are cut by `spinf.media` from resized pixels; transformers reads the same resized pixels through its own
PIL image processor (no resize of its own: the pixels are already at their Gemma size), so the comparison covers the
re-cut into 16-pixel patches, the patch positions and the pooling order as well as the arithmetic.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Gemma4ForConditionalGeneration, Gemma4VisionConfig
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

from spinf.engine.gemma4.tiny_tower import TINY_TOWER_CONFIG, write_tiny_tower
from spinf.engine.gemma4.tower import TowerConfig, load_tower
from spinf.errors import ModelError
from spinf.media.images import gemma_blocks, gemma_resize
from spinf.media.items import VisionItem

HIDDEN = TINY_TOWER_CONFIG["text_config"]["hidden_size"]
VISION = TINY_TOWER_CONFIG["vision_config"]
SOFT_TOKENS = (70, 140, 280, 560, 1120)  # the budgets transformers' processor accepts
# (sent height, sent width, detail) -> the resized image: 8 x 8 blocks, 4 x 14, 7 x 9, 48 x 1, 20 x 13 (the
# 280-token budget; one image at it, as transformers' eager attention over its 2,520 patches takes seconds);
# None: one 48-pixel block as it is.
SIZES = {
    "one block": None,
    "square": (48, 48, "low"),
    "wide": (100, 300, "low"),
    "landscape": (900, 1200, "low"),
    "one column": (1000, 30, "low"),
    "many blocks": (300, 200, "auto"),
}


def resized(name: str) -> np.ndarray:
    rng = np.random.default_rng(len(name))
    if SIZES[name] is None:
        return rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)
    height, width, detail = SIZES[name]
    return gemma_resize(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), detail)


def item(name: str) -> VisionItem:
    return VisionItem(*gemma_blocks(resized(name)), "image")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_tower(tmp_path_factory.mktemp("tiny-tower"))


@pytest.fixture(scope="module")
def tower(folder):
    return load_tower(folder, VISION, HIDDEN, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def reference(folder):
    model, info = Gemma4ForConditionalGeneration.from_pretrained(
        folder, output_loading_info=True, attn_implementation="eager", dtype=torch.float32
    )
    return model.eval(), info


def test_the_tiny_checkpoint_loads_in_transformers(folder, reference):
    model, info = reference
    assert (info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"]) == (set(), set(), set())
    saved = json.loads((folder / "config.json").read_text())
    assert saved["text_config"]["model_type"] == "gemma4_text" and model.config.vision_config.standardize
    assert model.model.audio_tower is None and model.config.image_token_id == TINY_TOWER_CONFIG["image_token_id"]


def test_the_writer_is_deterministic(folder, tmp_path):
    again = write_tiny_tower(tmp_path)
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (again / name).read_bytes() == (folder / name).read_bytes()


@pytest.mark.parametrize("name", list(SIZES))
def test_the_tower_matches_transformers(tower, reference, name):
    pixels, vision_item = resized(name), item(name)
    soft = min(s for s in SOFT_TOKENS if s >= vision_item.num_tokens)
    inputs = Gemma4ImageProcessorPil(max_soft_tokens=soft, do_resize=False)(images=[pixels], return_tensors="pt")
    with torch.inference_mode():
        (expected,) = (
            reference[0].model.get_image_features(inputs["pixel_values"], inputs["image_position_ids"]).pooler_output
        )
        got = tower([vision_item])
    assert got.shape == (vision_item.num_tokens, HIDDEN) == expected.shape
    assert (got - expected).abs().max().item() <= 1e-4  # fp32 rounding: about 4e-6 measured


def test_an_items_rows_do_not_depend_on_what_is_embedded_with_it(tower):
    items = [item(name) for name in SIZES]
    with torch.inference_mode():
        alone = [tower([x]) for x in items]
        together = tower(items).split([x.num_tokens for x in items])
        reversed_ = tower(items[::-1]).split([x.num_tokens for x in items[::-1]])
    for one, batched, backwards in zip(alone, together, reversed_[::-1], strict=True):
        assert torch.equal(one, batched) and torch.equal(one, backwards)


def test_blocks_out_of_raster_order_are_refused(tower):
    blocks, positions = gemma_blocks(resized("wide"))
    with pytest.raises(ValueError, match=r"^a vision item's blocks must fill a grid in raster order"):
        tower([VisionItem(blocks[::-1].copy(), positions[::-1].copy(), "image")])


@pytest.mark.parametrize(
    "name",
    [
        "model.vision_tower.encoder.layers.1.mlp.up_proj.linear.weight",
        "model.vision_tower.std_scale",
        "model.embed_vision.embedding_projection.weight",
    ],
)
def test_a_missing_weight_is_refused_naming_it(folder, tmp_path, name):
    weights = load_file(folder / "model.safetensors")
    del weights[name]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ModelError, match=rf"^{tmp_path}: the checkpoint lacks the vision tower weight '{name}'$"):
        load_tower(tmp_path, VISION, HIDDEN, device="cpu", dtype=torch.float32)


def test_fields_left_out_of_the_config_read_as_transformers_defaults():
    assert TowerConfig.from_dict({}) == TowerConfig.from_dict(Gemma4VisionConfig().to_dict())
