"""The served model's prompt style reaches ``POST /v1/decisions``: the supervisor hands the manifest's
``prompt_style`` (`ServerOptions.prompt_style`) to the web layer, and a style without decision wording refuses
every decision call with 400 ``model_not_served`` while the model's score calls are served as before."""

from __future__ import annotations

import httpx
import pytest
import trio

from spinf.catalog import resolve_model
from spinf.server.supervisor import serve
from tests.server.fakes import models_entry, options

BODY = {"model": "tiny", "input": "Refund me.", "questions": [{"type": "predicate", "instructions": "A refund."}]}
SCORE = {"messages": [{"content": "Refund me."}], "scoring": {"queries": [
    {"id": "r", "template": "\n\nRefund? Answer:{?}", "options": [" yes", " no"]}]}}  # fmt: skip


def test_the_catalog_names_the_tiny_models_style():
    assert resolve_model("spinf/tiny-gemma4").manifest.prompt_style == "default"
    assert resolve_model("spinf/pplx-decider-v1-27b-int4").manifest.prompt_style == "decider"


@pytest.mark.parametrize(("style", "status"), [("default", 200), ("decider", 400)])
async def test_the_prompt_style_of_the_served_model_is_used(tiny_engine, tmp_path, monkeypatch, style, status):
    monkeypatch.setenv("SPINF_DRAIN_FILE", str(tmp_path / "drain"))
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve(
                options(prompt_style=style), lambda: tiny_engine, models_entry, task_status=task_status
            )
        )
        async with httpx.AsyncClient(base_url=binds[0], timeout=30) as client:
            with trio.fail_after(30):
                while (await client.get("/readyz")).status_code != 200:
                    await trio.sleep(0.05)
            answer = await client.post("/v1/decisions", json=BODY)
            assert answer.status_code == status, answer.text
            if status == 400:
                error = answer.json()["error"]
                assert (error["code"], error["param"]) == ("model_not_served", "model") and style in error["message"]
            assert (await client.post("/v1/score", json=SCORE)).status_code == 200
        nursery.cancel_scope.cancel()
