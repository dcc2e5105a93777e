"""The HTTP surface over a real socket: the tiny model behind Hypercorn in this process, a real HTTP client.

Real clock and real executor thread (the mock clock would fire timeouts while the thread computes).
"""

from __future__ import annotations

import importlib.metadata
import json

import httpx
import pytest
import trio

from spinf.server.supervisor import running_actors, serve
from tests.server.fakes import models_entry, options

SCORE_BODY = {
    "messages": [{"role": "user", "content": [{"type": "text", "text": "My parcel never arrived. I want a refund."}]}],
    "scoring": {"queries": [{"id": "refund", "template": "\n\nRefund? Answer:{?}", "options": [" yes", " no"]}]},
}


@pytest.fixture
async def server(tiny_engine, tmp_path, monkeypatch):
    """A running server on 127.0.0.1 (random port) with token ``tok`` and trusted token ``boss``."""
    monkeypatch.setenv("SPINF_DRAIN_FILE", str(tmp_path / "drain"))
    opts = options(token="tok", trusted_token="boss", max_body_bytes=4096, queue=2)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve(opts, lambda: tiny_engine, models_entry, task_status=task_status)
        )
        url = binds[0]
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer tok"}, timeout=30) as client:
            with trio.fail_after(30):
                while (await client.get("/readyz")).status_code != 200:
                    await trio.sleep(0.05)
            yield client
        nursery.cancel_scope.cancel()


def envelope(response: httpx.Response) -> tuple[int, str, object]:
    body = response.json()
    assert response.headers["content-type"].startswith("application/json")
    assert body["request_id"] == response.headers["x-request-id"]
    return response.status_code, body["error"]["code"], body["error"]["param"]


async def test_score_and_chat_answer_with_the_request_id(server):
    scored = await server.post("/v1/score", json=SCORE_BODY)
    assert scored.status_code == 200
    body = scored.json()
    assert body["id"] == scored.headers["x-request-id"] and body["id"].startswith("scr_")
    assert [o["text"] for o in body["results"][0]["queries"][0]["combinations"][0]["options"]] == [" yes", " no"]
    assert "choices" not in body
    chat = await server.post("/v1/chat/completions", json={**SCORE_BODY, "temperature": 0})
    assert chat.status_code == 200 and chat.json()["choices"] == []
    assert chat.json()["results"] == body["results"]


async def test_a_streamed_chat_call_is_one_event_then_done(server):
    streamed = await server.post("/v1/chat/completions", json={**SCORE_BODY, "stream": True})
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    events = streamed.text.split("\n\n")
    assert events[1:] == ["data: [DONE]", ""] and events[0].startswith("data: ")
    chunk = json.loads(events[0].removeprefix("data: "))
    assert chunk["id"] == streamed.headers["x-request-id"] and chunk["choices"] == []
    assert [q["id"] for q in chunk["results"][0]["queries"]] == ["refund"]
    refused = await server.post("/v1/chat/completions", json={"messages": [], "stream": True})
    assert envelope(refused) == (400, "scoring_required", "scoring")  # errors stay plain JSON answers


async def test_errors_come_in_the_envelope(server):
    assert envelope(await server.get("/nope")) == (404, "not_found", None)
    refused = await server.get("/v1/score")
    assert envelope(refused) == (405, "method_not_allowed", None) and refused.headers["allow"] == "POST"
    for probe in ("/healthz", "/readyz", "/livez"):  # api spec §1: HEAD is not served (docs/deployment.md says why)
        head = await server.head(probe)  # a HEAD answer carries no body, only the status and headers
        assert head.status_code == 405 and head.headers["allow"] == "GET" and head.headers["x-request-id"]
    assert envelope(await server.post("/v1/score", content=b"")) == (400, "invalid_json", None)
    assert envelope(await server.post("/v1/score", content=b"x" * 5000)) == (413, "body_too_large", None)
    assert envelope(await server.post("/v1/chat/completions", json={"messages": []})) == (
        400,
        "scoring_required",
        "scoring",
    )
    bad = dict(SCORE_BODY, model="gpt-4")
    refused = await server.post("/v1/score", json=bad)
    assert envelope(refused) == (400, "model_not_served", "model")
    names = refused.json()["error"]["message"].split("; its names are ")[1].split(", ")
    assert names == ["'spinf/tiny-gemma4'", "'tiny'"]  # the served name is the manifest id too: named once
    redirect = await server.post("/v1/score/", json=SCORE_BODY)
    assert redirect.status_code == 307 and redirect.headers["location"] == "/v1/score"


