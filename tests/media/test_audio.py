"""Audio parts (spinf.media.audio): every format to 16 kHz mono float32, the duration limits, hostile files.

Each file is written here with PyAV (or by hand for the hostile ones); each refusal must come within a fraction
of a second with the 400 code of api spec §4.3 and the part's param path.
"""

from __future__ import annotations

import io
import re
import struct
import time

import av
import numpy as np
import pytest

from spinf.errors import ApiError
from spinf.media import audio as audio_module
from spinf.media.audio import AudioClip, audio_frames, cap_input_audio, decode_audio_bytes, decode_audio_part
from spinf.media.tokens import MAX_INPUT_AUDIO_SAMPLES
from tests.media.fixtures import AUDIO_WRITERS, audio_bytes, b64, tone, wav_header

PATH = "inputs.1.messages.2.content.0"
FORMATS = list(AUDIO_WRITERS)
LOSSLESS = ("wav", "flac")


def decoded(data: bytes, fmt: str, max_seconds: int = 600) -> AudioClip:
    return decode_audio_part({"data": b64(data), "format": fmt}, PATH, max_seconds=max_seconds)


def refused(payload: dict, code: str, match: str, *, max_seconds: int = 600) -> None:
    started = time.monotonic()
    with pytest.raises(ApiError) as caught:
        decode_audio_part(payload, PATH, max_seconds=max_seconds)
    assert time.monotonic() - started < 2
    error = caught.value
    assert (error.status, error.code, error.param) == (400, code, PATH)
    assert re.match(match, error.message), error.message


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))


# Decoding


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("rate", "channels"), [(16_000, 1), (44_100, 2), (48_000, 1), (8_000, 2)])
def test_every_format_decodes_to_16_khz_mono_float32(fmt, rate, channels):
    clip = decoded(audio_bytes(tone(1.5, rate, channels), fmt, rate), fmt)
    assert clip.samples.dtype == np.float32 and clip.samples.ndim == 1
    assert clip.decoded_samples == len(clip.samples)
    # Lossy codecs pad or prime a few ms; the lossless ones keep the length exactly.
    if fmt in LOSSLESS:
        assert len(clip.samples) == 24_000
    else:
        assert abs(len(clip.samples) - 24_000) <= 1_200
    # The tone survives: its level (the channels' mean) and its pitch, whatever delay a lossy coder adds.
    expected = tone(1.5, 16_000, channels).mean(axis=0)
    middle = clip.samples[4_000:20_000]
    assert abs(rms(middle) - rms(expected[4_000:20_000])) < 0.02
    spectrum = np.abs(np.fft.rfft(middle))
    assert abs(np.argmax(spectrum) * 16_000 / len(middle) - 440) < 2


def test_16_khz_mono_wav_is_read_sample_exact():
    samples = tone(0.5)
    clip = decoded(audio_bytes(samples, "wav"), "wav")
    # Stored as 16-bit PCM: equal to the input within one quantization step.
    np.testing.assert_allclose(clip.samples, samples[0], atol=1 / 32768)


def test_a_16_khz_float_wav_passes_through_exactly():
    # Already flt at 16 kHz: PyAV's resampler hands the frames through untouched.
    pcm = np.linspace(-0.5, 0.5, 16_000, dtype="<f4")
    fmt = struct.pack("<HHIIHH", 3, 1, 16_000, 64_000, 4, 32)  # format 3: IEEE float
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", pcm.nbytes) + pcm.tobytes()
    clip = decoded(b"RIFF" + struct.pack("<I", len(body)) + body, "wav")
    np.testing.assert_array_equal(clip.samples, pcm)


def test_a_frame_that_changes_rate_midway_is_refused():
    # Passed-through frames are not checked by the resampler; the mono step checks each one.
    frame = av.AudioFrame.from_ndarray(np.zeros((1, 441), np.float32), "flt", "mono")
    frame.sample_rate = 44_100
    with pytest.raises(ValueError, match=r"^the stream changes to flt at 44100 Hz midway$"):
        audio_module._mono(frame)


def test_mono_is_the_mean_of_the_channels():
    left, right = np.full(1_600, 0.2, np.float32), np.full(1_600, 0.6, np.float32)
    clip = decoded(audio_bytes(np.stack([left, right]), "wav"), "wav")
    np.testing.assert_allclose(clip.samples, 0.4, atol=1e-4)


