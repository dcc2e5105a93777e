"""Scores with images, audio and video frames against an independent forward through transformers' own Gemma 4
multimodal modules (``Gemma4UnifiedForConditionalGeneration``, eager attention, fp32) on the same snapshot.

The reference is built here from the spec's rules without the engine's compiler, media items or embedders: the
token sequence written out by hand (``<bos>``, images first, markers and placeholders, ``mm:ss`` timestamps as text),
the pixels resized by Pillow to the size of transformers' own Gemma 4 image processor and cut by it into 48-pixel
patches with their positions, audio read with the ``wave`` module into 640-sample frames, and the bidirectional
image mask made by transformers from ``mm_token_type_ids``. The engine is called the way a user calls it
(``Engine.score`` with a JSON body of data URLs and base64 audio).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoModelForCausalLM, AutoTokenizer

from spinf.engine.gemma4.tiny import TINY_MEDIA_TOKENS
from spinf.errors import ApiError
from tests.media.fixtures import b64, data_url, image_bytes, noise_image, video_part, wav_header

BOI, EOI, IMAGE = (
    TINY_MEDIA_TOKENS["boi_token_id"],
    TINY_MEDIA_TOKENS["eoi_token_id"],
    TINY_MEDIA_TOKENS["image_token_id"],
)
BOA, EOA, AUDIO = (
    TINY_MEDIA_TOKENS["boa_token_id"],
    TINY_MEDIA_TOKENS["eoa_token_index"],
    TINY_MEDIA_TOKENS["audio_token_id"],
)
SOFT = {"low": 70, "auto": 280, "high": 1120}
TEMPLATE = "\n\nIs this about money? Answer:{?}"
OPTIONS = [" yes", " no"]


@pytest.fixture(scope="module")
def reference(tiny_engine):
    pil = pytest.importorskip("transformers.models.gemma4.image_processing_pil_gemma4")
    model = AutoModelForCausalLM.from_pretrained(tiny_engine.folder, attn_implementation="eager", dtype=torch.float32)
    return Reference(model.eval(), AutoTokenizer.from_pretrained(tiny_engine.folder), pil)


class Reference:
    """One prompt at a time through transformers: ``pieces`` are text strings, ``("image", pixels, detail)``
    and ``("audio", int16 samples)``, in the order the model reads them."""

    def __init__(self, model, tokenizer, pil):
        self.model, self.tokenizer, self.pil = model, tokenizer, pil

    def tok(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids if text else []

    def logprobs(self, pieces: list, template: str) -> torch.Tensor:
        ids = self.tokenizer("", add_special_tokens=True).input_ids
        pixel_values, positions, audio = [], [], []
        for piece in pieces:
            if isinstance(piece, str):
                ids += self.tok(piece)
            elif piece[0] == "image":
                patches, where = self.patches(piece[1], piece[2])
                pixel_values.append(patches)
                positions.append(where)
                ids += [BOI] + [IMAGE] * len(patches) + [EOI]
            else:
                frames = self.frames(piece[1])
                for start in range(0, len(frames), 750):  # segments of at most 750 tokens, each with its markers
                    segment = frames[start : start + 750]
                    audio.append(segment)
                    ids += [BOA] + [AUDIO] * len(segment) + [EOA]
        ids += self.tok(template)
        kwargs = {"mm_token_type_ids": torch.tensor([[1 if i == IMAGE else 0 for i in ids]])}
        if pixel_values:
            width = max(len(p) for p in pixel_values)
            kwargs["pixel_values"] = torch.stack([_pad(torch.from_numpy(p), width, 0.0) for p in pixel_values])
            kwargs["image_position_ids"] = torch.stack([_pad(torch.from_numpy(p), width, -1) for p in positions])
        if audio:
            length = max(len(a) for a in audio)
            kwargs["input_features"] = torch.stack([_pad(torch.from_numpy(a), length, 0.0) for a in audio])
            kwargs["input_features_mask"] = torch.stack(
                [torch.arange(length) < len(a) for a in audio]  # True: a real frame
            )
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([ids]), **kwargs).logits[0, -1].float()
        return torch.log_softmax(logits, dim=-1).double()

    def patches(self, pixels: np.ndarray, detail: str) -> tuple[np.ndarray, np.ndarray]:
        """transformers' Gemma 4 image processor at 48-pixel patches without pooling: its own resize target, our
        pixels resized to it by Pillow's bicubic filter (as A.14.2 says), then its patches and positions."""
        processor = self.pil.Gemma4ImageProcessorPil(
            patch_size=48, pooling_kernel_size=1, max_soft_tokens=SOFT[detail]
        )
        h, w = self.pil.get_aspect_ratio_preserving_size(pixels.shape[0], pixels.shape[1], 16, 9 * SOFT[detail], 3)
        resized = (
            Image.fromarray(pixels).resize((w, h), Image.Resampling.BICUBIC) if (h, w) != pixels.shape[:2] else None
        )
        image = resized if resized is not None else Image.fromarray(pixels)
        out = processor(images=[image], return_tensors=None, input_data_format="channels_last", do_resize=False)
        count = out["num_soft_tokens_per_image"][0]
        return np.asarray(out["pixel_values"][0][:count], np.float32), np.asarray(out["image_position_ids"][0][:count])

    @staticmethod
    def frames(pcm: np.ndarray) -> np.ndarray:
        samples = pcm.astype(np.float32) / 32768
        count = math.ceil(len(samples) / 640)
        padded = np.zeros(count * 640, np.float32)
        padded[: len(samples)] = samples
        return padded.reshape(count, 640)


