"""The token counts of engine spec A.14, as pure functions of sizes and sample counts (Gemma; Qwen images too).

Images (A.14.2, api spec §4.3): one soft token per 48x48 block after the resize that scales the area to the
detail's budget. The arithmetic is the spec's, in the spec's order, on Python floats: ``f = sqrt(soft * 48**2 /
(h * w))``, sides ``floor(f * h / 48) * 48``. Where the exact real value of ``f * h / 48`` is a whole number the
float result may land just below it and lose a row of blocks; that is the formula as specified (transformers'
Gemma 4 processor computes the same floats), so it is kept. A side that floors to 0 (an aspect ratio above the
budget) becomes one row of 48 and the other side ``min(floor(long / short) * 48, floor(soft / 9) * 48)``, as §4.3
states.

Audio (A.14.4): one token per 640 samples at 16 kHz (40 ms); a partial last frame is zero-padded into a token of
its own (§4.3: "the last frame zero-padded"), so tokens = ceil(samples / 640). Tokens come in segments of at most
750, each with its 2 markers.

Video (A.14.5): each frame is an image at the video's detail; its timestamp text is tokenized by the engine as text.
"""

from __future__ import annotations

import math

BLOCK = 48
MARKERS = 2  # the start and end marker around every image, frame and audio segment
DETAIL_TOKENS = {"low": 70, "auto": 280, "high": 1120}
DETAILS = tuple(DETAIL_TOKENS)

SAMPLE_RATE = 16_000
SAMPLES_PER_TOKEN = 640  # 40 ms at 16 kHz
MAX_SEGMENT_TOKENS = 750  # 30 s
MAX_INPUT_AUDIO_SECONDS = 600  # engine spec A.14.4: per input; longer audio is cut there, not refused
MAX_INPUT_AUDIO_SAMPLES = MAX_INPUT_AUDIO_SECONDS * SAMPLE_RATE


