"""Media files made in the tests themselves: images with Pillow, audio with PyAV, and hostile variants by hand."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import av
import numpy as np
from PIL import Image

# The container and codec each input_audio format is written with.
AUDIO_WRITERS = {
    "wav": ("wav", "pcm_s16le"),
    "mp3": ("mp3", "libmp3lame"),
    "flac": ("flac", "flac"),
    "ogg": ("ogg", "libopus"),  # the wheel has no libvorbis encoder; ffmpeg's own is stereo-only
    "m4a": ("ipod", "aac"),
    "webm": ("webm", "libopus"),
}
IMAGE_FORMATS = {"png": "PNG", "jpeg": "JPEG", "jpg": "JPEG", "webp": "WEBP", "gif": "GIF"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def noise_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def image_bytes(pixels: np.ndarray | Image.Image, fmt: str = "png", **save) -> bytes:
    image = pixels if isinstance(pixels, Image.Image) else Image.fromarray(pixels)
    out = io.BytesIO()
    image.save(out, format=IMAGE_FORMATS[fmt], **save)
    return out.getvalue()


def data_url(data: bytes, subtype: str = "png") -> str:
    return f"data:image/{subtype};base64,{b64(data)}"


def video_part(frames: list[np.ndarray], times: list[float]) -> dict:
    """A ``video`` content part of PNG frames sampled at ``times`` (seconds)."""
    sampled = [{"t": t, "image_url": {"url": data_url(image_bytes(f))}} for t, f in zip(times, frames, strict=True)]
    return {"type": "video", "video": {"frames": sampled}}


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_header_only(width: int, height: int, idat: bytes = b"") -> bytes:
    """A PNG declaring ``width`` x ``height`` RGB pixels with only ``idat`` as data: a bomb or a truncated file."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def png_rows(width: int, height: int) -> bytes:
    """A valid black RGB PNG written row by row with zlib: fast for extreme shapes."""
    raw = (b"\x00" + bytes(3 * width)) * height
    return png_header_only(width, height, zlib.compress(raw, 9))


def tone(seconds: float, rate: int = 16_000, channels: int = 1, freq: float = 440.0) -> np.ndarray:
    """A sine ``[channels, samples]`` float32 at ``rate``."""
    t = np.arange(round(seconds * rate)) / rate
    wave = (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    return np.stack([wave * (0.5 + 0.5 * c / max(channels, 1)) for c in range(channels)])


def audio_bytes(samples: np.ndarray, fmt: str, rate: int = 16_000) -> bytes:
    """``samples`` ``[channels, n]`` float32 encoded as an ``fmt`` file with PyAV."""
    container_format, codec = AUDIO_WRITERS[fmt]
    out = io.BytesIO()
    channels = samples.shape[0]
    layout = "mono" if channels == 1 else "stereo"
    with av.open(out, mode="w", format=container_format) as container:
        coded_rate = 48_000 if codec == "libopus" else rate  # opus codes 8, 12, 16, 24 or 48 kHz
        stream = container.add_stream(codec, rate=coded_rate, layout=layout)
        frame_size = stream.codec_context.frame_size or 1024
        fmt_name = stream.codec_context.format.name
        resampler = av.AudioResampler(format=fmt_name, layout=layout, rate=coded_rate, frame_size=frame_size)
        for start in range(0, samples.shape[1], frame_size):
            chunk = np.ascontiguousarray(samples[:, start : start + frame_size])
            frame = av.AudioFrame.from_ndarray(chunk.T.reshape(1, -1), "flt", layout)  # packed: interleaved
            frame.sample_rate = rate
            frame.pts = start
            for converted in resampler.resample(frame):
                container.mux(stream.encode(converted))
        for converted in resampler.resample(None):
            container.mux(stream.encode(converted))
        container.mux(stream.encode(None))
    return out.getvalue()


def wav_header(rate: int, channels: int, declared_data_bytes: int, data: bytes) -> bytes:
    """A 16-bit PCM WAV whose header declares ``declared_data_bytes`` of data, followed by ``data``."""
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * channels * 2, channels * 2, 16)
    riff_size = min(4 + 8 + len(fmt) + 8 + declared_data_bytes, 0xFFFFFFFF)
    return (
        b"RIFF"
        + struct.pack("<I", riff_size)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", declared_data_bytes)
        + data
    )