def _pad(t: torch.Tensor, length: int, value) -> torch.Tensor:
    return torch.cat([t, torch.full((length - len(t), *t.shape[1:]), value, dtype=t.dtype)])


def image_part(pixels: np.ndarray, detail: str | None = None) -> dict:
    payload = {"url": data_url(image_bytes(pixels))}
    if detail is not None:
        payload["detail"] = detail
    return {"type": "image_url", "image_url": payload}


def wav_part(pcm: np.ndarray) -> dict:
    data = pcm.astype("<i2").tobytes()
    return {
        "type": "input_audio",
        "input_audio": {"data": b64(wav_header(16_000, 1, len(data), data)), "format": "wav"},
    }


def wav_pcm(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(seconds * 16_000)) * 6000).clip(-32768, 32767).astype(np.int16)


def score(engine, content: list, template: str = TEMPLATE) -> dict:
    body = {
        "messages": [{"role": "user", "content": content}],
        "scoring": {
            "queries": [{"id": "q", "template": template, "options": OPTIONS}],
            "empty_floor": False,
            "case_insensitive": False,  # one spelling per option: its log-prob is the reference's row, read at once
        },
    }
    return engine.score(body)


def ours(response: dict) -> list[float]:
    return [o["logprob"] for o in response["results"][0]["queries"][0]["combinations"][0]["options"]]


def theirs(reference: Reference, pieces: list, template: str = TEMPLATE) -> list[float]:
    lp = reference.logprobs(pieces, template[: template.index("{?}")])
    return [float(lp[reference.tok(option)[0]]) for option in OPTIONS]


def assert_close(got: list[float], expected: list[float]) -> None:
    assert got == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize(
    ("height", "width", "detail"), [(100, 150, "low"), (37, 420, "auto"), (480, 336, None), (60, 60, "high")]
)
def test_an_image_scores_as_transformers_reads_it(tiny_engine, reference, height, width, detail):
    pixels = noise_image(height, width, seed=height + width)
    response = score(tiny_engine, [{"type": "text", "text": "A picture:"}, image_part(pixels, detail)])
    expected = theirs(reference, [("image", pixels, detail or "auto"), "A picture:"])  # images move to the front
    assert_close(ours(response), expected)
    tokens = response["usage"]["content"]
    assert tokens["images"] == 1 and tokens["image_tokens"] == len(reference.patches(pixels, detail or "auto")[0]) + 2


