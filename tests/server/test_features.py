"""The feature switches and the ``layers`` setting over a real socket: servers built from the layered settings as
``spinf-serve serve`` builds them (`Engine.from_settings`, `models_entry_for`), on the tiny checkpoint served by its
folder, so that the model reads every media kind (api spec §9.6).

This build has no media embedders yet: a media kind a switch lets through is then refused by the engine
(``unsupported_content``). Extraction and generation are served; what a switch turns off is refused by the request
checks first (``media_disabled``, ``extraction_disabled``, ``generation_disabled``, §4.12 steps 12 and 13), and
``/v1/models`` reports the switches in ``capabilities`` and ``features`` (§7).
"""

from __future__ import annotations

import contextlib

import httpx
import pytest
import trio

from spinf.catalog import resolve_model
from spinf.cli import _parser
from spinf.server.models_entry import models_entry_for
from spinf.server.supervisor import serve
from spinf.settings import load_settings
from spinf.settings.flags import flags_from_args
from tests.protocol.bodies import AUDIO, IMAGE
from tests.server.fakes import options

TEXT = "My parcel never arrived. I want my money back."
SCORED = {"id": "refund", "template": "\n\nRefund? Answer:{?}", "options": [" yes", " no"]}
EXTRACTED = {"id": "why", "template": '\n\nThe reason: "{*}"'}
GENERATED = {**EXTRACTED, "generate": True}


def body(*queries: dict, content: list | None = None) -> dict:
    parts = [{"type": "text", "text": TEXT}, *(content or [])]
    return {"messages": [{"content": parts}], "scoring": {"queries": list(queries) or [SCORED]}}


@pytest.fixture(scope="module")
def build(tiny_engine):
    """``build(*flags, **env)``: the settings and engine of ``spinf-serve serve <tiny folder> --device cpu *flags``."""
    from spinf import Engine

    def settings_and_engine(*flags: str, **env: str):
        argv = ["serve", str(tiny_engine.folder), "--device", "cpu", *flags]
        settings = load_settings(flags_from_args(_parser().parse_args(argv)), env)
        return settings, Engine.from_settings(settings)

    return settings_and_engine


@contextlib.asynccontextmanager
async def serving(settings, engine):
    """A running server for ``engine`` and ``settings`` on 127.0.0.1, called with the trusted token."""
    entry = models_entry_for(resolve_model(settings.engine.model), settings)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve(options(trusted_token="boss"), lambda: engine, entry, task_status=task_status)
        )
        async with httpx.AsyncClient(
            base_url=binds[0], headers={"Authorization": "Bearer boss"}, timeout=30
        ) as client:
            with trio.fail_after(30):
                while (await client.get("/readyz")).status_code != 200:
                    await trio.sleep(0.05)
            yield client
        nursery.cancel_scope.cancel()


async def refusal(client: httpx.AsyncClient, request: dict) -> tuple[int, str, str, str]:
    answer = await client.post("/v1/score", json=request)
    error = answer.json()["error"]
    return answer.status_code, error["code"], error["param"], error["message"]


@pytest.fixture(autouse=True)
def drain_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SPINF_DRAIN_FILE", str(tmp_path / "drain"))


async def test_media_is_gated_by_the_media_setting(build):
    """A kind left on reaches the media decoders (these parts' data is no image or audio file: invalid_media); a kind
    switched off is media_disabled, and its embedder is not loaded."""
    part = "inputs.0.messages.0.content.1"
    settings, engine = build()
    async with serving(settings, engine) as client:
        assert (await refusal(client, body(content=[IMAGE])))[:3] == (400, "invalid_media", part)
        assert (await client.get("/v1/models")).json()["models"][0]["media"] == ["image", "audio", "video"]
    settings, engine = build("--media", "audio")
    assert engine.embedders.vision is None and engine.embedders.audio is not None
    async with serving(settings, engine) as client:
        assert (await refusal(client, body(content=[IMAGE])))[:3] == (400, "media_disabled", "inputs.0.messages")
        assert (await refusal(client, body(content=[AUDIO])))[:3] == (400, "invalid_media", part)
        assert (await client.get("/v1/models")).json()["models"][0]["media"] == ["audio"]
    settings, engine = build("--no-media")
    assert engine.embedders is None  # --no-media loads no embedder
    async with serving(settings, engine) as client:
        assert (await refusal(client, body(content=[AUDIO])))[:3] == (400, "media_disabled", "inputs.0.messages")
        assert (await client.post("/v1/score", json=body())).status_code == 200
        assert (await client.get("/v1/models")).json()["models"][0]["media"] == []


async def models_entry(client: httpx.AsyncClient) -> tuple[list[str], dict]:
    entry = (await client.get("/v1/models")).json()["models"][0]
    return entry["capabilities"], entry["features"]


async def test_extraction_and_generation_are_gated_by_their_settings(build):
    disabled = (400, "extraction_disabled", "scoring.queries.0.template")
    bad_template = {**SCORED, "id": "bad", "template": "\n\nRefund? {?"}
    async with serving(*build()) as client:  # both on: both slots are answered
        for query, generated in ((EXTRACTED, False), (GENERATED, True)):
            answer = await client.post("/v1/score", json=body(query))
            assert answer.status_code == 200, answer.text
            result = answer.json()["results"][0]["queries"][0]
            assert (result["kind"], result.get("generate", False)) == ("text", generated)
        assert await models_entry(client) == (
            ["score", "extract", "generate"],
            {"media": ["image", "audio", "video"], "extraction": True, "generation": True},
        )
    async with serving(*build("--no-extraction")) as client:
        assert await refusal(client, body(EXTRACTED, bad_template)) == (
            *disabled,
            "extraction slots are switched off",
        )
        assert (await client.post("/v1/score", json=body())).status_code == 200
        media = ["image", "audio", "video"]
        assert await models_entry(client) == (["score"], {"media": media, "extraction": False, "generation": False})
    async with serving(*build("--no-generation")) as client:
        assert (await refusal(client, body(GENERATED)))[:3] == (
            400,
            "generation_disabled",
            "scoring.queries.0.generate",
        )
        assert (await client.post("/v1/score", json=body(EXTRACTED))).status_code == 200
        assert await models_entry(client) == (
            ["score", "extract"],
            {"media": ["image", "audio", "video"], "extraction": True, "generation": False},
        )


async def test_a_server_with_layers_1_serves_a_one_layer_model(build, tiny_engine):
    scores = {}
    for layers in ("0", "1"):
        settings, engine = build(SPINF_LAYERS=layers)
        async with serving(settings, engine) as client:
            info = (await client.get("/v0/info")).json()["engine"]
            answer = (await client.post("/v1/score", json=body())).json()
        scores[layers] = (info["layers"], answer["system_fingerprint"], answer["results"])
    assert (scores["0"][0], scores["1"][0]) == (len(tiny_engine.model.layers), 1)
    assert scores["1"][1] != scores["0"][1] and scores["1"][2] != scores["0"][2]
