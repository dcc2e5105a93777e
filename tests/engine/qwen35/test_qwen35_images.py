"""Images and video frames on the Qwen3.5 stack (engine spec A.14.3) against an independent forward through
transformers' own ``Qwen3_5ForConditionalGeneration`` (eager, fp32) on the same tiny checkpoint with a vision tower.

The reference is built here without the engine's compiler, layout or tower: the token sequence written out by hand
(``<bos>``, images first, ``<|vision_start|>``, one placeholder per merged token, ``<|vision_end|>``, timestamps as
text), the pixels resized by Pillow to the size of transformers' own Qwen-VL rule (``smart_resize`` with factor 32
and the detail's budget) and cut into patches by transformers' Qwen-VL image processor, and the 3-D rotary positions
computed by transformers from ``mm_token_type_ids``. The engine is called as a user calls it (``Engine.score`` with
data URLs)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, PreTrainedTokenizerFast

from spinf import Engine
from spinf.engine.qwen35.tiny import write_tiny_qwen35, write_tiny_vision
from tests.media.fixtures import data_url, image_bytes, noise_image, video_part

BUDGET = {"low": 256, "auto": 1024, "high": 4096}
TEMPLATE = "\n\nIs this about money? Answer:{?}"
OPTIONS = [" yes", " no"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_vision(write_tiny_qwen35(tmp_path_factory.mktemp("tiny-qwen35-vision")))


@pytest.fixture(scope="module")
def engine(folder):
    return Engine(str(folder), device="cpu")


@pytest.fixture(scope="module")
def reference(folder):
    pil = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    model = AutoModelForImageTextToText.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    return Reference(model.eval(), PreTrainedTokenizerFast.from_pretrained(folder), pil, config)


class Reference:
    """One prompt through transformers: ``pieces`` are text strings and ``(kind, pixels, detail)`` items in the
    order the model reads them."""

    def __init__(self, model, tokenizer, pil, config):
        self.model, self.tokenizer, self.pil, self.config = model, tokenizer, pil, config

    def tok(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids if text else []

    def patches(self, pixels: np.ndarray, detail: str) -> tuple[np.ndarray, list[int]]:
        """transformers' Qwen-VL processor on our pixels resized by Pillow to its own rule's size."""
        h, w = self.pil.smart_resize(
            pixels.shape[0], pixels.shape[1], factor=32, min_pixels=64 * 32 * 32, max_pixels=BUDGET[detail] * 32 * 32
        )
        image = Image.fromarray(pixels)
        if (h, w) != pixels.shape[:2]:
            image = image.resize((w, h), Image.Resampling.BICUBIC)
        processor = self.pil.Qwen2VLImageProcessorPil(
            patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3
        )
        out = processor(images=[image], return_tensors=None, do_resize=False)
        return np.asarray(out["pixel_values"], np.float32), [int(x) for x in out["image_grid_thw"][0]]

    def logprobs(self, pieces: list, template: str) -> torch.Tensor:
        c = self.config
        ids = self.tokenizer("", add_special_tokens=True).input_ids
        types, pixel_values, grids, video_values, video_grids = [0] * len(ids), [], [], [], []
        for piece in pieces:
            if isinstance(piece, str):
                ids += self.tok(piece)
                types += [0] * len(self.tok(piece))
                continue
            kind, pixels, detail = piece
            patches, grid = self.patches(pixels, detail)
            (pixel_values if kind == "image" else video_values).append(patches)
            (grids if kind == "image" else video_grids).append(grid)  # a frame: one temporal patch of itself
            tokens = grid[1] * grid[2] // 4
            placeholder = c["image_token_id"] if kind == "image" else c["video_token_id"]
            ids += [c["vision_start_token_id"]] + [placeholder] * tokens + [c["vision_end_token_id"]]
            types += [0] + [1 if kind == "image" else 2] * tokens + [0]
        ids += self.tok(template)
        types += [0] * len(self.tok(template))
        kwargs = {"mm_token_type_ids": torch.tensor([types])}
        if pixel_values:
            kwargs["pixel_values"] = torch.from_numpy(np.concatenate(pixel_values))
            kwargs["image_grid_thw"] = torch.tensor(grids)
        if video_values:
            kwargs["pixel_values_videos"] = torch.from_numpy(np.concatenate(video_values))
            kwargs["video_grid_thw"] = torch.tensor(video_grids)
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([ids]), **kwargs).logits[0, -1].float()
        return torch.log_softmax(logits, dim=-1).double()


def image_part(pixels: np.ndarray, detail: str | None = None) -> dict:
    payload = {"url": data_url(image_bytes(pixels))}
    if detail is not None:
        payload["detail"] = detail
    return {"type": "image_url", "image_url": payload}


def score(engine, content: list) -> dict:
    body = {
        "messages": [{"role": "user", "content": content}],
        "scoring": {
            "queries": [{"id": "q", "template": TEMPLATE, "options": OPTIONS}],
            "empty_floor": False,
            "case_insensitive": False,
        },
    }
    return engine.score(body)


def ours(response: dict) -> list[float]:
    return [o["logprob"] for o in response["results"][0]["queries"][0]["combinations"][0]["options"]]


def theirs(reference: Reference, pieces: list) -> list[float]:
    lp = reference.logprobs(pieces, TEMPLATE[: TEMPLATE.index("{?}")])
    return [float(lp[reference.tok(option)[0]]) for option in OPTIONS]


@pytest.mark.parametrize(
    ("height", "width", "detail"), [(100, 150, "low"), (300, 80, "auto"), (64, 64, "low"), (520, 410, None)]
)
def test_an_image_scores_as_transformers_reads_it(engine, reference, height, width, detail):
    pixels = noise_image(height, width, seed=height + width)
    response = score(engine, [{"type": "text", "text": "A picture:"}, image_part(pixels, detail)])
    expected = theirs(reference, [("image", pixels, detail or "auto"), "A picture:"])  # images move to the front
    assert ours(response) == pytest.approx(expected, abs=1e-4)
    _, grid = reference.patches(pixels, detail or "auto")
    usage = response["usage"]["content"]
    assert usage["images"] == 1 and usage["image_tokens"] == grid[1] * grid[2] // 4 + 2


def test_two_images_and_text_between_the_questions(engine, reference):
    first, second = noise_image(90, 200, seed=3), noise_image(160, 96, seed=4)
    content = [{"type": "text", "text": "Two photos."}, image_part(first, "low"), image_part(second, "low")]
    expected = theirs(reference, [("image", first, "low"), ("image", second, "low"), "Two photos."])
    assert ours(score(engine, content)) == pytest.approx(expected, abs=1e-4)


def test_an_images_question_scores_the_same_bits_alone_and_among_others(engine):
    pixels = noise_image(120, 180, seed=9)
    alone = score(engine, [image_part(pixels, "low"), {"type": "text", "text": "Receipt."}])
    receipt = [image_part(pixels, "low"), {"type": "text", "text": "Receipt."}]
    body = {
        "inputs": [
            {"id": "a", "messages": [{"role": "user", "content": [{"type": "text", "text": "Other text."}]}]},
            {"id": "b", "messages": [{"role": "user", "content": receipt}]},
        ],
        "scoring": {
            "queries": [
                {"id": "q", "template": TEMPLATE, "options": OPTIONS},
                {"id": "r", "template": "\n\nA cat? Answer:{?}", "options": OPTIONS},
            ],
            "empty_floor": False,
            "case_insensitive": False,
        },
    }  # fmt: skip
    among = engine.score(body)["results"][1]["queries"][0]["combinations"][0]["options"]
    assert [o["logprob"] for o in among] == ours(alone)


def test_an_image_over_the_aspect_ratio_is_a_400(engine):
    from spinf.errors import ApiError

    with pytest.raises(ApiError) as refused:
        score(engine, [image_part(noise_image(2, 500, seed=1), "low")])
    assert (refused.value.status, refused.value.code) == (400, "invalid_media")


def test_video_frames_stay_in_place_with_their_timestamps(engine, reference):
    """A video's frames are images at the video's detail (low by default) with their ``mm:ss`` stamps as text
    (A.14.5); transformers reads them as one-frame video grids with video placeholders."""
    frames = [noise_image(80, 120, seed=20 + j) for j in range(3)]
    times = [0.0, 61.5, 125.0]
    video = video_part(frames, times)
    response = score(engine, [{"type": "text", "text": "Clip: "}, video, {"type": "text", "text": " end"}])
    pieces = ["Clip: 00:00 ", ("video", frames[0], "low"), " 01:01 ", ("video", frames[1], "low")]
    pieces += [" 02:05 ", ("video", frames[2], "low"), " end"]
    assert ours(response) == pytest.approx(theirs(reference, pieces), abs=1e-4)
    _, grid = reference.patches(frames[0], "low")
    usage = response["usage"]["content"]
    assert usage["video_frames"] == 3 and usage["video_tokens"] == 3 * (grid[1] * grid[2] // 4 + 2)
