"""The Qwen3.5 vision tower (`spinf.engine.qwen35.vision`) against transformers: the pixels against the Qwen2-VL PIL
image processor, the embeddings against ``Qwen3_5Model.get_image_features`` on the tiny checkpoint of
`spinf.engine.qwen35.tiny.write_tiny_vision`, and an image's bits whatever is embedded with it (C.1)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3_5ForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from spinf.engine.qwen35.tiny import (
    TINY_VISION_CONFIG,
    TINY_VISION_TOKENS,
    tiny_state_dict,
    write_tiny_qwen35,
    write_tiny_vision,
)
from spinf.engine.qwen35.vision import QwenVisionConfig, load_vision_tower, read_vision_config
from spinf.engine.scorer import one_cpu_thread
from spinf.errors import ModelError
from spinf.media.qwen_images import patchify, resize
from spinf.media.tokens import QWEN_DETAIL_TOKENS, QWEN_MIN_TOKENS, qwen_image_size

TOLERANCE = 1e-4  # fp32 rounding: our row-blocked products against transformers' Conv3d and fused linears
# (sent height, sent width, detail): a small image scaled up to the 64-token minimum (14 x 20 patches), exactly
# the minimum (16 x 16), wide and tall non-square grids, an aspect ratio near the limit and a budget-bound one
SENT = {
    "scaled up": (20, 30, "low"),
    "minimum": (256, 256, "low"),
    "wide": (300, 500, "low"),
    "tall": (1000, 40, "low"),
    "thin": (64, 2000, "low"),
    "over the budget": (700, 900, "auto"),
}
# resized sizes for the tower: one merge window, the 64-token minimum, non-square grids (rows != cols both ways)
RESIZED = {"one window": (32, 32), "minimum": (256, 256), "wide": (96, 160), "tall": (320, 224), "column": (448, 32)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_vision(write_tiny_qwen35(tmp_path_factory.mktemp("tiny-qwen35-vision")))


@pytest.fixture(scope="module")
def reference(folder):
    model, info = Qwen3_5ForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32, output_loading_info=True
    )
    return model.eval(), info


@pytest.fixture(scope="module")
def tower(folder):
    return load_vision_tower(folder)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_cpu_thread(torch.device("cpu")), torch.inference_mode():
        yield


def pixels(seed: int, height: int, width: int) -> np.ndarray:
    """Random RGB pixels, smoothed a little so that the bicubic resize has structure to keep."""
    noise = np.random.default_rng(seed).integers(0, 256, (height, width, 3)).astype(np.float64)
    return ((noise + np.roll(noise, 1, axis=0) + np.roll(noise, 1, axis=1)) / 3).astype(np.uint8)


def processor(detail: str) -> Qwen2VLImageProcessorPil:
    """transformers' processor set to the engine's rule: factor 32, min 64 tokens, max the budget, mean/std 0.5."""
    return Qwen2VLImageProcessorPil(
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        min_pixels=QWEN_MIN_TOKENS * 32**2,
        max_pixels=QWEN_DETAIL_TOKENS[detail] * 32**2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )


@pytest.mark.parametrize("name", SENT)
def test_resize_and_patchify_equal_the_processor(name):
    height, width, detail = SENT[name]
    image = pixels(1, height, width)
    expected = processor(detail)(images=[image], return_tensors="np")
    patches, grid = patchify(resize(image, *qwen_image_size(height, width, detail)))
    assert grid == tuple(expected["image_grid_thw"][0])
    assert patches.dtype == np.float32
    np.testing.assert_array_equal(patches, expected["pixel_values"])


def test_resize_keeps_an_image_of_its_size_and_refuses_other_pixels():
    image = pixels(2, 64, 96)
    assert resize(image, 64, 96) is image
    with pytest.raises(ValueError, match=r"^an image is RGB uint8"):
        resize(image.astype(np.float32), 32, 32)


@pytest.mark.parametrize("size", [(48, 64), (64, 40), (0, 32)])
def test_patchify_refuses_sides_off_the_32_pixel_grid(size):
    with pytest.raises(ValueError, match=r"^the resized image is \d+x\d+, not a positive multiple of 32 a side$"):
        patchify(np.zeros((*size, 3), dtype=np.uint8))


def test_tiny_checkpoint_loads_in_transformers_with_the_text_unchanged(folder, reference):
    _, info = reference
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    weights = load_file(str(folder / "model.safetensors"))
    for key, tensor in tiny_state_dict().items():
        assert torch.equal(weights[key], tensor), key
    assert sum(key.startswith("model.visual.") for key in weights) == len(weights) - len(tiny_state_dict())


def test_tiny_checkpoint_bytes_are_deterministic(folder, tmp_path):
    again = write_tiny_vision(write_tiny_qwen35(tmp_path))
    for name in ("config.json", "model.safetensors"):
        assert (again / name).read_bytes() == (folder / name).read_bytes()


def hf_features(reference, images: list[tuple[np.ndarray, tuple[int, int, int]]]) -> tuple[torch.Tensor, ...]:
    """transformers' image features of ``images`` in one call, as its Qwen3_5Model computes them for a prompt."""
    model, _ = reference
    patches = torch.from_numpy(np.concatenate([p for p, _ in images]))
    grids = torch.tensor([grid for _, grid in images])
    return model.model.get_image_features(patches, grids).pooler_output