async def test_bearer_tokens_and_trust(server):
    anonymous = httpx.AsyncClient(base_url=str(server.base_url), timeout=30)
    async with anonymous:
        assert envelope(await anonymous.post("/v1/score", json=SCORE_BODY)) == (401, "invalid_token", None)
        assert (await anonymous.get("/healthz")).status_code == 200
        wrong = await anonymous.get("/v1/models", headers={"Authorization": "Bearer tök".encode()})
        assert envelope(wrong) == (401, "invalid_token", None)
        lower = await anonymous.get("/v1/models", headers={"Authorization": "bearer  tok"})
        assert lower.status_code == 200
    assert envelope(await server.post("/v0/drain")) == (401, "invalid_token", None)
    trusted = {"Authorization": "Bearer boss"}
    info = await server.get("/v0/info", headers=trusted)
    assert info.status_code == 200 and info.json()["engine"]["model"] == "spinf/tiny-gemma4"
    stack = {name: info.json()["engine"].get(name) for name in ("torch", "triton", "transformers", "tokenizers")}
    stack |= {name: info.json()["engine"].get(name) for name in ("safetensors", "numpy", "fla")}
    assert stack == {  # the numerics stack's versions, as installed (constraints/*.txt pin them)
        name: importlib.metadata.version({"fla": "fla-core"}.get(name, name)) for name in stack
    }
    inside = (await server.post("/v1/score", json=SCORE_BODY, headers=trusted)).json()
    assert inside["engine"]["model"] == "spinf/tiny-gemma4" and inside["usage"]["packed_tokens"] > 0
    assert inside["usage"]["content_tokens"] == inside["usage"]["prompt_tokens_details"]["content_tokens"]
    outside = (await server.post("/v1/score", json=SCORE_BODY)).json()
    assert "engine" not in outside and "packed_tokens" not in outside["usage"]
    rejected = await server.post("/v1/score", json={"inputs": []}, headers=trusted)
    assert rejected.json()["rejected"]["code"] == "invalid_field"
    assert "rejected" not in (await server.post("/v1/score", json={"inputs": []})).json()


async def test_probes_and_metrics(server):
    assert (await server.get("/healthz")).json() == {"ok": True}
    ready = (await server.get("/readyz")).json()
    assert ready["ready"] is True and ready["boot"]["warm"] is True
    assert (await server.get("/livez")).json() == {"live": True}
    await server.post("/v1/score", json=SCORE_BODY)
    metrics = await server.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert 'spinf_requests_total{route="/v1/score",status="200"}' in metrics.text
    assert "spinf_warm 1.0" in metrics.text and "spinf_pass_seconds_count" in metrics.text
    assert "refund" not in metrics.text


async def test_a_client_that_goes_away_does_not_disturb_the_others(server):
    async def impatient():
        with trio.move_on_after(0.001):
            await server.post("/v1/score", json=SCORE_BODY)

    async with trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(impatient)
    answers = [await server.post("/v1/score", json=SCORE_BODY) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200]
    assert json.dumps(answers[0].json()["results"]) == json.dumps(answers[1].json()["results"])


async def test_a_failed_load_answers_503_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("SPINF_DRAIN_FILE", str(tmp_path / "drain"))

    def broken():
        raise OSError("no such checkpoint")

    async with running_actors(options(), broken, models_entry) as running:
        from spinf.server.app import create_app

        client = create_app(running.services).test_client()
        with trio.fail_after(10):
            while running.services.lifecycle.error is None:
                await trio.sleep(0.01)
        ready = await client.get("/readyz")
        assert ready.status_code == 503 and (await ready.get_json())["error"] == "OSError: no such checkpoint"
        assert (await client.get("/livez")).status_code == 503
        scored = await client.post("/v1/score", json=SCORE_BODY)
        assert scored.status_code == 503 and scored.headers["Retry-After"] == "60"
        assert (await scored.get_json())["error"]["code"] == "model_unavailable"
        running.drain.stop()


def variant(k: int) -> dict:
    text = f"Order {k} arrived {'late' if k % 2 else 'early'} and the box was {'damaged' if k % 3 else 'fine'}."
    queries = [{"id": "late", "template": "\n\nWas it late? Answer:{?}", "options": [" yes", " no"]}]
    queries.append({"id": f"n{k % 4}", "template": "\n\nDamaged? Answer:{?}", "options": [" yes", " no", " maybe"]})
    return {"messages": [{"content": text}], "scoring": {"queries": queries}}


async def test_200_concurrent_calls_get_200_or_429_and_every_200_equals_the_call_alone(server):
    answers = []

    async def call(k):
        response = await server.post("/v1/score", json=variant(k % 10))
        answers.append((k % 10, response.status_code, response.json(), response.headers.get("retry-after")))

    async with trio.open_nursery() as nursery:
        for k in range(200):
            nursery.start_soon(call, k)
    assert len(answers) == 200
    assert {status for _, status, _, _ in answers} <= {200, 429}
    assert any(status == 200 for _, status, _, _ in answers)
    assert all(retry == "2" for _, status, _, retry in answers if status == 429)
    alone = {}
    for k in range(10):
        alone[k] = (await server.post("/v1/score", json=variant(k))).json()["results"]
    for k, status, body, _ in answers:
        if status == 200:
            assert body["results"] == alone[k]
