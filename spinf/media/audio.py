"""Audio: an ``input_audio`` payload decoded with PyAV into 16 kHz mono float32, bounded in time and memory.

The limits (api spec §4.3 and §9.4, engine spec A.14.4), reconciled:

* **Per part, refused:** a part longer than ``max_audio_seconds`` (default 600) is ``400 audio_too_long`` (the
  spec's D5: we refuse where the reference cuts). "Longer" is the decoded duration, more than
  ``max_audio_seconds * 16000`` samples after resampling; a container whose header already declares more is
  refused from the header, before anything is decoded (mp3 excepted: ffmpeg may estimate an mp3's duration from
  its bitrate, which can overstate a VBR file's length). Headers are never trusted for the bound itself: decoding
  stops as soon as the count passes the limit. (A WAV header that declares more data than the file holds is
  corrected by ffmpeg from the file's size, so ten hours declared over one second of data read as one second;
  one that declares less is read up to what it declares.)
* **Per input, cut:** the engine reads at most 600 s of audio per input (A.14.4, a fixed constant); audio past
  that, over all of an input's parts in order, is dropped by `cap_input_audio`. With the default limit a single
  part never reaches it; several parts, or a raised ``max_audio_seconds``, can. A part is decoded up to its limit
  but never keeps more than 600 s of samples, so memory stays under 38 MB a part whatever the limit.

The container format is forced from the payload's ``format`` (wav, mp3, flac, ogg, m4a as mp4, webm): ffmpeg never
probes the bytes, so no other demuxer (a playlist, a concatenation list) ever reads them. Any audio codec inside
that container is decoded. Undecodable data, a file with no audio stream or no samples, and a stream whose format
changes midway are ``invalid_media``.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterable, Iterator

import attrs
import av
import numpy as np

from spinf.errors import ApiError, bad_request
from spinf.media.payload import decode_base64, invalid_media
from spinf.media.tokens import MAX_INPUT_AUDIO_SAMPLES, SAMPLE_RATE, SAMPLES_PER_TOKEN, audio_segments, audio_tokens

AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg", "m4a", "webm")
_DEMUXERS = {"wav": "wav", "mp3": "mp3", "flac": "flac", "ogg": "ogg", "m4a": "mp4", "webm": "webm"}
_ESTIMATED_DURATION = frozenset({"mp3"})


@attrs.frozen(eq=False)
class AudioClip:
    """An audio part decoded: at most 600 s of 16 kHz mono float32 samples, and how much the part held."""

    samples: np.ndarray  # [num_samples] float32
    decoded_samples: int  # the part's whole decoded length, kept or not
    path: str

    @property
    def segments(self) -> tuple[int, ...]:
        """The token count of each of its segments (A.14.4)."""
        return audio_segments(len(self.samples))


def decode_audio_part(payload: dict, path: str, *, max_seconds: int) -> AudioClip:
    """An ``input_audio`` payload (``{data, format}``) decoded and checked against ``max_seconds``."""
    fmt = payload.get("format")
    if fmt not in AUDIO_FORMATS:
        raise invalid_media(path, f"the audio format must be one of {', '.join(AUDIO_FORMATS)}, not {fmt!r}")
    data = decode_base64(payload.get("data"), path, "audio data")
    return decode_audio_bytes(data, fmt, path, max_seconds=max_seconds)


def decode_audio_bytes(data: bytes, fmt: str, path: str, *, max_seconds: int) -> AudioClip:
    """The 16 kHz mono samples of a ``fmt`` file; refusals at ``path``."""
    limit = max_seconds * SAMPLE_RATE
    try:
        with av.open(io.BytesIO(data), mode="r", format=_DEMUXERS[fmt]) as container:
            if not container.streams.audio:
                raise invalid_media(path, f"the {fmt} data has no audio stream")
            if fmt not in _ESTIMATED_DURATION and container.duration is not None:
                declared = container.duration / av.time_base
                if declared > max_seconds:
                    raise _too_long(path, f"declares {declared:,.1f} s", max_seconds)
            kept, total = _bounded(_resampled(container), limit, path, max_seconds)
    except (av.FFmpegError, ValueError, OSError, EOFError) as error:
        raise invalid_media(path, f"the {fmt} audio data cannot be decoded: {_reason(error)}") from error
    if total == 0:
        raise invalid_media(path, f"the {fmt} audio data holds no samples")
    return AudioClip(samples=kept, decoded_samples=total, path=path)


def _reason(error: Exception) -> str:
    """What went wrong, in words: ffmpeg's message without PyAV's ``[Errno 1094995529] ...: '<none>'`` wrapping."""
    if isinstance(error, av.FFmpegError) and error.strerror:
        return error.strerror[:1].lower() + error.strerror[1:]
    return str(error)


# Packed sample formats read without the resampler when the stream is at 16 kHz already (a WAV recorded for speech),
# and the scale that takes each to [-1, 1] as the resampler's conversion to float does (exact powers of two).
_DIRECT = {"s16": 2.0**15, "s32": 2.0**31, "flt": 1.0, "dbl": 1.0}
_BATCH_FRAMES = 64  # decoded frames converted at once on that path


def _resampled(container: av.container.InputContainer) -> Iterator[np.ndarray]:
    """The first audio stream as 16 kHz mono float32 chunks, the resampler flushed at the end.

    PyAV's resampler changes the rate and the sample format and keeps the channels; mono is their mean, as
    librosa and transformers' feature extractors take it (ffmpeg's own downmix weighs stereo by 1/sqrt(2) each,
    which can leave [-1, 1]). The samples stay packed, one plane: PyAV 18 crashes reading the planes of a planar
    frame of 8 or more channels (seen with 18.1). A stream already at 16 kHz in a packed format of `_DIRECT` skips
    the resampler and is converted by numpy, `_BATCH_FRAMES` frames at a time, to the same floats: the resampler's
    Python-level work per frame made a 30 s clip cost 34 ms on the H200 machine.
    """
    stream = container.streams.audio[0]
    frames = container.decode(stream)
    first = next(frames, None)
    if first is None:
        return
    if first.sample_rate == SAMPLE_RATE and first.format.name in _DIRECT:
        yield from _direct(first, frames)
        return
    resampler = av.AudioResampler(format="flt", rate=SAMPLE_RATE)
    for frame in itertools.chain([first], frames):
        for out in resampler.resample(frame):
            yield _mono(out)
    for out in resampler.resample(None):
        yield _mono(out)


def _direct(first: av.AudioFrame, frames: Iterator[av.AudioFrame]) -> Iterator[np.ndarray]:
    shape = (first.format.name, first.layout.name, first.sample_rate)
    channels, scale = len(first.layout.channels), np.float32(_DIRECT[first.format.name])
    batch: list[np.ndarray] = []
    for frame in itertools.chain([first], frames):
        if (frame.format.name, frame.layout.name, frame.sample_rate) != shape:
            raise ValueError(f"the stream changes to {frame.format.name} at {frame.sample_rate} Hz midway")
        batch.append(frame.to_ndarray().reshape(-1))  # packed: interleaved samples
        if len(batch) == _BATCH_FRAMES:
            yield _mixed(batch, channels, scale)
            batch = []
    if batch:
        yield _mixed(batch, channels, scale)


def _mixed(batch: list[np.ndarray], channels: int, scale: np.float32) -> np.ndarray:
    packed = np.concatenate(batch).astype(np.float32).reshape(-1, channels) / scale  # [samples, channels]
    return packed.mean(axis=1, dtype=np.float32)


def _mono(frame: av.AudioFrame) -> np.ndarray:
    # The resampler checks later frames against the first, except when the first needed no work: then it passes
    # every frame through as it is, so a stream that changes rate or format midway is caught here.
    if frame.sample_rate != SAMPLE_RATE or frame.format.name != "flt":
        raise ValueError(f"the stream changes to {frame.format.name} at {frame.sample_rate} Hz midway")
    packed = frame.to_ndarray().reshape(frame.samples, len(frame.layout.channels))  # [samples, channels]
    return packed.mean(axis=1, dtype=np.float32)


def _bounded(chunks: Iterable[np.ndarray], limit: int, path: str, max_seconds: int) -> tuple[np.ndarray, int]:
    """The first 600 s of the chunks and their whole length; ``audio_too_long`` as soon as it passes ``limit``."""
    kept: list[np.ndarray] = []
    num_kept = total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise _too_long(path, f"decodes to more than {max_seconds:,} s", max_seconds)
        room = MAX_INPUT_AUDIO_SAMPLES - num_kept
        if room > 0:
            kept.append(chunk[:room])
            num_kept += min(room, len(chunk))
    samples = np.concatenate(kept) if kept else np.zeros(0, np.float32)
    return samples.astype(np.float32, copy=False), total


def _too_long(path: str, what: str, max_seconds: int) -> ApiError:
    return bad_request("audio_too_long", path, f"the audio {what}; the limit (max_audio_seconds) is {max_seconds:,} s")


def cap_input_audio(clips: Iterable[AudioClip]) -> tuple[AudioClip, ...]:
    """An input's clips, in order, cut to 600 s in all (A.14.4): the clip that crosses it is cut, later ones
    emptied (an empty clip has no tokens and no segments)."""
    capped = []
    room = MAX_INPUT_AUDIO_SAMPLES
    for clip in clips:
        kept = clip.samples[:room]
        room -= len(kept)
        capped.append(clip if len(kept) == len(clip.samples) else attrs.evolve(clip, samples=kept))
    return tuple(capped)


def audio_frames(samples: np.ndarray) -> np.ndarray:
    """The raw frames ``[tokens, 640]`` float32 of a clip, one per token, the last one zero-padded."""
    num_tokens = audio_tokens(len(samples))
    frames = np.zeros(num_tokens * SAMPLES_PER_TOKEN, np.float32)
    frames[: len(samples)] = samples
    return frames.reshape(num_tokens, SAMPLES_PER_TOKEN)
