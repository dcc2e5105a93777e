"""Media through a real server process over a real socket, the way users send it (api spec §4.3, §5.7, §7).

``spinf-serve serve spinf/tiny-gemma4 --device cpu`` runs as a child process. spinf-client 0.3.1, unchanged, builds
the parts: ``spinf_client.media.image`` (a JPEG data URL at the engine's size for its detail), ``media.video``
(sampled frames with their times) and ``media.video_frames`` (frames sampled from a real video file with ffmpeg,
where ffmpeg is installed); audio goes as the ``input_audio`` part the API defines (the client has no helper for
it). Every answer is compared with the same body scored in-process (`Engine.score`), bit for bit, and the media
counts of ``usage`` are checked. Then what a user gets wrong: hostile files (a decompression bomb, a truncated PNG,
a WAV header claiming ten hours, a URL that is not a data URL), each a 400 with the spec's code and param, and the
server still answering after them; the chat route; and a second server started with ``--no-media``.
"""

from __future__ import annotations

import base64
import io
import shutil
import struct
import zlib

import av
import httpx
import numpy as np
import pytest
from PIL import Image
from spinf_client import SpinfClient, SpinfError, query, text
from spinf_client import media as client_media

from contrib.loadtest.harness import ServerProcess, tiny_cache
from tests.media.fixtures import b64, noise_image, wav_header

MODEL = "spinf/tiny-gemma4"
QUERIES = [
    query("money", "\n\nIs this about money?{?}", [" yes", " no"]),
    query("cat", "\n\nA cat?{?}", [" yes", " no"]),
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tiny_cache(tmp_path_factory.mktemp("hf-home"))


@pytest.fixture(scope="module")
def server(tmp_path_factory, cache):
    process = ServerProcess(tmp_path_factory.mktemp("media"), "--max-audio-seconds", "5", hf_home=cache)
    yield process
    assert process.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return SpinfClient(base_url=server.url, model=MODEL)


@pytest.fixture(scope="module")
def engine(cache):
    from spinf import Engine

    return Engine(MODEL, device="cpu", cache_dir=cache / "hub")


def same_as_in_process(engine, response: dict, content: list) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "scoring": {"queries": QUERIES}}
    assert response["results"] == engine.score(body)["results"]


def audio_part(seconds: float, seed: int = 0) -> dict:
    pcm = (np.random.default_rng(seed).standard_normal(int(seconds * 16_000)) * 5000).astype("<i2").tobytes()
    return {"type": "input_audio", "input_audio": {"data": b64(wav_header(16_000, 1, len(pcm), pcm)), "format": "wav"}}


def test_an_image_from_spinf_client(client, engine):
    photo = Image.fromarray(noise_image(300, 400, seed=1))
    content = [text("A photo of the receipt:"), client_media.image(photo, detail="low")]
    response = client.score(content=content, queries=QUERIES)
    same_as_in_process(engine, response, content)
    usage = response["usage"]["content"]
    assert usage["images"] == 1
    assert usage["image_tokens"] == client_media.image_tokens(400, 300, "low")  # the client's own count agrees
    assert usage["text_tokens"] == usage["tokens"] - usage["image_tokens"]


def test_video_frames_from_spinf_client(client, engine):
    frames = []
    for j, t in enumerate((0.5, 1.5, 2.5)):
        buffer = io.BytesIO()
        Image.fromarray(noise_image(180, 320, seed=10 + j)).save(buffer, "JPEG")
        frames.append((t, buffer.getvalue()))
    content = [text("A clip:"), client_media.video(frames, detail="low")]
    response = client.score(content=content, queries=QUERIES)
    same_as_in_process(engine, response, content)
    usage = response["usage"]["content"]
    assert usage["video_frames"] == 3
    assert usage["video_tokens"] == 3 * client_media.image_tokens(320, 180, "low")


@pytest.mark.skipif(shutil.which("ffmpeg") is None or shutil.which("ffprobe") is None, reason="needs ffmpeg")
def test_frames_sampled_from_a_video_file_by_spinf_client(client, engine, tmp_path):
    path = tmp_path / "clip.mp4"
    with av.open(str(path), mode="w") as container:  # a 2-second 10 fps clip, written with PyAV
        stream = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 160, 96, "yuv420p"
        for j in range(20):
            frame = av.VideoFrame.from_ndarray(noise_image(96, 160, seed=j), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    content = [client_media.video(str(path), detail="low", num_frames=4)]
    response = client.score(content=content, queries=QUERIES)
    same_as_in_process(engine, response, content)
    assert response["usage"]["content"]["video_frames"] == 4


def test_audio_in_place_among_text(client, engine):
    content = [text("The caller said:"), audio_part(1.25), text("and then hung up.")]
    response = client.score(content=content, queries=QUERIES)
    same_as_in_process(engine, response, content)
    usage = response["usage"]["content"]
    assert (usage["audio_seconds"], usage["audio_tokens"]) == (1.25, 32 + 2)


def test_the_chat_route_reads_media_too(server, engine):
    content = [{"type": "text", "text": "Look:"}, client_media.image(Image.fromarray(noise_image(64, 64)), "low")]
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "scoring": {"queries": QUERIES}}
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["results"] == engine.score(body)["results"]


