"""benchmarks/published.py's checkpoint writer on the CPU: a scaled-down 12B in the fp8-static layout, drawn and
compressed shard by shard, that the engine serves by path with its own input scales."""

from __future__ import annotations

import json

import pytest

from benchmarks.gemma12b import GEMMA_12B_TEXT_CONFIG, scaled
from benchmarks.gemma31b import scaled_31b
from benchmarks.published import snapshot_folder, write_published
from spinf.engine.gemma4.fp8_static import format_problem


@pytest.mark.parametrize("repo", ["spinf/gemma-4-12b-fp8", "spinf/gemma-4-31b-fp8"])
def test_the_writer_lays_out_a_hub_snapshot_the_engine_reads(tmp_path, repo):
    """Scaled down: the 12B's unified layout, and the 31B's ``gemma4`` one with its vision tower (left in bf16)."""
    from spinf import Engine

    text, vision = (scaled(GEMMA_12B_TEXT_CONFIG), None) if "12b" in repo else scaled_31b()
    folder = snapshot_folder(tmp_path / "hf", repo, "a" * 40)
    assert write_published(folder, text, vision, 0.25, device="cpu") > 0
    assert write_published(folder, text, vision, 0.25, device="cpu") == 0  # complete
    assert (tmp_path / f"hf/hub/models--{repo.replace('/', '--')}/refs/main").read_text() == "a" * 40
    assert format_problem(json.loads((folder / "config.json").read_text())) is None
    engine = Engine(str(folder), device="cpu")
    assert (engine.quant, engine.scale_table) == ("fp8s", "checkpoint")
    assert all(scale == 0.25 for layer in engine.model.layers for _, scale in layer.fp8.values())


def test_the_serve_step_reports_what_the_server_says(tmp_path, monkeypatch):
    """The GPU run's `spinf-serve serve` step, on the tiny model on the CPU: ready, /v1/models, /v0/info, an answer."""
    from benchmarks.gpu_jobsets import Report
    from benchmarks.published import serve
    from contrib.loadtest.harness import tiny_cache

    monkeypatch.setenv("OUT", str(tmp_path))
    results = tmp_path / "results.md"
    serve("spinf/tiny-gemma4", tiny_cache(tmp_path / "hf"), Report(results), device="cpu")
    line = results.read_text()
    assert "status available" in line and "quant fp32" in line and "/v1/score: 200" in line and "exit 0" in line, line
