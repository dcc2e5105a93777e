"""Video parts (spinf.media.video): frames at the video's detail, the frame list and time checks, timestamps."""

from __future__ import annotations

import re

import numpy as np
import pytest

from spinf.errors import ApiError
from spinf.media.images import gemma_image_patches, gemma_resize
from spinf.media.video import decode_video_part
from tests.media.fixtures import data_url, image_bytes, noise_image, png_header_only

PATH = "inputs.0.messages.1.content.3"
FRAMES = f"{PATH}.video.frames"
URL = data_url(image_bytes(noise_image(90, 160)))


def video(times, video_detail=None, url=URL, **image_url):
    """A video payload; ``image_url`` adds keys to every frame's image_url (a frame's own detail)."""
    payload = {"frames": [{"t": t, "image_url": {"url": url, **image_url}} for t in times]}
    return payload if video_detail is None else {**payload, "detail": video_detail}


def decoded(payload, *, max_frames=1024, max_pixels=50_000_000):
    return decode_video_part(payload, PATH, max_frames=max_frames, max_pixels=max_pixels)


def refused(payload, code, param, match, **limits):
    with pytest.raises(ApiError) as caught:
        decoded(payload, **limits)
    error = caught.value
    assert (error.status, error.code, error.param) == (400, code, param)
    assert re.match(match, error.message), error.message


def test_frames_are_read_at_the_video_detail_default_low():
    clip = decoded(video([0, 1.5, 61], detail="high"))  # the frames say high; the video, by default, low
    assert clip.detail == "low" and [f.t for f in clip.frames] == [0.0, 1.5, 61.0]
    assert all(f.image.detail == "low" and f.image.path == f"{FRAMES}.{j}" for j, f in enumerate(clip.frames))
    assert clip.timestamps() == ("00:00 ", " 00:01 ", " 01:01 ")
    # 90 x 160 at low: f = sqrt(70 * 2304 / 14,400) = 3.35 -> 288 x 528 = 6 x 11 = 66 blocks, plus 2 markers.
    assert [gemma_image_patches(f.image).shape[0] for f in clip.frames] == [66, 66, 66]
    assert clip.gemma_frame_tokens() == 3 * 68


def test_frames_are_resized_as_they_are_decoded_when_asked():
    clip = decode_video_part(video([0, 1]), PATH, max_frames=8, max_pixels=50_000_000, resize=gemma_resize)
    assert [f.image.pixels.shape for f in clip.frames] == [(288, 528, 3)] * 2
    assert [(f.image.height, f.image.width) for f in clip.frames] == [(90, 160)] * 2
    assert clip.gemma_frame_tokens() == 2 * 68


def test_a_frame_detail_is_ignored_even_when_invalid():
    clip = decoded(video([0], video_detail="high", detail="low"))
    clip_bad = decoded(video([0], video_detail="high", detail="ultra"))
    assert clip.detail == clip_bad.detail == clip_bad.frames[0].image.detail == "high"
    np.testing.assert_array_equal(clip.frames[0].image.pixels, clip_bad.frames[0].image.pixels)


@pytest.mark.parametrize("detail", ["low", "auto", "high"])
def test_every_detail_is_accepted(detail):
    assert decoded(video([0], video_detail=detail)).frames[0].image.detail == detail


def test_a_bad_video_detail_is_invalid_media_at_the_part():
    message = r"^detail must be one of low, auto, high, not 'medium'$"
    refused(video([0], video_detail="medium"), "invalid_media", PATH, message)


def test_equal_times_are_allowed():
    assert [f.t for f in decoded(video([2, 2, 2.0])).frames] == [2.0, 2.0, 2.0]


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({}, r"^a video has 1 to 1,024 frames \(max_frames\), not no frame list$"),
        ({"frames": "x"}, r"^a video has 1 to 1,024 frames .*not no frame list$"),
        ({"frames": []}, r"^a video has 1 to 1,024 frames \(max_frames\), not 0 frames$"),
    ],
)
def test_no_frames_is_invalid_field(payload, match):
    refused(payload, "invalid_field", FRAMES, match)


def test_more_than_max_frames_is_invalid_field():
    assert len(decoded(video(range(3)), max_frames=3).frames) == 3
    message = r"^a video has 1 to 3 frames \(max_frames\), not 4 frames$"
    refused(video(range(4)), "invalid_field", FRAMES, message, max_frames=3)


@pytest.mark.parametrize(
    ("times", "bad", "match"),
    [
        ([0, 2, 1], 2, r"^frame times must not decrease: 1 comes after 2.0$"),
        ([5, 4.999], 1, r"^frame times must not decrease: 4.999 comes after 5.0$"),
        ([-1], 0, r"^a frame time t must be a finite number of seconds >= 0, not -1$"),
        ([0, "1"], 1, r"^a frame time t must be .*, not '1'$"),
        ([True], 0, r"^a frame time t must be .*, not True$"),
        ([None], 0, r"^a frame time t must be .*, not None$"),
        ([float("inf")], 0, r"^a frame time t must be .*, not inf$"),
        ([float("nan")], 0, r"^a frame time t must be .*, not nan$"),
        ([10**400], 0, r"^a frame time t must be .*"),
    ],
)
def test_bad_or_decreasing_times_are_invalid_field_at_the_frame_t(times, bad, match):
    refused(video(times), "invalid_field", f"{FRAMES}.{bad}.t", match)


def test_a_frame_that_is_not_an_object_is_invalid_field():
    refused({"frames": [{"t": 0, "image_url": {"url": URL}}, 7]}, "invalid_field", f"{FRAMES}.1", r"^a video frame")


@pytest.mark.parametrize("image_url", [None, "data:image/png;base64,AAAA", {}, {"url": "https://x/y.png"}])
def test_a_frame_without_a_readable_image_is_invalid_media_at_the_frame(image_url):
    payload = {"frames": [{"t": 0, "image_url": {"url": URL}}, {"t": 1, "image_url": image_url}]}
    refused(payload, "invalid_media", f"{FRAMES}.1", r"^(a video frame needs an image_url|the image url must be)")


def test_an_undecodable_frame_is_invalid_media_at_the_frame():
    bad = data_url(image_bytes(noise_image(8, 8))[:50])
    refused(video([0], url=bad), "invalid_media", f"{FRAMES}.0", r"^the image data")


def test_a_frame_over_max_image_pixels_is_image_too_large_at_the_frame():
    bomb = data_url(png_header_only(8_000, 8_000))
    payload = {"frames": [{"t": 0, "image_url": {"url": URL}}, {"t": 3, "image_url": {"url": bomb}}]}
    refused(payload, "image_too_large", f"{FRAMES}.1", r"^the image is 8000x8000 = 64,000,000 pixels; .*")


def test_checks_run_in_order_detail_then_frames_then_each_frame():
    # A bad detail is reported before too many frames; a bad time before the same frame's bad image.
    refused(video(range(5), video_detail="x"), "invalid_media", PATH, r"^detail", max_frames=2)
    refused(video([1, 0], url="nope"), "invalid_media", f"{FRAMES}.0", r"^the image url")
    refused({"frames": [{"t": -1, "image_url": None}]}, "invalid_field", f"{FRAMES}.0.t", r"^a frame time")