@pytest.mark.parametrize("channels", [3, 8, 9, 64])
def test_many_channels_decode_without_crashing(channels):
    # PyAV 18 crashes (a segfault) reading planar frames of 8 or more channels: decoding keeps them packed.
    pcm = np.tile(np.arange(channels, dtype="<i2") * 100, 1_600)
    clip = decoded(wav_header(16_000, channels, len(pcm) * 2, pcm.tobytes()), "wav")
    assert len(clip.samples) == 1_600
    np.testing.assert_allclose(clip.samples, (channels - 1) / 2 * 100 / 32768, atol=1e-6)


@pytest.mark.parametrize("rate", [8, 1_000, 96_000])
def test_unusual_rates_resample(rate):
    clip = decoded(wav_header(rate, 1, 20 * rate, bytes(20 * rate)), "wav")  # ten seconds of silence
    assert len(clip.samples) == 160_000 and not clip.samples.any()


def test_clip_segments_follow_its_samples():
    clip = decoded(audio_bytes(tone(31.0), "flac"), "flac")
    assert clip.segments == (750, 25)


# The duration limits


def test_a_header_declaring_more_than_the_limit_is_refused_before_decoding():
    ten_hours = 2 * 16_000 * 36_000
    flac = audio_bytes(tone(1.0), "flac")
    # Rewrite STREAMINFO's 36-bit total sample count to ten hours; the frames still hold one second.
    at = flac.index(b"fLaC") + 8 + 10
    fields = int.from_bytes(flac[at : at + 8], "big") & ~((1 << 36) - 1) | 16_000 * 36_000
    lying = flac[:at] + fields.to_bytes(8, "big") + flac[at + 8 :]
    message = r"^the audio declares 36,000.0 s; the limit \(max_audio_seconds\) is 600 s$"
    refused({"data": b64(lying), "format": "flac"}, "audio_too_long", message)
    # A WAV header's size is checked against the file by ffmpeg: ten hours declared, one second there, read as such.
    started = time.monotonic()
    assert len(decoded(wav_header(16_000, 1, ten_hours, bytes(32_000)), "wav").samples) == 16_000
    assert time.monotonic() - started < 1


def test_an_honest_long_file_is_refused_from_its_header():
    seconds = 700
    data = wav_header(16_000, 1, 2 * 16_000 * seconds, bytes(2 * 16_000 * seconds))
    refused({"data": b64(data), "format": "wav"}, "audio_too_long", r"^the audio declares 700.0 s; .* is 600 s$")


def test_the_decoded_length_decides_where_no_header_does():
    # mp3 durations may be estimated from the bitrate, so mp3 is held to the decoded count only.
    data = audio_bytes(tone(3.0), "mp3")
    assert len(decoded(data, "mp3", max_seconds=3).samples) == 48_000
    message = r"^the audio decodes to more than 2 s; the limit \(max_audio_seconds\) is 2 s$"
    refused({"data": b64(data), "format": "mp3"}, "audio_too_long", message, max_seconds=2)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_is_refused_over_the_limit(fmt):
    data = audio_bytes(tone(2.5), fmt)
    refused({"data": b64(data), "format": fmt}, "audio_too_long", r"^the audio (declares|decodes to)", max_seconds=2)


def test_decoding_stops_as_soon_as_the_limit_is_passed():
    pulled = []

    def endless():
        while True:
            pulled.append(1)
            yield np.zeros(16_000, np.float32)

    with pytest.raises(ApiError) as caught:
        audio_module._bounded(endless(), 10 * 16_000, PATH, 10)
    assert caught.value.code == "audio_too_long" and len(pulled) == 11


def test_a_part_keeps_at_most_600_seconds_whatever_the_limit():
    # A raised max_audio_seconds accepts 650 s; the engine reads 600 s per input, so no more is kept.
    data = wav_header(16_000, 1, 2 * 16_000 * 650, bytes(2 * 16_000 * 650))
    clip = decoded(data, "wav", max_seconds=1_000)
    assert len(clip.samples) == MAX_INPUT_AUDIO_SAMPLES and clip.decoded_samples == 650 * 16_000


def test_an_input_keeps_600_seconds_of_audio_in_all():
    def clip(seconds: int) -> AudioClip:
        return AudioClip(samples=np.ones(seconds * 16_000, np.float32), decoded_samples=seconds * 16_000, path=PATH)

    first, second, third = clip(400), clip(300), clip(10)
    capped = cap_input_audio([first, second, third])
    assert [len(c.samples) for c in capped] == [400 * 16_000, 200 * 16_000, 0]
    assert capped[0] is first and capped[2].segments == ()
    assert sum(sum(c.segments) for c in capped) == 15_000  # 600 s at 40 ms


