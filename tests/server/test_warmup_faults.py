"""A checkpoint that loads but computes NaN, served by a real server process (issue 33 item 8).

It used to warm up, report ready and answer every call 500 (the JSON encoder refuses NaN). Now the warm-up checks
its calls' answers (`spinf.engine.warm.checked_score`), so the boot fails as api spec §3.1 says: ``/readyz``
answers 503 with the reason, a call gets 503 ``model_unavailable``, the reason is logged, and the process keeps
answering probes (the process manager decides what to do with a failed boot).
"""

from __future__ import annotations

import shutil
import time

import httpx
from safetensors.torch import load_file, save_file

from contrib.loadtest.harness import ServerProcess, score_body, tiny_cache


class Starting(ServerProcess):
    """A `ServerProcess` that does not wait for ready (this one never is)."""

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        pass


def nan_checkpoint(snapshot, folder):
    """A copy of the tiny checkpoint whose final norm is NaN: it loads, and every score it computes is NaN."""
    shutil.copytree(snapshot, folder)
    weights = load_file(folder / "model.safetensors")
    weights["model.language_model.norm.weight"] = weights["model.language_model.norm.weight"] * float("nan")
    (folder / "model.safetensors").unlink()
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_a_model_that_computes_nan_fails_the_boot_instead_of_reporting_ready(tmp_path):
    hf_home = tiny_cache(tmp_path / "hf")
    [snapshot] = (hf_home / "hub" / "models--spinf--tiny-gemma4" / "snapshots").iterdir()
    folder = nan_checkpoint(snapshot, tmp_path / "nan-model")
    server = Starting(tmp_path / "run", model=str(folder), hf_home=hf_home)
    try:
        deadline, ready = time.monotonic() + 120, None
        while time.monotonic() < deadline:
            try:
                ready = httpx.get(f"{server.url}/readyz", timeout=2)
            except httpx.TransportError:
                ready = None
            if ready is not None and (ready.status_code == 200 or "error" in ready.json()):
                break
            assert server.process.poll() is None, server.output()
            time.sleep(0.2)
        assert ready is not None and ready.status_code == 503, server.output()
        error = ready.json()["error"]
        assert error.startswith("ModelError: the model computes non-finite scores (the warm-up call's results.0.")
        call = httpx.post(f"{server.url}/v1/score", json=score_body(), timeout=30)
        assert (call.status_code, call.json()["error"]["code"]) == (503, "model_unavailable")
        failed = "ERROR spinf.server.actors.warmup: warm-up failed: ModelError: the model computes non-finite"
        assert failed in server.output()
    finally:
        assert server.stop() == 0