@pytest.mark.parametrize("name", RESIZED)
def test_tower_equals_transformers(reference, tower, name):
    patches, grid = patchify(pixels(3, *RESIZED[name]))
    (expected,) = hf_features(reference, [(patches, grid)])
    (ours,) = tower.embed([(patches, grid)])
    assert ours.shape == (grid[1] * grid[2] // 4, TINY_VISION_CONFIG["out_hidden_size"]) == expected.shape
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, expected, atol=TOLERANCE, rtol=0)


def test_images_in_one_transformers_call_equal_ours_one_by_one(reference, tower):
    images = [patchify(pixels(4, 96, 160)), patchify(pixels(5, 256, 256)), patchify(pixels(6, 448, 32))]
    expected = hf_features(reference, images)
    for image, reference_rows in zip(images, expected, strict=True):
        (ours,) = tower.embed([image])
        torch.testing.assert_close(ours, reference_rows, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("threads", [1, 4])
def test_an_image_is_the_same_bits_alone_and_among_others(tower, threads):
    """With several threads, BLAS splits a product by its row count: plain products fail this, the row blocks
    do not."""
    image = patchify(pixels(7, 320, 224))
    before, after = patchify(pixels(8, 96, 160)), patchify(pixels(9, 256, 256))
    torch.set_num_threads(threads)  # the autouse fixture restores its own count afterwards
    (alone,) = tower.embed([image])
    among = tower.embed([before, image, after])
    assert [rows.shape[0] for rows in among] == [15, 70, 64]
    assert torch.equal(among[1], alone)
    assert torch.equal(among[0], tower.embed([before])[0])


def test_tower_computes_in_the_model_dtype(folder, tower):
    image = patchify(pixels(10, 256, 256))
    (rows,) = load_vision_tower(folder, dtype=torch.bfloat16).embed([image])
    assert rows.dtype == torch.bfloat16
    torch.testing.assert_close(rows.float(), tower.embed([image])[0], atol=0.1, rtol=0.05)


def test_tower_refuses_grids_it_does_not_read(tower):
    patches, _ = patchify(pixels(11, 64, 64))
    with pytest.raises(ValueError, match=r"^an image's grid is \(1, rows, cols\), multiples of 2"):
        tower.embed([(np.concatenate([patches, patches]), (2, 4, 4))])
    with pytest.raises(ValueError, match=r"^an image of grid \(1, 4, 2\) has 8 patches of 1536$"):
        tower.embed([(patches, (1, 4, 2))])


def test_read_vision_config(folder, tmp_path):
    cfg = read_vision_config(folder)
    assert (cfg.depth, cfg.hidden_size, cfg.head_dim, cfg.position_side, cfg.rope_theta) == (2, 32, 16, 8, 10000.0)
    assert {key: getattr(cfg, key) for key in TINY_VISION_TOKENS} == TINY_VISION_TOKENS
    config = json.loads((folder / "config.json").read_text())
    del config["vision_config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert read_vision_config(tmp_path) is None
    defaults = QwenVisionConfig.from_dict({"vision_config": {}})
    assert (defaults.depth, defaults.hidden_size, defaults.image_token_id) == (27, 1152, 248056)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_act": "gelu"}, r"vision_config\.hidden_act 'gelu' is not supported \(gelu_pytorch_tanh only\)"),
        ({"rope_parameters": {"rope_type": "default"}}, r"vision_config\.rope_parameters\.rope_type 'default'"),
        ({"patch_size": 14}, r"vision_config\.patch_size 14 is not supported \(16 only\)"),
        ({"temporal_patch_size": 1}, r"vision_config\.temporal_patch_size 1 is not supported \(2 only\)"),
        ({"spatial_merge_size": 3}, r"vision_config\.spatial_merge_size 3 is not supported \(2 only\)"),
        ({"in_channels": 1}, r"vision_config\.in_channels 1 is not supported \(3 only\)"),
        ({"num_heads": 3}, r"vision_config: hidden_size / num_heads must be a whole head width"),
        ({"num_position_embeddings": 60}, r"vision_config\.num_position_embeddings 60 is not a square"),
    ],
)
def test_read_vision_config_refuses_what_it_does_not_implement(folder, tmp_path, change, message):
    config = json.loads((folder / "config.json").read_text())
    config["vision_config"] |= change
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=rf"^{tmp_path}/config\.json: {message}"):
        read_vision_config(tmp_path)


def test_read_vision_config_refuses_a_token_id_that_is_no_id(folder, tmp_path):
    config = json.loads((folder / "config.json").read_text()) | {"image_token_id": "8"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=r"config\.json: image_token_id must be a token id, not '8'$"):
        read_vision_config(tmp_path)


def test_load_refuses_a_checkpoint_without_a_tower_or_with_a_weight_missing(folder, tmp_path):
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    weights = load_file(str(folder / "model.safetensors"))
    del weights["model.visual.blocks.1.attn.qkv.bias"]
    save_file(weights, str(tmp_path / "model.safetensors"))
    missing = r"lacks the vision tower weight 'model\.visual\.blocks\.1\.attn\.qkv\.bias'$"
    with pytest.raises(ModelError, match=missing):
        load_vision_tower(tmp_path)
    with pytest.raises(ModelError, match=r"has no vision tower"):
        load_vision_tower(write_tiny_qwen35(tmp_path / "text only"))