def gemma_image_size(height: int, width: int, detail: str) -> tuple[int, int]:
    """The resized ``(height, width)`` of an image at ``detail``: both multiples of 48, at least 48."""
    if height < 1 or width < 1:
        raise ValueError(f"an image has at least one pixel a side, not {height}x{width}")
    soft = DETAIL_TOKENS[detail]
    f = math.sqrt(soft * BLOCK**2 / (height * width))
    th = math.floor(f * height / BLOCK) * BLOCK
    tw = math.floor(f * width / BLOCK) * BLOCK
    longest = (soft // 9) * BLOCK
    # Both cannot be 0: (f * h) * (f * w) = soft * 48**2, so one of them is at least 48 * sqrt(soft).
    if th == 0:
        th, tw = BLOCK, min((width // height) * BLOCK, longest)
    elif tw == 0:
        th, tw = min((height // width) * BLOCK, longest), BLOCK
    return th, tw


def gemma_image_tokens(height: int, width: int, detail: str) -> int:
    """N, the soft tokens (48x48 blocks) of an image of ``height`` x ``width`` pixels at ``detail``; no markers."""
    th, tw = gemma_image_size(height, width, detail)
    return (th // BLOCK) * (tw // BLOCK)


def gemma_image_content_tokens(height: int, width: int, detail: str) -> int:
    """What an image adds to the content tokens: its N blocks and its 2 markers."""
    return gemma_image_tokens(height, width, detail) + MARKERS


# Qwen images (engine spec A.14.3): one token per 32x32 pixels (16-px patches merged 2x2), the detail's budget in
# tokens, at least 64 tokens, an aspect ratio of at most 200
QWEN_BLOCK = 32
QWEN_DETAIL_TOKENS = {"low": 256, "auto": 1024, "high": 4096}
QWEN_MIN_TOKENS = 64
QWEN_MAX_ASPECT = 200


def qwen_image_size(height: int, width: int, detail: str) -> tuple[int, int]:
    """The resized ``(height, width)`` of an image at ``detail`` on the Qwen stack, by the standard Qwen-VL rule
    with factor 32: each side rounded to a multiple of 32; when that is over the budget's ``tokens · 32²`` pixels,
    both scaled down by ``sqrt(h · w / max)`` and floored to multiples of 32 (at least 32); when under the minimum
    (64 tokens, 65,536 pixels), scaled up by ``sqrt(min / (h · w))`` and ceiled. ``ValueError`` beyond an aspect
    ratio of 200 (the caller's 400)."""
    if height < 1 or width < 1:
        raise ValueError(f"an image has at least one pixel a side, not {height}x{width}")
    if max(height, width) / min(height, width) > QWEN_MAX_ASPECT:
        raise ValueError(f"an image of {width}x{height} pixels is over the aspect ratio of {QWEN_MAX_ASPECT}")
    block, area = QWEN_BLOCK, QWEN_BLOCK**2
    most, least = QWEN_DETAIL_TOKENS[detail] * area, QWEN_MIN_TOKENS * area
    h, w = round(height / block) * block, round(width / block) * block
    if h * w > most:
        beta = math.sqrt(height * width / most)
        h = max(block, math.floor(height / beta / block) * block)
        w = max(block, math.floor(width / beta / block) * block)
    elif h * w < least:
        beta = math.sqrt(least / (height * width))
        h, w = math.ceil(height * beta / block) * block, math.ceil(width * beta / block) * block
    return h, w


def qwen_image_tokens(height: int, width: int, detail: str) -> int:
    """N, the image tokens of an image of ``height`` x ``width`` pixels at ``detail`` on the Qwen stack (one per
    32x32 block after `qwen_image_size`); no markers."""
    h, w = qwen_image_size(height, width, detail)
    return (h // QWEN_BLOCK) * (w // QWEN_BLOCK)


def image_content_tokens(height: int, width: int, detail: str, scheme: str) -> int:
    """What an image or video frame adds to the content tokens on a stack's image ``scheme`` (``gemma``: 48-px
    blocks; ``qwen``: 32-px blocks): its tokens and its 2 markers. ``ValueError`` for a Qwen aspect ratio over 200."""
    tokens = gemma_image_tokens if scheme == "gemma" else qwen_image_tokens
    return tokens(height, width, detail) + MARKERS


def audio_tokens(num_samples: int) -> int:
    """The audio tokens of ``num_samples`` samples at 16 kHz: ceil(samples / 640), the last frame zero-padded."""
    if num_samples < 0:
        raise ValueError(f"a sample count is not negative, not {num_samples}")
    return -(-num_samples // SAMPLES_PER_TOKEN)


def audio_segments(num_samples: int) -> tuple[int, ...]:
    """The token count of each segment of an audio clip, in order: 750 each, the rest in the last one."""
    full, rest = divmod(audio_tokens(num_samples), MAX_SEGMENT_TOKENS)
    return (MAX_SEGMENT_TOKENS,) * full + ((rest,) if rest else ())


def audio_content_tokens(num_samples: int) -> int:
    """What an audio clip adds to the content tokens: its tokens and 2 markers per segment."""
    segments = audio_segments(num_samples)
    return sum(segments) + MARKERS * len(segments)


def video_timestamp(t: float, *, first: bool) -> str:
    """The text before a frame at ``t`` seconds: ``"mm:ss "``, with a leading space after the first frame.

    mm = floor(t / 60) and ss = floor(t mod 60), each at least two digits; computed from the whole seconds
    ``floor(t)`` so that a ``t`` just under a minute never shows as the next minute's ``:59``.
    """
    if not (t >= 0 and math.isfinite(t)):
        raise ValueError(f"a frame time is a finite number of seconds >= 0, not {t!r}")
    minutes, seconds = divmod(math.floor(t), 60)
    text = f"{minutes:02d}:{seconds:02d} "
    return text if first else " " + text
