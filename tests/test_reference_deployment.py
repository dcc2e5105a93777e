"""A deployment written for the reference (spinf-serve 0.1.1) starts and serves here without an edit (api spec §9.1,
"The reference's names work too (drop-in)"; issue 31).

The ``server.toml`` is written the way the reference reads one: its tables flattened, so keys sit at the top level
and in whichever table, with its own names (``media_kinds``, ``load_media``) and its engine settings written out at
their defaults; the environment uses its names too (``SPINF_MODEL_ID`` naming the model, ``SPINF_ENGINE_TOKEN``,
``SPINF_MEDIA`` as a boolean, ``SPINF_X_BEAM``). A real ``spinf-serve serve`` process on the tiny model starts from
them, logs one line for each key outside its section and each setting that has no effect here, serves the media
kinds the file chose and scores; ``spinf-serve config`` shows the same settings with what has no effect.
"""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from contrib.loadtest.harness import ROOT, ServerProcess
from spinf.settings import SETTING

TOKEN = "front-end"  # the trusted token, under the reference's name SPINF_ENGINE_TOKEN
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SERVER_TOML = """\
# written for spinf-serve 0.1.1: it flattens the tables, so a key may sit anywhere
max_content_tokens = 8192
debug = false

[engine]
prefetch = 6
align_jobs = true
lm_rows = 1024
stack_options = ""
load_media = true
capture_budget_gib = 2.0

[server]
port = 8000
queue = 8
max_options = 500

[features]
media_kinds = ["image", "video"]
"""
ENV = {
    "SPINF_MODEL_ID": "spinf/tiny-gemma4",  # no model named: the reference serves its model_id
    "SPINF_MEDIA": "1",  # the reference's default written out: the embedders loaded, the kinds left to media_kinds
    "SPINF_ALIGN_JOBS": "true",
    "SPINF_PREFETCH": "6",
    "SPINF_X_BEAM": "6",
    "SPINF_ENGINE_TOKEN": TOKEN,
}
PIXEL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5E"
    "rkJggg=="
)
QUERY = {"id": "refund", "template": "\n\nDoes the customer ask for a refund? Answer:{?}", "options": [" yes", " no"]}


def no_effect(name: str, value: str, origin: str) -> str:
    return f"engine.{name} = {value} ({origin}): no effect on this engine: {SETTING[name].no_effect}"


def expected_notes(path) -> list[str]:
    at = f"config {path}"
    return [
        f"max_content_tokens ({at}:2): read as limits.max_content_tokens, but it belongs in [limits], not outside "
        "any section",
        f"debug ({at}:3): read as server.debug, but it belongs in [server], not outside any section",
        f"server.max_options ({at}:16): read as limits.max_options, but it belongs in [limits], not [server]",
        no_effect("stack_options", '""', f"{at}:9"),
        no_effect("capture_budget_gib", "2.0", f"{at}:11"),
        no_effect("prefetch", "6", "env SPINF_PREFETCH"),
        no_effect("lm_rows", "1024", f"{at}:8"),
        no_effect("align_jobs", "true", "env SPINF_ALIGN_JOBS"),
        no_effect("x_beam", "6", "env SPINF_X_BEAM"),
    ]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reference-deployment")
    config = folder / "server.toml"
    config.write_text(SERVER_TOML)
    with pytest.MonkeyPatch.context() as patch:
        for name in [name for name in os.environ if name.startswith("SPINF_")]:  # only the deployment's own
            patch.delenv(name)
        process = ServerProcess(folder, model=None, env={**ENV, "SPINF_CONFIG": str(config)})
    yield process, config
    assert process.stop() == 0


def test_it_starts_and_logs_each_note_once(deployment):
    process, config = deployment
    log = process.output()
    for note in expected_notes(config):
        assert log.count(note) == 1, note
    assert log.count("no effect on this engine") == 6  # those given, and no other
    assert "spinf/tiny-gemma4" in log and "Traceback" not in log


