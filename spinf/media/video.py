"""Video parts: the caller's sampled frames, each an image at the video's detail, and their timestamp texts.

A video payload is ``{frames: [{t, image_url: {url, detail}}], detail = "low"}`` (api spec §4.3); the server never
decodes video. Checks, in order: the video's ``detail`` (``invalid_media`` at the part); the frame list, 1 to
``max_frames`` (``invalid_field`` at ``….video.frames``); then frame by frame its ``t``, a finite number >= 0 and
not below the previous frame's (``invalid_field`` at ``….video.frames.<j>.t``), and its image (``invalid_media``
or ``image_too_large`` at ``….video.frames.<j>``). A frame's own ``image_url.detail`` is ignored, as the spec
says, and not checked. Engine spec A.14.5: every frame is preceded by ``"mm:ss "`` (the first) or ``" mm:ss "``.
"""

from __future__ import annotations

import math

import attrs

from spinf.errors import bad_request
from spinf.media.images import DecodedImage, ImageHeader, Resize, decode_image, read_image_part
from spinf.media.payload import check_detail, invalid_media
from spinf.media.tokens import gemma_image_content_tokens, video_timestamp


@attrs.frozen(eq=False)
class VideoFrame:
    t: float
    image: DecodedImage


@attrs.frozen(eq=False)
class Video:
    """A video part decoded: its frames in order, all read at ``detail``."""

    frames: tuple[VideoFrame, ...]
    detail: str
    path: str

    def timestamps(self) -> tuple[str, ...]:
        """The text before each frame, in order (A.14.5); the engine tokenizes each as ordinary text."""
        return tuple(video_timestamp(frame.t, first=j == 0) for j, frame in enumerate(self.frames))

    def gemma_frame_tokens(self) -> int:
        """The frames' soft tokens and markers on the Gemma stack; the timestamps' text tokens come on top."""
        return sum(gemma_image_content_tokens(f.image.height, f.image.width, self.detail) for f in self.frames)


@attrs.frozen(eq=False)
class VideoHeader:
    """A video part read as far as its frames' headers: each frame's time and image header, all at ``detail``."""

    frames: tuple[tuple[float, ImageHeader], ...]
    detail: str
    path: str


def read_video_part(payload: dict, path: str, *, max_frames: int, max_pixels: int) -> VideoHeader:
    """A ``video`` payload checked and its frames read as far as their headers, at the video's detail."""
    detail = check_detail(payload, path, "low")
    frames = payload.get("frames")
    frames_path = f"{path}.video.frames"
    if not isinstance(frames, list) or not 1 <= len(frames) <= max_frames:
        got = f"{len(frames):,} frames" if isinstance(frames, list) else "no frame list"
        message = f"a video has 1 to {max_frames:,} frames (max_frames), not {got}"
        raise bad_request("invalid_field", frames_path, message)
    read: list[tuple[float, ImageHeader]] = []
    for j, frame in enumerate(frames):
        frame_path = f"{frames_path}.{j}"
        if not isinstance(frame, dict):
            raise bad_request("invalid_field", frame_path, "a video frame must be an object {t, image_url}")
        t = _frame_time(frame.get("t"), f"{frame_path}.t", read[-1][0] if read else 0.0)
        image_url = frame.get("image_url")
        if not isinstance(image_url, dict):
            raise invalid_media(frame_path, "a video frame needs an image_url object {url}")
        read.append((t, read_image_part(image_url, frame_path, max_pixels=max_pixels, detail=detail)))
    return VideoHeader(frames=tuple(read), detail=detail, path=path)


def decode_video(header: VideoHeader, *, max_pixels: int, resize: Resize | None = None) -> Video:
    """The frames of a video read by `read_video_part`, decoded (each resized at once with ``resize`` when given:
    up to 1,024 frames are held, so the engine should pass one)."""
    frames = (VideoFrame(t, decode_image(image, max_pixels=max_pixels, resize=resize)) for t, image in header.frames)
    return Video(frames=tuple(frames), detail=header.detail, path=header.path)


def decode_video_part(
    payload: dict, path: str, *, max_frames: int, max_pixels: int, resize: Resize | None = None
) -> Video:
    """A ``video`` payload read (`read_video_part`) and decoded (`decode_video`)."""
    header = read_video_part(payload, path, max_frames=max_frames, max_pixels=max_pixels)
    return decode_video(header, max_pixels=max_pixels, resize=resize)


def _frame_time(t: object, path: str, previous: float) -> float:
    seconds = _finite_seconds(t)
    if seconds is None or seconds < 0:
        raise bad_request("invalid_field", path, f"a frame time t must be a finite number of seconds >= 0, not {t!r}")
    if seconds < previous:
        raise bad_request("invalid_field", path, f"frame times must not decrease: {t!r} comes after {previous!r}")
    return seconds


def _finite_seconds(t: object) -> float | None:
    """``t`` as a finite float, or None when it is not a JSON number (a bool is not) or has no finite float."""
    if isinstance(t, bool) or not isinstance(t, int | float):
        return None
    try:
        seconds = float(t)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) else None
