"""The reference engine's (spinf-serve 0.1.1) Gemma files, built as it builds them, read by ours in a real server.

`reference_table` and `write_reference_table` make an fp8s scale table the way the reference's calibration writes
one: per checkpoint projection (``layers.0.self_attn.q_proj`` ...; no ``v_proj`` where a layer's keys serve as
values), ``2^ceil(log2(headroom · max(amax, 1e-6) / 448))``, ``json.dump(indent=1, sort_keys=True)`` and a newline,
under ``<tables>/<org>__<name>/<revision>.json``. The unit tests beside the modules use them too
(tests/engine/test_scales.py); here a server started as a user starts it scores with such a table in the store.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil

import httpx
import pytest

QUERY = {"id": "refund", "template": "\n\nDoes the customer ask for a refund? Answer:{?}", "options": [" yes", " no"]}
BODY = {
    "inputs": [
        {"id": "a", "messages": [{"role": "user", "content": "I was charged twice. Please refund one payment."}]},
        {"id": "b", "messages": [{"role": "user", "content": "Where is my parcel? It is a week late. " * 5}]},
    ],
    "scoring": {"queries": [QUERY, {"id": "tone", "template": "\n\nThe tone is{?}", "options": [" calm", " angry"]}]},
}
TRUSTED = "boss"


def projection_amax(model) -> dict[str, float]:
    """Per checkpoint projection of ``model`` (a loaded Gemma text model), an amax as the reference's calibration
    records it, the projections of one fused linear made to differ (q, k and v; gate and up) so that taking the
    largest is what is tested (a real calibration finds them equal: they read the same input)."""
    amax = {}
    for layer in model.layers:
        i, base = layer.index, 40.0 + 30 * layer.index
        attention = {"q_proj": base, "k_proj": 3 * base} | ({} if layer.spec.k_eq_v else {"v_proj": base / 3})
        for name, value in attention.items():
            amax[f"layers.{i}.self_attn.{name}"] = value
        amax[f"layers.{i}.self_attn.o_proj"] = 5.5 + i
        amax[f"layers.{i}.mlp.gate_proj"] = 100.0 * (i + 1)
        amax[f"layers.{i}.mlp.up_proj"] = 7.0
        amax[f"layers.{i}.mlp.down_proj"] = 600.0 + i
    return amax


def reference_table(model_id: str, revision: str, amax: dict[str, float], headroom: float = 2.0) -> dict:
    """The table the reference's calibration writes for these maxima (its keys and values)."""
    return {
        "model_id": model_id,
        "revision": revision,
        "scheme": "fp8s",
        "headroom": headroom,
        "created": "2026-10-01",
        "calibrated_with": {"quant": "fp8", "gpu": "NVIDIA GeForce RTX 4090", "torch": "2.14.0+cu130", "image": ""},
        "corpus": {
            "file": "v1.json.gz",
            "testbed": "v1",
            "sha256_12": "ff6f13669ed1",
            "inputs": {"news-oil": 120, "news": 18},
            "tokens": 943846,
            "images": False,
            "audio": False,
        },
        "amax": {name: round(value, 4) for name, value in amax.items()},
        "amax_from": dict.fromkeys(amax, "news-oil"),
        "scales": {name: 2.0 ** math.ceil(math.log2(max(v, 1e-6) * headroom / 448.0)) for name, v in amax.items()},
    }


def write_reference_table(tables, model_id: str, revision: str, table: dict):
    """``table`` written where and as the reference writes it, under its table folder ``tables``; the path."""
    path = tables / model_id.replace("/", "__") / f"{revision}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
        f.write("\n")
    return path


def fused_max(projection_scales: dict[str, float]) -> dict[str, float]:
    """The same scales as a table of ours names them, each fused linear the largest of its projections, written out
    independently of the reader."""
    fused = {}
    for name, scale in projection_scales.items():
        layer, kind, projection = name.split(".")[1], name.split(".")[2], name.split(".")[3]
        ours = (
            {"q_proj": "wqkv", "k_proj": "wqkv", "v_proj": "wqkv", "o_proj": "wo"}
            if kind == "self_attn"
            else {
                "gate_proj": "w_gate_up",
                "up_proj": "w_gate_up",
                "down_proj": "w_down",
            }
        )
        key = f"layers.{layer}.{ours[projection]}"
        fused[key] = max(fused.get(key, 0.0), scale)
    return fused


@pytest.fixture(scope="module")
def reference_home(tmp_path_factory, tiny_engine):
    """An HF_HOME with the tiny model's snapshot and, in the store, the reference's table folder copied as it is
    (``<HF_HOME>/spinf/scales/tables/spinf__tiny-gemma4/<revision>.json``); the home and the table's path."""
    from contrib.loadtest.harness import tiny_cache

    home = tiny_cache(tmp_path_factory.mktemp("reference-home"))
    table = reference_table(tiny_engine.model_id, tiny_engine.revision, projection_amax(tiny_engine.model))
    built = write_reference_table(
        tmp_path_factory.mktemp("spinf_serve") / "tables", tiny_engine.model_id, tiny_engine.revision, table
    )
    shutil.copytree(built.parent.parent, home / "spinf" / "scales" / "tables")
    return home, home / "spinf" / "scales" / "tables" / built.parent.name / built.name


def test_a_server_scores_with_a_reference_table_in_the_store(tmp_path, reference_home, tiny_engine, monkeypatch):
    """``spinf-serve serve spinf/tiny-gemma4 --quant fp8s`` (fp8s runs emulated on the CPU) with only the
    reference's table: /v0/info names the table by its bytes' hash, and the answers are those of the same scales
    in a table of ours (fused: the largest), bit for bit; the fingerprints differ by the table id alone."""
    from contrib.loadtest.harness import ServerProcess
    from spinf import Engine
    from spinf.engine.scales import store_path, write_table

    home, path = reference_home
    server = ServerProcess(tmp_path, "--quant", "fp8s", "--trusted-token", TRUSTED, hf_home=home)
    try:
        auth = {"Authorization": f"Bearer {TRUSTED}"}
        info = httpx.get(f"{server.url}/v0/info", headers=auth, timeout=30).json()
        answer = httpx.post(f"{server.url}/v1/score", json=BODY, headers=auth, timeout=120).json()
    finally:
        assert server.stop() == 0
    engine = info.get("engine", info)
    reference_id = hashlib.sha256(path.read_bytes()).hexdigest()[:10]
    assert (engine["quant"], engine["scale_table"]) == ("fp8s", reference_id), info

    monkeypatch.setenv("HF_HOME", str(home))
    same = Engine("tiny", device="cpu", cache_dir=home / "hub", quant="fp8s")
    assert same.scale_table == reference_id and answer["system_fingerprint"] == same.system_fingerprint
    ours_home = tmp_path / "ours"
    scales = fused_max(json.loads(path.read_text())["scales"])
    ours_id = write_table(
        {"format": 1, "model": same.model_id, "revision": same.revision, "scheme": "fp8s", "scales": scales},
        store_path(same.model_id, same.revision, ours_home / "spinf" / "scales"),
    )
    monkeypatch.setenv("HF_HOME", str(ours_home))
    ours = Engine("tiny", device="cpu", cache_dir=home / "hub", quant="fp8s")
    assert ours.scale_table == ours_id != reference_id
    assert json.dumps(answer["results"]) == json.dumps(ours.score(BODY)["results"])
    assert answer["system_fingerprint"] != ours.system_fingerprint
    exact = tiny_engine.score(BODY)["results"]  # fp32: the fp8s answers are close to it, not equal
    assert json.dumps(answer["results"]) != json.dumps(exact)