def test_models_shows_the_model_id_served_and_the_media_kinds_the_file_chose(deployment):
    process, _ = deployment
    assert httpx.get(f"{process.url}/v1/models", timeout=30).status_code == 401  # the reference's token name is read
    (entry,) = httpx.get(f"{process.url}/v1/models", headers=AUTH, timeout=30).json()["models"]
    assert entry["id"] == "spinf/tiny-gemma4"
    assert entry["media"] == entry["features"]["media"] == ["image", "video"]
    assert entry["limits"]["max_content_tokens"] == 8192 and entry["limits"]["max_options"] == 500
    info = httpx.get(f"{process.url}/v0/info", headers=AUTH, timeout=30).json()["engine"]
    assert info["model"] == "spinf/tiny-gemma4"  # the manifest's repo, which model_id named


def test_the_reference_s_text_only_switch_serves_no_media(tmp_path):
    """SPINF_MEDIA=0 beside the same file: text only, whatever media_kinds says (the embedders are not loaded)."""
    config = tmp_path / "server.toml"
    config.write_text(SERVER_TOML)
    with pytest.MonkeyPatch.context() as patch:
        for name in [name for name in os.environ if name.startswith("SPINF_")]:
            patch.delenv(name)
        process = ServerProcess(tmp_path, model=None, env={**ENV, "SPINF_CONFIG": str(config), "SPINF_MEDIA": "0"})
    try:
        (entry,) = httpx.get(f"{process.url}/v1/models", headers=AUTH, timeout=30).json()["models"]
        image = [{"type": "image_url", "image_url": {"url": PIXEL}}]
        body = {"messages": [{"role": "user", "content": image}], "scoring": {"queries": [QUERY]}}
        refused = httpx.post(f"{process.url}/v1/score", json=body, headers=AUTH, timeout=120)
    finally:
        assert process.stop() == 0
    assert entry["media"] == entry["features"]["media"] == []
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "media_disabled")


def test_it_scores_text_and_an_image_and_refuses_the_kind_switched_off(deployment):
    process, _ = deployment
    body = {"messages": [{"role": "user", "content": "I was charged twice. Please refund one payment."}]}
    body["scoring"] = {"queries": [QUERY]}
    answer = httpx.post(f"{process.url}/v1/score", json=body, headers=AUTH, timeout=120)
    assert answer.status_code == 200, answer.text
    options = answer.json()["results"][0]["queries"][0]["combinations"][0]["options"]
    assert [option["text"] for option in options] == [" yes", " no"]
    assert abs(sum(option["p"] for option in options) - 1) < 1e-5
    image = [{"type": "text", "text": "A photo:"}, {"type": "image_url", "image_url": {"url": PIXEL}}]
    body["messages"] = [{"role": "user", "content": image}]
    assert httpx.post(f"{process.url}/v1/score", json=body, headers=AUTH, timeout=120).status_code == 200
    audio = [{"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]
    body["messages"] = [{"role": "user", "content": audio}]
    refused = httpx.post(f"{process.url}/v1/score", json=body, headers=AUTH, timeout=120)
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "media_disabled")


def test_config_shows_the_deployment_with_what_has_no_effect(deployment):
    """The same deployment with the reference's text-only switch, SPINF_MEDIA=0 (the embedders not loaded)."""
    _, config = deployment
    env = {name: value for name, value in os.environ.items() if not name.startswith("SPINF_")}
    env |= {**ENV, "SPINF_CONFIG": str(config), "SPINF_MEDIA": "0"}
    shown = subprocess.run(
        [sys.executable, "-m", "spinf", "config"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    rows = {line.split(" = ")[0].split()[-1]: line for line in shown.stdout.splitlines()}
    assert rows["engine.model"].startswith("env SPINF_MODEL_ID ") and '"spinf/tiny-gemma4"' in rows["engine.model"]
    assert rows["features.media"].startswith("env SPINF_MEDIA ") and rows["features.media"].endswith('= "none"')
    assert rows["engine.prefetch"].startswith("env SPINF_PREFETCH ")
    assert rows["engine.lm_rows"].startswith(f"config {config}:8 ")
    for name in ("stack_options", "capture_budget_gib", "prefetch", "lm_rows", "align_jobs", "x_beam"):
        assert rows[f"engine.{name}"].endswith(f" # no effect on this engine: {SETTING[name].no_effect}")
    assert shown.stderr.splitlines() == [f"spinf-serve: warning: {note}" for note in expected_notes(config)]
