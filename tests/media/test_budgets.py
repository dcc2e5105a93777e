"""A call's images and video frames counted and refused from their headers, before any pixel is decoded (issue 33
item 7): ``content_too_long`` when an input's image and frame tokens alone are over ``max_content_tokens``, 413
``request_too_large`` when the call's pixels are over ``max_request_pixels``, and ``image_too_large`` for any part
of the call before any part is decoded.

The big images here are PNG headers without pixel data (`png_header_only`): decoding one is ``invalid_media``, so
a refusal with any other code shows that nothing was decoded first; the decoder is also replaced by one that fails
the test. tests/media/test_served_budgets.py sends real 7,070 x 7,070 PNGs to a server process.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import spinf.media.images
from spinf.errors import ApiError
from spinf.media.items import decode_media
from spinf.media.tokens import image_content_tokens
from spinf.protocol.request import parse_score_request
from spinf.settings import Limits
from tests.media.fixtures import data_url, image_bytes, noise_image, png_header_only

BIG = data_url(png_header_only(7070, 7070))  # 49,984,900 pixels declared, none sent
QUERY = {"id": "q", "template": "\n\nIs it a cat? Answer:{?}", "options": [" yes", " no"]}


def image(url: str = BIG, detail: str = "auto") -> dict:
    return {"type": "image_url", "image_url": {"url": url, "detail": detail}}


def video(count: int, url: str = BIG) -> dict:
    return {"type": "video", "video": {"frames": [{"t": j, "image_url": {"url": url}} for j in range(count)]}}


DEFAULTS = Limits()


def request(*inputs: list[dict], limits: Limits = DEFAULTS, body: dict | None = None, trusted: bool = False):
    messages = [{"id": str(i), "messages": [{"content": parts}]} for i, parts in enumerate(inputs)]
    return parse_score_request(
        {"inputs": messages, "scoring": {"queries": [QUERY]}, **(body or {})},
        model_media=frozenset({"image", "video", "audio"}),
        limits=limits,
        trusted=trusted,
    )


@pytest.fixture
def no_decoding(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a pixel was decoded")

    monkeypatch.setattr(spinf.media.images, "decode_image_bytes", refuse)


def refusal(req, scheme: str = "gemma") -> tuple[int, str, str | None, str]:
    with pytest.raises(ApiError) as refused:
        decode_media(req, scheme)
    error = refused.value
    return error.status, error.code, error.param, error.message


def test_200_huge_frames_are_content_too_long_from_their_headers(no_decoding):
    """Regression: 200 frames of 7,070 x 7,070 pixels were decoded (0.63 s each) before ``content_too_long``."""
    status, code, param, message = refusal(request([video(200)]))
    assert (status, code, param) == (400, "content_too_long", "inputs.0")
    assert message == (
        "the content has at least 13200 tokens in its images and video frames alone (counted from their sizes); "
        "the limit is 4096"
    )  # 200 frames of 8 x 8 blocks at the video's low detail, each with its 2 markers


def test_the_pixels_of_a_call_are_refused_over_max_request_pixels(no_decoding):
    within = request(*[[image()] for _ in range(3)], limits=Limits(max_request_pixels=3 * 49_984_900))
    over = request(*[[image()] for _ in range(3)], limits=Limits(max_request_pixels=3 * 49_984_900 - 1))
    with pytest.raises(AssertionError, match="^a pixel was decoded$"):  # under the budget: decoded
        decode_media(within)
    assert refusal(over) == (
        413,
        "request_too_large",
        None,
        "the request's images and video frames have 149,954,700 pixels; the limit (max_request_pixels) is 149,954,699",
    )
    assert refusal(request(*[[image()] for _ in range(9)]))[:2] == (413, "request_too_large")  # the default


def test_a_trusted_callers_max_request_pixels_is_capped_by_the_servers(no_decoding):
    lowered = request([image()], body={"limits": {"max_request_pixels": 1000}}, trusted=True)
    assert refusal(lowered)[:2] == (413, "request_too_large")
    raised = request(*[[image()] for _ in range(9)], body={"limits": {"max_request_pixels": 10**12}}, trusted=True)
    assert refusal(raised)[:2] == (413, "request_too_large")


def test_header_refusals_of_every_part_come_before_the_budgets_and_any_decoding(no_decoding):
    """The order: what the headers refuse (here ``image_too_large`` in the second input), then each input's tokens,
    then the call's pixels, and only then decoding."""
    limits = Limits(max_image_pixels=49_984_899)
    status, code, param, _ = refusal(request([video(200)], [image(), image(BIG)], limits=limits))
    assert (status, code, param) == (400, "image_too_large", "inputs.0.messages.0.content.0.video.frames.0")
    limits = Limits(max_request_pixels=1)
    assert refusal(request([image()], [video(200)], limits=limits))[1:3] == ("content_too_long", "inputs.1")


def test_a_header_refusal_comes_before_a_refusal_only_decoding_finds():
    """Two rounds: a corrupt image body in the first input is found only by decoding, so the second input's
    ``image_too_large`` (its header) is the refusal."""
    corrupt = data_url(png_header_only(10, 10, idat=b"not zlib"))
    got = refusal(request([image(corrupt)], [image()], limits=Limits(max_image_pixels=1_000_000)))
    assert got[1:3] == ("image_too_large", "inputs.1.messages.0.content.0")


@pytest.mark.parametrize("scheme", ["gemma", "qwen"])
@pytest.mark.parametrize(("height", "width", "detail"), [(64, 96, "low"), (300, 200, "auto"), (37, 1000, "high")])
def test_the_header_count_is_the_count_of_the_decoded_item(scheme, height, width, detail):
    url = data_url(image_bytes(noise_image(height, width)))
    decoded = decode_media(request([image(url, detail)]), scheme)
    [item] = decoded.inputs[0].segments[0].decoded
    assert image_content_tokens(height, width, detail, scheme) == item.num_tokens + 2


def test_a_call_within_its_budgets_decodes_as_before():
    url = data_url(image_bytes(noise_image(48, 48)))
    req = request([image(url), video(3, url)], limits=attrs.evolve(Limits(), max_request_pixels=4 * 48 * 48))
    segments = decode_media(req).inputs[0].segments
    assert [len(seg.decoded) for seg in segments] == [1, 6]  # the image; three timestamps and three frames
    assert np.asarray(segments[0].decoded[0].blocks).shape == (256, 48 * 48 * 3)  # scaled up to auto's 280
