"""Per-question batch invariance with media on the GPU (engine spec C.1, A.14): a question about an image or a clip
keeps its bits whatever shares the pass.

The tiny model on CUDA through the fused path (bf16 activations and bf16 media embeddings, the Triton tree kernel with
image spans, fp8s linears after a calibration): the target questions about an input with an image (and one with
audio) alone, among many other questions, among other inputs with and without media in another order, and in passes
shared with concurrent calls through the engine loop. The media embedding of an item is also compared directly:
embedded alone and among other items, bit for bit.
"""

from __future__ import annotations

import random

import pytest

from spinf.engine.loop import Call
from spinf.media.items import decode_media
from tests.engine.test_gpu_invariance import OTHER, cuda_engine
from tests.engine.test_independence import CONTENT, TARGETS, numbers, other_questions
from tests.media.fixtures import b64, data_url, image_bytes, noise_image, wav_header

pytestmark = pytest.mark.gpu


def image(seed: int, height: int = 200, width: int = 300, detail: str = "auto") -> dict:
    url = data_url(image_bytes(noise_image(height, width, seed=seed)))
    return {"type": "image_url", "image_url": {"url": url, "detail": detail}}


def audio(seconds: float, seed: int) -> dict:
    import numpy as np

    pcm = (np.random.default_rng(seed).standard_normal(int(seconds * 16_000)) * 4000).astype("<i2").tobytes()
    return {"type": "input_audio", "input_audio": {"data": b64(wav_header(16_000, 1, len(pcm), pcm)), "format": "wav"}}


def media_body(queries: list[dict], inputs: list[tuple[str, list]]) -> dict:
    return {
        "inputs": [{"id": i, "messages": [{"role": "user", "content": parts}]} for i, parts in inputs],
        "scoring": {"queries": queries},
    }


MINE = [{"type": "text", "text": CONTENT}, image(1)]
SOUND = [{"type": "text", "text": "The call:"}, audio(2.0, seed=2), {"type": "text", "text": CONTENT[:200]}]


@pytest.fixture(scope="module", params=["bf16", "fp8s"])
def media_engine(request, tiny_cache):
    import torch

    engine = cuda_engine(request.param, tiny_cache)
    for module in (engine.embedders.vision, engine.embedders.audio):  # media embeddings are computed in bf16
        module.to(torch.bfloat16)
    engine.embedders.dtype = torch.bfloat16
    return engine


@pytest.mark.parametrize(("mine", "label"), [(MINE, "image"), (SOUND, "audio")])
def test_a_question_about_media_keeps_its_bits_in_five_compositions(media_engine, mine, label):
    engine = media_engine
    whole = numbers(engine.score(media_body(TARGETS, [("a", mine)])))
    for query in TARGETS:  # 1. each target question alone
        alone = numbers(engine.score(media_body([query], [("a", mine)])))
        assert alone == {k: v for k, v in whole.items() if k[0] == query["id"]}
    crowd = other_questions(120)  # 2. among many other questions on the same input
    assert numbers(engine.score(media_body(crowd[:60] + TARGETS + crowd[60:], [("a", mine)]))) == whole
    others = [  # 3. among other inputs, with and without media, in another order
        ("z", [{"type": "text", "text": "Other news."}]),
        ("b", [image(7, 480, 640, "high"), {"type": "text", "text": OTHER}]),
        ("c", [{"type": "text", "text": "Listen:"}, audio(1.0, seed=9)]),
        ("d", [image(8, 100, 90, "low"), image(9, 64, 300, "low")]),
        ("a", mine),
    ]
    random.Random(3).shuffle(others)
    assert numbers(engine.score(media_body(other_questions(40) + list(reversed(TARGETS)), others))) == whole
    # 4. the same item twice in the pass (another input with the same content) and 5. in passes shared with
    # concurrent calls through the engine loop
    twice = media_body(TARGETS, [("b", mine), ("a", mine)])
    assert numbers(engine.score(twice)) == whole
    shared = engine.new_loop(share_passes=True, floor_cache=4096)
    target = Call(media_body(TARGETS, [("a", mine)]), "scr_mine")
    crowd_calls = [
        Call(
            media_body(
                other_questions(10), [("b", [image(20 + k, 120, 160, "low"), {"type": "text", "text": OTHER}])]
            ),
            f"scr_{k}",
        )  # fmt: skip
        for k in range(24)
    ]
    shared.run([*crowd_calls[:12], target, *crowd_calls[12:]])
    assert numbers(target.unwrap()) == whole, label


def test_an_items_embedding_is_the_same_bits_alone_and_among_others(media_engine):
    import torch

    engine = media_engine

    def items(parts: list) -> list:
        request = decode_media(engine.parse(media_body([TARGETS[1]], [("a", parts)])))
        return [item for seg in request.inputs[0].segments if not isinstance(seg, str) for item in seg.decoded]

    mine = items([image(1)])
    crowd = items([image(7, 480, 640, "high"), image(8, 100, 90, "low"), image(5, 333, 222)])
    alone = engine.embedders.embed(mine)[0]
    for position in range(len(crowd) + 1):
        among = engine.embedders.embed(crowd[:position] + mine + crowd[position:])[position]
        assert torch.equal(alone, among), position