def _bomb_png(width: int, height: int) -> bytes:
    """A valid PNG header declaring ``width`` x ``height`` over a few bytes of compressed zeros."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 1024))
        + chunk(b"IEND", b"")
    )


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def _image(data: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


HOSTILE = [
    ("bomb", _image(_bomb_png(100_000, 100_000)), "image_too_large"),
    ("truncated", _image(_png(noise_image(200, 200))[:300]), "invalid_media"),
    ("not a data URL", {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}}, "invalid_media"),
    (
        "bad detail",
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA==", "detail": "max"}},
        "invalid_media",
    ),  # fmt: skip
    (
        "unknown audio format",
        {"type": "input_audio", "input_audio": {"data": "AA==", "format": "aiff"}},
        "invalid_media",
    ),
    ("longer than max_audio_seconds", audio_part(6.0), "audio_too_long"),  # the server runs with 5 s
]


@pytest.mark.parametrize(("name", "part", "code"), HOSTILE, ids=[case[0] for case in HOSTILE])
def test_a_hostile_or_broken_file_is_a_clear_400_and_the_server_goes_on(client, name, part, code):
    with pytest.raises(SpinfError) as refused:
        client.score(content=[text("x"), part], queries=QUERIES)
    assert (refused.value.status, refused.value.code) == (400, code), refused.value
    assert refused.value.param == "inputs.0.messages.0.content.1"
    assert client.score(content=[text("still here")], queries=QUERIES)["results"]


def test_an_image_one_pixel_wide_and_a_million_tall_is_read_by_the_spec_s_rule_for_extreme_shapes(client):
    # 3 MB of pixels (under max_image_pixels): one row of 48-px blocks, as long as floor(soft / 9) blocks (§4.3)
    tall = _png(np.zeros((1_000_000, 1, 3), np.uint8))
    usage = client.score(content=[_image(tall)], queries=QUERIES)["usage"]["content"]
    assert (usage["images"], usage["image_tokens"]) == (1, 280 // 9 + 2)


def test_a_wav_header_claiming_ten_hours_reads_as_the_second_it_holds(client):
    data = np.zeros(16_000, "<i2").tobytes()
    part = {"type": "input_audio", "input_audio": {"data": b64(wav_header(16_000, 1, 10 * 3600 * 32_000, data)),
                                                   "format": "wav"}}  # fmt: skip
    usage = client.score(content=[part], queries=QUERIES)["usage"]["content"]
    assert (usage["audio_seconds"], usage["audio_tokens"]) == (1.0, 25 + 2)


def test_models_lists_the_media_the_server_reads(server):
    entry = httpx.get(f"{server.url}/v1/models", timeout=30).json()["models"][0]
    assert entry["media"] == entry["features"]["media"] == ["image", "audio", "video"]
    assert entry["image"] == {"detail_tokens": {"low": 70, "auto": 280, "high": 1120}}


def test_a_server_started_with_no_media_refuses_every_media_part(tmp_path, cache):
    process = ServerProcess(tmp_path, "--no-media", hf_home=cache)
    try:
        entry = httpx.get(f"{process.url}/v1/models", timeout=30).json()["models"][0]
        client = SpinfClient(base_url=process.url, model=MODEL)
        image = client_media.image(Image.fromarray(noise_image(64, 64)), "low")
        with pytest.raises(SpinfError) as refused:
            client.score(content=[text("x"), image], queries=QUERIES)
    finally:
        assert process.stop() == 0
    assert entry["media"] == entry["features"]["media"] == []
    assert (refused.value.code, refused.value.param) == ("media_disabled", "inputs.0.messages")


def test_metrics_count_the_questions_and_the_media_read(server, client):
    def metric(text: str, name: str) -> float:
        lines = [line for line in text.splitlines() if line.startswith(name + " ") or line.startswith(name + "{")]
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)

    before = httpx.get(f"{server.url}/metrics", timeout=10).text
    photo = client_media.image(Image.fromarray(noise_image(96, 96)), "low")
    client.score(content=[text("A photo and a sound:"), photo, audio_part(0.5)], queries=QUERIES)
    after = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert metric(after, "spinf_questions_total") - metric(before, "spinf_questions_total") == len(QUERIES)
    image = 'spinf_media_items_total{kind="image"}'
    assert metric(after, image) - metric(before, image) == 1
    assert metric(after, "spinf_audio_seconds_total") - metric(before, "spinf_audio_seconds_total") == 0.5
