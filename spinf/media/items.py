"""A request's media decoded into what the engine reads: vision items (an image or a video frame as its 48-pixel
blocks) and audio items (one segment of at most 750 frames), in content order with the video timestamps between.

`decode_media` runs first of the engine's checks (api spec §4.9 step 1): every input's media parts, in input order,
so a media refusal comes before any per-input check. Images and video frames are read as far as their headers
first, and their tokens and pixels are checked from the sizes there before any pixel is decoded: a 6 KB PNG of
7,070 x 7,070 pixels took 0.63 s to decode, and 200 of them in one body held a worker for minutes before the
``content_too_long`` that their sizes already decided. It runs in a worker thread (the server's packer hands a call
with media to one before the engine loop takes it), never on the event loop or the GPU thread, and keeps only the
model-sized data of each part: an image's blocks as uint8 (at most 1,120 x 6,912 bytes), not its sent pixels.

`content_pieces` lays a decoded input out as the compiler tokenizes it (engine spec A.2, A.14): text runs as
strings (adjacent ones merged, so a video's timestamps join the text around them), then each media item, which
the compiler writes as start marker + placeholders + end marker.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import attrs
import numpy as np

from spinf.errors import ApiError, bad_request
from spinf.media.audio import audio_frames, cap_input_audio, decode_audio_part
from spinf.media.images import (
    ImageHeader,
    decode_image,
    gemma_blocks,
    gemma_image_resized,
    gemma_resize,
    read_image_part,
)
from spinf.media.qwen_images import QwenVisionItem, qwen_image_resized, qwen_item, qwen_resize
from spinf.media.tokens import SAMPLE_RATE, SAMPLES_PER_TOKEN, audio_segments, image_content_tokens
from spinf.media.video import VideoHeader, decode_video, read_video_part
from spinf.protocol.types import InputSpec, MediaPart, ScoreRequest


@attrs.frozen(eq=False)
class VisionItem:
    """One image or video frame for the vision embedder: ``blocks`` [N, 48*48*3] uint8 (raster order, HWC inside a
    block), ``positions`` [N, 2] (column, row). Its placeholders attend to each other as A.14.6 says."""

    blocks: np.ndarray
    positions: np.ndarray
    kind: str  # "image" or "video" (a frame)
    embedder = "vision"
    rope_shift = 0  # Gemma's placeholders take one position each
    milliseconds = 0.0  # of sound: none (usage counts every item's)

    @property
    def num_tokens(self) -> int:
        return len(self.blocks)


@attrs.frozen(eq=False)
class AudioItem:
    """One audio segment for the audio embedder: ``frames`` [n, 640] float32 (n <= 750, the last frame of the clip
    zero-padded) and the milliseconds of sound it holds."""

    frames: np.ndarray
    milliseconds: float
    kind = "audio"
    embedder = "audio"
    rope_shift = 0

    @property
    def num_tokens(self) -> int:
        return len(self.frames)


MediaItem = VisionItem | AudioItem | QwenVisionItem
SCHEMES = ("gemma", "qwen")  # how images become items: Gemma's 48-px blocks, the Qwen tower's 16-px patches


def has_media(req: ScoreRequest) -> bool:
    return any(isinstance(s, MediaPart) for inp in req.inputs for s in inp.segments)


# Parts are decoded this many at a time: a call of 64 photos took 0.23 s on the H200 machine against 0.98 s in one
# thread (Pillow releases the GIL while it decodes and resizes). Audio goes through the same pool, where it gains
# little: PyAV's resampling holds the GIL frame by frame (16 clips of 30 s took 1.8 to 3.0 s in 8 threads against
# 0.71 s in one); 16 kHz PCM skips the resampler (`spinf.media.audio._DIRECT`), and then took 0.85 s in 8 threads.
DECODE_THREADS = max(1, min(8, os.cpu_count() or 1))
_pool: ThreadPoolExecutor | None = None


def _decoders() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=DECODE_THREADS, thread_name_prefix="spinf-media")
    return _pool


def decode_media(req: ScoreRequest, scheme: str = "gemma") -> ScoreRequest:
    """``req`` with every media part's ``decoded`` set: a tuple of `VisionItem` (`QwenVisionItem` under the
    ``qwen`` scheme), `AudioItem` and, for a video, the timestamp strings before its frames.

    Two rounds. First every image and video part is read as far as its headers (`read_headers`), and what they
    decide is checked before any pixel is decoded: the refusals of the data itself (data URL, base64, file type,
    ``image_too_large``, the frame list), then each input's image and frame tokens against
    ``max_content_tokens`` (``content_too_long``: the content has at least those), then the call's pixels against
    ``max_request_pixels`` (413 ``request_too_large``). Then the parts are decoded `DECODE_THREADS` at a time, and
    what only decoding finds (corrupt pixel data, audio) is refused. In each round the first refusal in input
    and part order is raised (`ApiError`, api spec §4.3)."""
    if not has_media(req) or all(s.decoded is not None for inp in req.inputs for s in _parts(inp)):
        return req
    headers = read_headers(req)
    check_budgets(req, headers, scheme)
    jobs = [
        [
            (k, _decoders().submit(_decode_part, seg, found.get(k), req.limits, scheme))
            for k, seg in enumerate(inp.segments)
            if isinstance(seg, MediaPart)
        ]  # fmt: skip
        for inp, found in zip(req.inputs, headers, strict=True)
    ]
    try:
        decoded = [{k: job.result() for k, job in per_input} for per_input in jobs]
    finally:
        for per_input in jobs:
            for _, job in per_input:
                job.cancel()
    return attrs.evolve(req, inputs=tuple(_decoded_input(inp, d) for inp, d in zip(req.inputs, decoded, strict=True)))


Header = ImageHeader | VideoHeader


def read_headers(req: ScoreRequest) -> list[dict[int, Header]]:
    """Per input, each image and video part (by segment index) read as far as its headers; audio is not read here."""
    limits = req.limits
    found: list[dict[int, Header]] = []
    for inp in req.inputs:
        per_input: dict[int, Header] = {}
        for k, seg in enumerate(inp.segments):
            if not isinstance(seg, MediaPart):
                continue
            if seg.kind == "image":
                per_input[k] = read_image_part(seg.payload, seg.path, max_pixels=limits.max_image_pixels)
            elif seg.kind == "video":
                per_input[k] = read_video_part(
                    seg.payload, seg.path, max_frames=limits.max_frames, max_pixels=limits.max_image_pixels
                )
        found.append(per_input)
    return found


def check_budgets(req: ScoreRequest, headers: list[dict[int, Header]], scheme: str) -> None:
    """Refuses, from the headers alone, an input whose images and frames are over ``max_content_tokens`` and a
    call whose images and frames are over ``max_request_pixels``."""
    limits = req.limits
    for i, found in enumerate(headers):
        tokens = sum(_image_tokens(image, scheme) for header in found.values() for image in _images(header))
        if tokens > limits.max_content_tokens:
            raise bad_request(
                "content_too_long",
                f"inputs.{i}",
                f"the content has at least {tokens} tokens in its images and video frames alone (counted from their "
                f"sizes); the limit is {limits.max_content_tokens}",
            )
    pixels = sum(image.num_pixels for found in headers for header in found.values() for image in _images(header))
    if pixels > limits.max_request_pixels:
        raise ApiError(
            413,
            "request_too_large",
            None,
            f"the request's images and video frames have {pixels:,} pixels; the limit (max_request_pixels) is "
            f"{limits.max_request_pixels:,}",
        )


def _images(header: Header) -> tuple[ImageHeader, ...]:
    return (header,) if isinstance(header, ImageHeader) else tuple(image for _, image in header.frames)


def _image_tokens(image: ImageHeader, scheme: str) -> int:
    try:
        return image_content_tokens(image.height, image.width, image.detail, scheme)
    except ValueError as exc:  # a Qwen aspect ratio over 200
        raise bad_request("invalid_media", image.path, str(exc)) from exc


def _parts(inp: InputSpec) -> Iterator[MediaPart]:
    return (s for s in inp.segments if isinstance(s, MediaPart))


def _decode_part(seg: MediaPart, header: Header | None, limits, scheme: str = "gemma") -> tuple | object:
    """One part decoded: an image's or a video's pieces from its header, or an audio part's clip (cut and split per
    input later)."""
    resize = gemma_resize if scheme == "gemma" else lambda pixels, detail: qwen_resize(pixels, detail, seg.path)
    if isinstance(header, ImageHeader):
        image = decode_image(header, max_pixels=limits.max_image_pixels, resize=resize)
        return (_vision(image, "image", scheme),)
    if isinstance(header, VideoHeader):
        video = decode_video(header, max_pixels=limits.max_image_pixels, resize=resize)
        pieces: list = []
        for stamp, frame in zip(video.timestamps(), video.frames, strict=True):
            pieces += [stamp, _vision(frame.image, "video", scheme)]
        return tuple(pieces)
    return decode_audio_part(seg.payload, seg.path, max_seconds=limits.max_audio_seconds)


def _decoded_input(inp: InputSpec, decoded: dict[int, object]) -> InputSpec:
    clips = {k: part for k, part in decoded.items() if not isinstance(part, tuple)}
    for k, clip in zip(clips, cap_input_audio(clips.values()), strict=True):  # A.14.4: 600 s per input
        decoded[k] = tuple(_audio_segments(clip.samples))
    segments = tuple(
        attrs.evolve(seg, decoded=decoded[k]) if isinstance(seg, MediaPart) else seg
        for k, seg in enumerate(inp.segments)
    )
    return attrs.evolve(inp, segments=segments)


def _vision(image, kind: str, scheme: str) -> VisionItem | QwenVisionItem:
    if scheme == "qwen":
        return qwen_item(qwen_image_resized(image), kind)
    blocks, positions = gemma_blocks(gemma_image_resized(image))
    return VisionItem(blocks, positions, kind)


def _audio_segments(samples: np.ndarray) -> Iterator[AudioItem]:
    """A clip's segments of at most `MAX_SEGMENT_TOKENS` frames (30 s) each, the last frame zero-padded (A.14.4)."""
    frames = audio_frames(samples)
    at = 0
    for count in audio_segments(len(samples)):
        part = frames[at : at + count]
        sound = min(len(samples), (at + count) * SAMPLES_PER_TOKEN) - at * SAMPLES_PER_TOKEN
        yield AudioItem(part, sound * 1000 / SAMPLE_RATE)
        at += count


def content_pieces(inp: InputSpec) -> list[str | MediaItem]:
    """The input's content as text runs and media items in reading order (api spec §4.3: images already at the
    front, audio and videos in place, a video's timestamps merged into the text around them)."""
    pieces: list[str | MediaItem] = []
    for seg in inp.segments:
        parts = seg.decoded if isinstance(seg, MediaPart) else (seg,)
        if parts is None:
            raise ValueError(f"{seg.path}: the media part was not decoded (decode_media runs before compiling)")
        for part in parts:
            if isinstance(part, str) and pieces and isinstance(pieces[-1], str):
                pieces[-1] += part
            elif not (isinstance(part, str) and not part):
                pieces.append(part)
    return pieces