def test_the_images_of_several_messages_go_to_the_front_in_order(tiny_engine, reference):
    first, second = noise_image(90, 50, seed=1), noise_image(64, 200, seed=2)
    content = [
        {"role": "user", "content": [{"type": "text", "text": "One"}, image_part(first, "low")]},
        {"role": "user", "content": [image_part(second, "low"), {"type": "text", "text": "two"}]},
    ]
    scoring = {"queries": [{"id": "q", "template": TEMPLATE, "options": OPTIONS}], "case_insensitive": False}
    body = {"messages": content, "scoring": scoring}
    response = tiny_engine.score(body)
    expected = theirs(reference, [("image", first, "low"), ("image", second, "low"), "One\n\ntwo"])
    assert_close(ours(response), expected)


def test_audio_in_place_and_in_segments_of_750_tokens(tiny_engine, reference):
    short, long = wav_pcm(1.3, seed=3), wav_pcm(31.0, seed=4)  # 33 tokens; 775 tokens = 750 + 25
    content = [
        {"type": "text", "text": "Listen:"},
        wav_part(short),
        {"type": "text", "text": " and"},
        wav_part(long),
    ]
    response = score(tiny_engine, content)
    expected = theirs(reference, ["Listen:", ("audio", short), " and", ("audio", long)])
    assert_close(ours(response), expected)
    usage = response["usage"]["content"]
    assert usage["audio_tokens"] == 33 + 2 + 775 + 2 * 2
    assert usage["audio_seconds"] == pytest.approx(32.3, abs=1e-3)
    assert usage["text_tokens"] == usage["tokens"] - usage["audio_tokens"]


def test_video_frames_stay_in_place_with_their_timestamps(tiny_engine, reference):
    frames = [noise_image(80, 120, seed=10 + j) for j in range(3)]
    times = [0.0, 61.5, 125.0]
    video = video_part(frames, times)
    response = score(tiny_engine, [{"type": "text", "text": "Clip: "}, video, {"type": "text", "text": " end"}])
    pieces = ["Clip: 00:00 ", ("image", frames[0], "low"), " 01:01 ", ("image", frames[1], "low")]
    pieces += [" 02:05 ", ("image", frames[2], "low"), " end"]
    assert_close(ours(response), theirs(reference, pieces))
    usage = response["usage"]["content"]
    assert usage["video_frames"] == 3 and usage["images"] == 0
    assert usage["video_tokens"] == 3 * (len(reference.patches(frames[0], "low")[0]) + 2)


def test_an_image_wider_than_the_sliding_window_attends_to_itself_whole(tiny_engine, reference):
    # The tiny model's window is 32 tokens; an image of 70 blocks sees all of itself on every layer (A.14.6),
    # which a causal or window-bounded mask would not give.
    pixels = noise_image(336, 480, seed=7)
    response = score(tiny_engine, [image_part(pixels, "low"), {"type": "text", "text": "What is it?"}])
    assert_close(ours(response), theirs(reference, [("image", pixels, "low"), "What is it?"]))


def test_content_that_ends_with_media_needs_no_join_check(tiny_engine, reference):
    pcm = wav_pcm(0.5, seed=5)
    response = score(tiny_engine, [{"type": "text", "text": "Sound"}, wav_part(pcm)], template="Money?{?}")
    assert_close(ours(response), theirs(reference, ["Sound", ("audio", pcm)], template="Money?{?}"))
    assert "join_not_merged" not in {w["code"] for w in response["warnings"]}


def test_a_split_input_re_sends_its_media_with_the_same_scores(tiny_engine, tiny_cache):
    from spinf import Engine

    pixels = noise_image(120, 90, seed=8)
    queries = [
        {"id": f"q{k}", "template": f"\n\nQuestion {k}: is it blue?{{?}}", "options": OPTIONS} for k in range(40)
    ]
    body = {"messages": [{"content": [image_part(pixels, "low")]}], "scoring": {"queries": queries}}
    small = Engine("spinf/tiny-gemma4", device="cpu", cache_dir=tiny_cache, token_budget=256)
    whole, split = tiny_engine.score(body, debug=True), small.score(body, debug=True)
    assert split["usage"]["processed_tokens"] > whole["usage"]["processed_tokens"]  # the content went more than once
    assert split["results"] == whole["results"]


# The 31B's layout: a vision tower over 16-pixel patches, 3 x 3 pooling, image blocks bidirectional on sliding
# layers only and within their window (A.14.6), no audio.


