"""The Qwen3.5 stack through a real server process over a real socket (issue 17): checkpoint folders in the
published layout served by path (api spec §9.6 case 2), the tiny twin, the tiny decider and a GPTQ int4 folder,
driven by spinf-client 0.3.1 unchanged and by curl's kind of raw HTTP.

Every answer, scores and extraction alike, is compared bit for bit with the same body run in-process
(`Engine.score`), which the engine tests compare with transformers (tests/engine/qwen35/test_qwen35_engine.py and
test_qwen35_extraction.py). Then what the stack refuses, each a 400 with the spec's code: an image (Qwen images are
not read yet: ``media_not_supported``), and on the decider an option that is not one of its answer codes and an
extraction slot.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from spinf_client import SpinfClient, SpinfError, query, text

from contrib.loadtest.harness import ServerProcess
from spinf.engine.qwen35.int4_write import write_gptq_checkpoint
from spinf.engine.qwen35.tiny import write_tiny_decider, write_tiny_qwen35

QUERIES = [
    query("refund", "\n\nDoes the customer ask for a refund? Answer:{?}", [" yes", " no"]),
    query("angry", "\n\nIs the customer angry? Answer:{?}", [" yes", " no"]),
]
TRUSTED = "boss"  # the first server also answers /v0/info, for trusted callers; every route then wants a token
AUTH = {"Authorization": f"Bearer {TRUSTED}"}
CONTENT = "I was charged twice for one order. Please refund one payment."
PIXEL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5E"
    "rkJggg=="
)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen")
    return write_tiny_qwen35(root / "tiny-qwen35"), write_tiny_decider(root / "tiny-decider")


@pytest.fixture(scope="module")
def int4_folder(tmp_path_factory, folders):
    return write_gptq_checkpoint(folders[0], tmp_path_factory.mktemp("qwen") / "tiny-int4", outlier_channels=4)


@pytest.fixture(scope="module")
def server(tmp_path_factory, folders):
    process = ServerProcess(tmp_path_factory.mktemp("qwen-server"), "--trusted-token", TRUSTED, model=str(folders[0]))
    yield process
    assert process.stop() == 0


@pytest.fixture(scope="module")
def decider_server(tmp_path_factory, folders):
    process = ServerProcess(tmp_path_factory.mktemp("decider-server"), model=str(folders[1]))
    yield process
    assert process.stop() == 0


def in_process(folder, body: dict) -> dict:
    from spinf import Engine

    return Engine(str(folder), device="cpu").score(body)


def test_spinf_client_scores_on_the_qwen_stack_as_the_engine_does(server, folders):
    client = SpinfClient(TRUSTED, base_url=server.url, model=str(folders[0]))
    response = client.score(content=[text(CONTENT)], queries=QUERIES)
    body = {"model": str(folders[0]), "messages": [{"role": "user", "content": [text(CONTENT)]}]}
    body["scoring"] = {"queries": QUERIES}
    assert response["results"] == in_process(folders[0], body)["results"]
    options = response["results"][0]["queries"][0]["combinations"][0]["options"]
    assert abs(sum(o["p"] for o in options) - 1) < 1e-5


def test_models_and_info_say_what_is_served(server, folders):
    entry = httpx.get(f"{server.url}/v1/models", headers=AUTH, timeout=30).json()["models"][0]
    assert entry["media"] == [] and entry["capabilities"] == ["score", "extract", "generate"]
    assert entry["features"] == {"media": [], "extraction": True, "generation": True}
    info = httpx.get(f"{server.url}/v0/info", headers=AUTH, timeout=30).json()["engine"]
    assert (info["quant"], info["lm_head"], info["layers"]) == ("fp32", "lm_head fp32", 6)


def test_raw_http_with_an_image_is_a_400_and_the_server_goes_on(server):
    content = [{"type": "text", "text": "A photo:"}, {"type": "image_url", "image_url": {"url": PIXEL}}]
    body = {"messages": [{"role": "user", "content": content}], "scoring": {"queries": QUERIES}}
    refused = httpx.post(f"{server.url}/v1/score", json=body, headers=AUTH, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "media_not_supported"
    body["messages"][0]["content"] = CONTENT
    assert httpx.post(f"{server.url}/v1/score", json=body, headers=AUTH, timeout=60).status_code == 200


def test_extraction_and_generation_from_spinf_client_as_the_engine_does(server, folders):
    client = SpinfClient(TRUSTED, base_url=server.url, model=str(folders[0]))
    queries = [
        query("order", "\n\nThe order number is{n}"),
        query("name", '\n\nName: "{*}"'),
        query("summary", "\n\nSummary:{*}", generate={"seed": 7, "temperature": 0.8}, max_tokens=8),
    ]
    response = client.score(content=[text(CONTENT)], queries=queries)
    body = {"model": str(folders[0]), "messages": [{"role": "user", "content": [text(CONTENT)]}]}
    body["scoring"] = {"queries": queries}
    assert response["results"] == in_process(folders[0], body)["results"]
    kinds = [q["kind"] for q in response["results"][0]["queries"]]
    assert kinds == ["number", "text", "text"] and response["usage"]["completion_tokens"] > 0


def test_the_decider_scores_its_codes_and_refuses_other_options(decider_server, folders):
    client = SpinfClient(base_url=decider_server.url, model=str(folders[1]))
    response = client.score(content=[text(CONTENT)], queries=QUERIES)
    body = {"model": str(folders[1]), "messages": [{"role": "user", "content": [text(CONTENT)]}]}
    body["scoring"] = {"queries": QUERIES}
    assert response["results"] == in_process(folders[1], body)["results"]
    with pytest.raises(SpinfError) as refused:
        client.score(content=[text(CONTENT)], queries=[query("q", "\n\nRefund?{?}", [" yes", " not really"])])
    assert (refused.value.status, refused.value.code, refused.value.param) == (
        400,
        "invalid_field",
        "scoring.queries.0.options.1",
    )
    with pytest.raises(SpinfError) as refused:
        client.score(content=[text(CONTENT)], queries=[query("order", "\n\nThe order number is{n}")])
    assert refused.value.code == "extraction_disabled" and "decision model" in str(refused.value)


def test_an_int4_gptq_folder_is_served_in_its_i8_mode(tmp_path, int4_folder):
    """A GPTQ v1 checkpoint (int4, groups of 32, with its outlier table) served by path runs the automatic int4-i8
    mode, says so, and answers as the engine does in-process."""
    process = ServerProcess(tmp_path, model=str(int4_folder))
    try:
        client = SpinfClient(base_url=process.url, model=str(int4_folder))
        response = client.score(content=[text(CONTENT)], queries=QUERIES)
    finally:
        assert process.stop() == 0
    body = {"model": str(int4_folder), "messages": [{"role": "user", "content": [text(CONTENT)]}]}
    body["scoring"] = {"queries": QUERIES}
    expected = in_process(int4_folder, body)
    assert response["results"] == expected["results"]
    assert response["system_fingerprint"] == expected["system_fingerprint"]
    assert "int4-i8" in process.output()  # the start-up line names the scheme


def test_an_image_from_spinf_client_on_a_checkpoint_with_a_tower(tmp_path, folders):
    """spinf-client's ``media.image`` against a Qwen3.5 folder with a vision tower: the server reads it (the Qwen-VL
    resize, the tower, 3-D positions; tests/engine/qwen35/test_qwen35_images.py checks those against transformers)
    and answers as the engine does in-process; /v1/models lists image and video."""
    import shutil

    from PIL import Image
    from spinf_client import media as client_media

    from spinf.engine.qwen35.tiny import write_tiny_vision

    folder = tmp_path / "tiny-qwen35-vision"
    shutil.copytree(folders[0], folder)
    write_tiny_vision(folder)
    process = ServerProcess(tmp_path / "server", model=str(folder))
    try:
        photo = Image.fromarray(np.random.default_rng(3).integers(0, 255, (200, 300, 3), dtype=np.uint8))
        content = [text("A photo of the receipt:"), client_media.image(photo, detail="low")]
        response = SpinfClient(base_url=process.url, model=str(folder)).score(content=content, queries=QUERIES)
        entry = httpx.get(f"{process.url}/v1/models", timeout=30).json()["models"][0]
    finally:
        assert process.stop() == 0
    body = {"model": str(folder), "messages": [{"role": "user", "content": content}], "scoring": {"queries": QUERIES}}
    assert response["results"] == in_process(folder, body)["results"]
    assert response["usage"]["content"]["images"] == 1 and entry["media"] == ["image", "video"]
