"""Hostile media against a real server process (issue 33 item 7): real 7,070 x 7,070 PNGs of about 6 KB, each of
which takes 0.6 to 1.3 s to decode, are refused from their headers at once. The issue's figures: 200 such frames
in a 2 MB body got no answer in 120 s; ``content_too_long`` came only after every image was decoded."""

from __future__ import annotations

import io
import time

import httpx
import pytest
from PIL import Image

from contrib.loadtest.harness import ServerProcess, score_body
from tests.media.fixtures import data_url

QUERY = {"id": "q", "template": "\n\nIs it a cat? Answer:{?}", "options": [" yes", " no"]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process = ServerProcess(tmp_path_factory.mktemp("media-budgets"), "--no-official-packs")
    yield process
    assert process.stop() == 0


@pytest.fixture(scope="module")
def huge_png() -> str:
    out = io.BytesIO()
    Image.new("1", (7070, 7070)).save(out, "PNG", optimize=True)
    assert len(out.getvalue()) < 8_000
    return data_url(out.getvalue())


def post(server, inputs: list[list[dict]]) -> tuple[httpx.Response, float]:
    inputs = [{"id": str(i), "messages": [{"content": parts}]} for i, parts in enumerate(inputs)]
    body = {"inputs": inputs, "scoring": {"queries": [QUERY]}}
    began = time.perf_counter()
    response = httpx.post(f"{server.url}/v1/score", json=body, timeout=120)
    return response, time.perf_counter() - began


def test_200_huge_video_frames_are_refused_at_once(server, huge_png):
    frames = [{"t": j, "image_url": {"url": huge_png}} for j in range(200)]
    response, seconds = post(server, [[{"type": "video", "video": {"frames": frames}}]])
    error = response.json()["error"]
    assert (response.status_code, error["code"], error["param"]) == (400, "content_too_long", "inputs.0")
    assert seconds < 2.0  # decoding them took minutes


def test_huge_images_over_the_pixel_budget_are_refused_at_once(server, huge_png):
    image = {"type": "image_url", "image_url": {"url": huge_png}}
    response, seconds = post(server, [[image] for _ in range(9)])  # 9 x 49,984,900 pixels > 400,000,000
    error = response.json()["error"]
    assert (response.status_code, error["code"], error["param"]) == (413, "request_too_large", None)
    assert "(max_request_pixels)" in error["message"]
    assert seconds < 2.0
    assert httpx.post(f"{server.url}/v1/score", json=score_body(), timeout=60).status_code == 200