# Refusals: the payload and broken files


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({"data": "AAAA"}, r"^the audio format must be one of wav, mp3, flac, ogg, m4a, webm, not None$"),
        ({"data": "AAAA", "format": "aiff"}, r"^the audio format must be one of .*, not 'aiff'$"),
        ({"format": "wav"}, r"^the audio data must be a base64 string$"),
        ({"data": 5, "format": "wav"}, r"^the audio data must be a base64 string$"),
        ({"data": "not base64!", "format": "wav"}, r"^the audio data is not valid base64: .*$"),
        ({"data": "", "format": "wav"}, r"^the audio data is empty$"),
    ],
)
def test_bad_payloads_are_invalid_media(payload, match):
    refused(payload, "invalid_media", match)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "garbage",
    [b"\0" * 4_000, np.random.default_rng(3).bytes(4_000), b"RIFF", b"ID3\x03\0\0\0\0\0\0", b"fLaC\0\0\0\x22"],
)
def test_garbage_is_invalid_media(fmt, garbage):
    # ffmpeg's words, without PyAV's "[Errno 1094995529] ...: '<none>'" wrapping
    match = rf"^the {fmt} audio data (cannot be|holds no)[^\[]*$"
    refused({"data": b64(garbage), "format": fmt}, "invalid_media", match)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_file_cut_inside_its_header_is_invalid_media(fmt):
    data = audio_bytes(tone(1.0), fmt)[:40]
    refused({"data": b64(data), "format": fmt}, "invalid_media", rf"^the {fmt} audio data (cannot be|holds no)")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_file_cut_midway_keeps_what_decodes_or_is_invalid_media(fmt):
    data = audio_bytes(tone(2.0), fmt)
    try:
        clip = decoded(data[: len(data) // 2], fmt)
    except ApiError as error:
        assert (error.code, error.param) == ("invalid_media", PATH)
    else:
        assert 0 < len(clip.samples) < 32_000 + 1_200


@pytest.mark.parametrize(("written", "declared"), [("wav", "mp3"), ("mp3", "flac"), ("flac", "ogg"), ("ogg", "m4a")])
def test_the_declared_format_picks_the_demuxer(written, declared):
    # ffmpeg never probes: data in another container than the declared one does not decode.
    data = audio_bytes(tone(1.0), written)
    refused({"data": b64(data), "format": declared}, "invalid_media", rf"^the {declared} audio data")


def test_a_webm_without_audio_is_invalid_media():
    out = io.BytesIO()
    with av.open(out, mode="w", format="webm") as container:
        stream = container.add_stream("libvpx", rate=1)
        stream.width = stream.height = 16
        stream.pix_fmt = "yuv420p"
        frame = av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), np.uint8), format="rgb24")
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    refused({"data": b64(out.getvalue()), "format": "webm"}, "invalid_media", r"^the webm data has no audio stream$")


def test_a_wav_of_zero_rate_is_invalid_media():
    refused({"data": b64(wav_header(0, 1, 2_000, bytes(2_000))), "format": "wav"}, "invalid_media", r"^the wav audio")


# Frames


@pytest.mark.parametrize(("samples", "tokens"), [(0, 0), (1, 1), (640, 1), (641, 2), (16_000, 25)])
def test_frames_are_640_samples_the_last_zero_padded(samples, tokens):
    values = np.arange(1, samples + 1, dtype=np.float32)
    frames = audio_frames(values)
    assert frames.shape == (tokens, 640) and frames.dtype == np.float32
    np.testing.assert_array_equal(frames.reshape(-1)[:samples], values)
    assert not frames.reshape(-1)[samples:].any()


def test_the_decode_helper_takes_bytes():
    clip = decode_audio_bytes(audio_bytes(tone(0.1), "wav"), "wav", PATH, max_seconds=1)
    assert len(clip.samples) == 1_600 and clip.path == PATH


@pytest.mark.parametrize(("channels", "fmt"), [(1, "wav"), (2, "wav"), (2, "flac")])
def test_a_16_khz_stream_read_without_the_resampler_gives_the_resamplers_floats(channels, fmt, monkeypatch):
    from spinf.media import audio as module

    samples = np.stack([tone(1.3, freq=200 + 100 * c) for c in range(channels)]).astype(np.float32)
    data = audio_bytes(samples, fmt)
    direct = module.decode_audio_bytes(data, fmt, "p", max_seconds=600).samples
    monkeypatch.setattr(module, "_DIRECT", {})  # every stream through PyAV's resampler
    assert np.array_equal(direct, module.decode_audio_bytes(data, fmt, "p", max_seconds=600).samples)
