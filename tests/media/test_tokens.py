"""Token counts of engine spec A.14 for Gemma (spinf.media.tokens): image sizes, audio segments, timestamps."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from spinf.media import tokens
from spinf.media.tokens import (
    DETAIL_TOKENS,
    MAX_SEGMENT_TOKENS,
    audio_content_tokens,
    audio_segments,
    audio_tokens,
    gemma_image_content_tokens,
    gemma_image_size,
    gemma_image_tokens,
    video_timestamp,
)

SIZES = [(h, w) for h in (1, 2, 47, 48, 49, 100, 333, 480, 768, 1000, 1080, 4000) for w in (1, 3, 48, 95, 640, 1920)]


@pytest.mark.parametrize("detail", ["low", "auto", "high"])
@pytest.mark.parametrize(("height", "width"), SIZES)
def test_image_size_is_the_spec_formula(height, width, detail):
    soft = DETAIL_TOKENS[detail]
    th, tw = gemma_image_size(height, width, detail)
    f = math.sqrt(soft * 2304 / (height * width))
    expected_h, expected_w = math.floor(f * height / 48) * 48, math.floor(f * width / 48) * 48
    if expected_h == 0:
        expected_h, expected_w = 48, min(width // height * 48, soft // 9 * 48)
    elif expected_w == 0:
        expected_h, expected_w = min(height // width * 48, soft // 9 * 48), 48
    assert (th, tw) == (expected_h, expected_w)
    assert th % 48 == 0 and tw % 48 == 0 and th >= 48 and tw >= 48
    assert gemma_image_tokens(height, width, detail) == (th // 48) * (tw // 48) <= soft
    assert gemma_image_content_tokens(height, width, detail) == (th // 48) * (tw // 48) + 2


@pytest.mark.parametrize(("detail", "blocks"), [("low", 70), ("auto", 280), ("high", 1120)])
def test_an_image_of_exactly_the_budget_keeps_its_size(detail, blocks):
    # 10 x 7 blocks is 70; scaled by 2 and 4 per side it is 280 and 1,120.
    scale = {70: 1, 280: 2, 1120: 4}[blocks]
    height, width = 480 * scale, 336 * scale
    assert gemma_image_size(height, width, detail) == (height, width)
    assert gemma_image_tokens(height, width, detail) == blocks


def test_small_images_are_scaled_up_and_large_ones_down():
    assert gemma_image_size(1, 1, "auto") == (768, 768)  # 16 x 16 = 256 blocks <= 280
    assert gemma_image_size(10_000, 10_000, "low") == (384, 384)  # 8 x 8 = 64 <= 70
    assert gemma_image_size(10_000, 10_000, "high") == (1584, 1584)  # 33 x 33 = 1,089 <= 1,120


@pytest.mark.parametrize(
    ("height", "width", "detail", "expected"),
    [
        # An aspect ratio above the budget floors one side to 0: one row of 48 and at most floor(soft / 9) blocks.
        (1, 1_000_000, "auto", (48, 31 * 48)),
        (1_000_000, 1, "auto", (31 * 48, 48)),
        (1, 1_000_000, "low", (48, 7 * 48)),
        (1, 1_000_000, "high", (48, 124 * 48)),
        # The long side's share caps it before floor(soft / 9) does.
        (10, 801, "low", (48, min(80, 7) * 48)),
        (1, 3, "low", (192, 672)),  # an ordinary ratio, no fallback
    ],
)
def test_extreme_aspect_ratios_fall_back_to_one_row(height, width, detail, expected):
    assert gemma_image_size(height, width, detail) == expected


@pytest.mark.parametrize(
    ("height", "width", "detail", "expected"),
    [(55, 154, "low", (192, 672)), (110, 77, "auto", (912, 672)), (85, 238, "high", (912, 2640))],
)
def test_float_edges_follow_the_formula_not_exact_arithmetic(height, width, detail, expected):
    """(f * h / 48)**2 = soft * h / w: here a perfect square, so exact arithmetic gives one more row of blocks
    than the spec's float formula, which lands just below the whole number and floors. The formula wins (and
    transformers' processor agrees, see test_images)."""
    soft = DETAIL_TOKENS[detail]
    exact_rows = math.isqrt(soft * height // width)
    assert Fraction(soft * height, width) == exact_rows**2
    assert gemma_image_size(height, width, detail) == expected
    assert expected[0] == (exact_rows - 1) * 48


def test_image_sizes_must_be_positive():
    with pytest.raises(ValueError, match=r"^an image has at least one pixel a side, not 0x5$"):
        gemma_image_size(0, 5, "auto")


@pytest.mark.parametrize(
    ("samples", "tokens"),
    [(0, 0), (1, 1), (639, 1), (640, 1), (641, 2), (1280, 2), (16_000, 25), (16_001, 26), (480_000, 750)],
)
def test_audio_tokens_are_40_ms_each_the_last_one_zero_padded(samples, tokens):
    assert audio_tokens(samples) == tokens


@pytest.mark.parametrize(
    ("seconds", "segments"),
    [
        (0, ()),
        (0.04, (1,)),
        (1, (25,)),
        (30, (750,)),
        (30.04, (750, 1)),
        (60, (750, 750)),
        (61.5, (750, 750, 38)),  # 61.5 s = 1,537.5 tokens -> 1,538
        (600, (750,) * 20),
    ],
)
def test_audio_segments_hold_at_most_750_tokens(seconds, segments):
    samples = round(seconds * 16_000)
    assert audio_segments(samples) == segments
    assert audio_content_tokens(samples) == sum(segments) + 2 * len(segments)


@pytest.mark.parametrize("samples", [0, 1, 639, 640, 641, 479_999, 480_000, 480_001, 480_640, 960_001, 9_600_000])
def test_audio_segments_add_up_to_the_tokens(samples):
    segments = audio_segments(samples)
    assert sum(segments) == audio_tokens(samples)
    assert all(0 < s <= MAX_SEGMENT_TOKENS for s in segments)
    assert all(s == MAX_SEGMENT_TOKENS for s in segments[:-1])


def test_audio_sample_counts_are_not_negative():
    with pytest.raises(ValueError, match=r"^a sample count is not negative, not -1$"):
        audio_tokens(-1)


@pytest.mark.parametrize(
    ("t", "first", "text"),
    [
        (0, True, "00:00 "),
        (0, False, " 00:00 "),
        (0.999, True, "00:00 "),
        (59.999999, False, " 00:59 "),
        (60, False, " 01:00 "),
        (119.99999999999999, False, " 01:59 "),
        (61.5, True, "01:01 "),
        (3599, False, " 59:59 "),
        (3600, False, " 60:00 "),
        (6000.2, False, " 100:00 "),
    ],
)
def test_video_timestamps_are_whole_minutes_and_seconds(t, first, text):
    assert video_timestamp(t, first=first) == text


@pytest.mark.parametrize("t", [-1, float("inf"), float("nan")])
def test_video_timestamps_need_a_finite_time(t):
    with pytest.raises(ValueError, match=r"^a frame time is a finite number of seconds >= 0, not .*$"):
        video_timestamp(t, first=True)


QWEN_SIZES = [(1, 1), (31, 33), (32, 32), (48, 48), (255, 257), (256, 256), (300, 400), (1080, 1920), (4000, 3000),
              (16, 3000), (7, 1400), (1023, 1025), (2048, 2048), (4095, 4097), (12_000, 9_000), (200, 1)]  # fmt: skip


@pytest.mark.parametrize(("height", "width"), QWEN_SIZES)
@pytest.mark.parametrize("detail", ["low", "auto", "high"])
def test_qwen_image_sizes_follow_transformers_qwen_vl_rule(height, width, detail):
    """The Qwen-VL resize rule with factor 32 and the detail's budget (engine spec A.14.3) as transformers computes
    it (its PIL image processor's ``smart_resize``), including the rounding edges around the budget and the minimum;
    the token count is one per 32x32 block and stays within the budget."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    budget = tokens.QWEN_DETAIL_TOKENS[detail]
    expected = smart_resize(height, width, factor=32, min_pixels=64 * 32 * 32, max_pixels=budget * 32 * 32)
    assert tokens.qwen_image_size(height, width, detail) == expected
    count = tokens.qwen_image_tokens(height, width, detail)
    assert count == (expected[0] // 32) * (expected[1] // 32) and count <= budget


def test_a_qwen_image_over_the_aspect_ratio_is_refused():
    with pytest.raises(ValueError, match="aspect ratio of 200"):
        tokens.qwen_image_size(1, 201, "auto")