@pytest.fixture(scope="module")
def tower_folder(tmp_path_factory):
    from spinf.engine.gemma4.tiny_tower import write_tiny_tower

    return write_tiny_tower(tmp_path_factory.mktemp("tower") / "tiny-31b")


def test_an_image_through_the_31b_tower_scores_as_transformers_reads_it(tower_folder):
    from spinf import Engine

    pil = pytest.importorskip("transformers.models.gemma4.image_processing_pil_gemma4")
    engine = Engine(str(tower_folder), device="cpu")
    assert engine.features.media == {"image", "video"}  # the 31B reads no audio
    model = AutoModelForCausalLM.from_pretrained(tower_folder, attn_implementation="eager", dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tower_folder)
    pixels = noise_image(336, 480, seed=11)  # 70 blocks at low detail: wider than the 32-token window
    response = score(engine, [{"type": "text", "text": "A picture:"}, image_part(pixels, "low")])
    h, w = pil.get_aspect_ratio_preserving_size(336, 480, 16, 9 * 70, 3)
    resized = Image.fromarray(pixels).resize((w, h), Image.Resampling.BICUBIC)
    processor = pil.Gemma4ImageProcessorPil(max_soft_tokens=70)
    vision = processor(images=[resized], return_tensors="pt", input_data_format="channels_last", do_resize=False)
    blocks = vision["num_soft_tokens_per_image"][0]
    ids = tokenizer("", add_special_tokens=True).input_ids + [BOI] + [IMAGE] * blocks + [EOI]
    ids += tokenizer("A picture:" + TEMPLATE[: TEMPLATE.index("{?}")], add_special_tokens=False).input_ids
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor([ids]),
            pixel_values=vision["pixel_values"],
            image_position_ids=vision["image_position_ids"],
            mm_token_type_ids=torch.tensor([[1 if i == IMAGE else 0 for i in ids]]),
        ).logits[0, -1]
    lp = torch.log_softmax(logits.float(), dim=-1).double()
    expected = [float(lp[tokenizer(o, add_special_tokens=False).input_ids[0]]) for o in OPTIONS]
    assert_close(ours(response), expected)
    audio = {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}
    with pytest.raises(ApiError) as refused:
        score(engine, [audio])
    assert (refused.value.code, refused.value.param) == ("media_not_supported", "inputs.0.messages")


# Token counts (A.14.2, A.14.4, api spec §4.3) as usage reports them, against the formulas written out here.

SIZES = [(1, 1), (47, 48), (48, 48), (49, 49), (96, 97), (1, 5000), (5000, 1), (333, 777), (3000, 4000), (721, 1283)]


def spec_image_tokens(h: int, w: int, detail: str) -> int:
    soft = SOFT[detail]
    f = math.sqrt(soft * 2304 / (h * w))
    th, tw = math.floor(f * h / 48) * 48, math.floor(f * w / 48) * 48
    if th == 0:
        th, tw = 48, min((w // h) * 48, (soft // 9) * 48)
    elif tw == 0:
        th, tw = min((h // w) * 48, (soft // 9) * 48), 48
    return (th // 48) * (tw // 48) + 2


@pytest.mark.parametrize("detail", ["low", "auto", "high"])
def test_image_token_counts_follow_the_formula_over_sizes_and_edges(tiny_engine, detail):
    for h, w in SIZES:
        usage = score(tiny_engine, [image_part(noise_image(h, w, seed=h + w), detail)])["usage"]["content"]
        assert usage["image_tokens"] == spec_image_tokens(h, w, detail), (h, w)


@pytest.mark.parametrize("samples", [1, 639, 640, 641, 750 * 640, 750 * 640 + 1, 1500 * 640 + 320])
def test_audio_token_counts_follow_the_formula_at_the_rounding_edges(tiny_engine, samples):
    pcm = np.zeros(samples, np.int16)
    usage = score(tiny_engine, [wav_part(pcm)])["usage"]["content"]
    tokens = -(-samples // 640)  # 40 ms each, the last frame zero-padded
    segments = -(-tokens // 750)
    assert (usage["audio_tokens"], usage["audio_seconds"]) == (tokens + 2 * segments, round(samples / 16, 0) / 1000)
