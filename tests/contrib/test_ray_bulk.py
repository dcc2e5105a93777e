"""contrib/ray/score.py: the Ray Data bulk job writes what ``spinf-serve score`` writes for the same file.

A local Ray (2 CPUs, no dashboard) with 2 engine actors on the tiny model, on the CPU; ``spinf-serve score``
in-process is the reference. The runs that start Ray are ``slow`` (Ray's start and the actors' engines take about
10 s a run); the pieces that need no Ray (the Parquet conversion, a refused batch) run in the default suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import ray.data  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise RuntimeError("ray[data] is not installed: the dev extra brings it (pip install -e '.[dev]')") from None
    pytest.skip("ray[data] is not installed: pip install -e '.[ray]'", allow_module_level=True)

from contrib.ray import score  # noqa: E402
from spinf.bulk.inputs import read_items  # noqa: E402
from spinf.cli import main as spinf_serve  # noqa: E402
from spinf.errors import ApiError  # noqa: E402
from tests.bulk.fakes import REQUEST, fake_response, make_inputs, read_jsonl, write_jsonl  # noqa: E402

MODEL = "spinf/tiny-gemma4"
ROOT = Path(__file__).resolve().parents[2]
INPUTS = make_inputs(20)


def _parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # pa.array infers the columns from every row (Table.from_pylist looks at the first only)
    pq.write_table(pa.Table.from_struct_array(pa.array(rows)), path)
    return path


def test_a_parquet_file_becomes_the_same_inputs_as_its_json_lines(tmp_path):
    jsonl = write_jsonl(tmp_path / "inputs.jsonl", INPUTS)
    converted = score.parquet_to_jsonl(_parquet(tmp_path / "inputs.parquet", INPUTS), tmp_path / "converted.jsonl")
    assert list(read_items(converted)) == list(read_items(jsonl))


def test_a_refused_batch_comes_back_as_its_rows_error(tmp_path):
    def refuse(body: dict) -> dict:
        if body["inputs"][0]["id"] == "in-0004":
            raise ApiError(400, "invalid_request", "inputs.1.messages", "no good")
        return fake_response(body)

    items = list(read_items(write_jsonl(tmp_path / "inputs.jsonl", INPUTS[:8])))
    rows = {"k": [0, 1], "batch": [score._encode(items[:4]), score._encode(items[4:])]}
    out = score._score_rows([refuse], REQUEST, rows)
    assert [bool(line) for line in out["lines"]] == [True, False]
    assert out["error"][0] == ""
    where, envelope = out["error"][1].split("\n")
    assert where == "input 'in-0005' (line 6) was refused:"
    assert json.loads(envelope)["error"]["param"] == "inputs.5.messages"


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """A local Ray whose workers see the tiny model's cache (they inherit the driver's environment)."""
    import ray

    from spinf.engine.gemma4.tiny import ensure_tiny_snapshot

    hf_home = tmp_path_factory.mktemp("hf")
    ensure_tiny_snapshot(hf_home / "hub")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(hf_home))
        patch.setenv("RAY_AUTH_MODE", "disabled")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def reference(local_ray, tmp_path_factory) -> tuple[Path, Path, list[dict]]:
    """The request file, the inputs file, and what ``spinf-serve score`` wrote for them, parsed."""
    folder = tmp_path_factory.mktemp("reference")
    request = folder / "request.json"
    request.write_text(json.dumps(REQUEST))
    inputs = write_jsonl(folder / "inputs.jsonl", INPUTS)
    output = folder / "results.jsonl"
    command = ["score", str(request), MODEL, "--device", "cpu", "--inputs", str(inputs), "--output", str(output)]
    assert spinf_serve([*command, "--batch-size", "4", "--no-progress"]) == 0
    return request, inputs, read_jsonl(output)


def _engine_pool() -> score.Pool:

    args = score._parser().parse_args(["request.json", MODEL, "--device", "cpu", "--inputs", "x", "--output", "y"])
    args.actors, args.gpus_per_actor = 2, 0.0
    return score._pool(args)


@pytest.mark.slow
def test_two_engine_actors_write_what_spinf_serve_score_writes(reference, tmp_path):
    request, inputs, expected = reference
    output = tmp_path / "results.jsonl"
    stats = score.run_ray(json.loads(request.read_text()), inputs, output, pool=_engine_pool(), batch_size=4)
    assert read_jsonl(output) == expected
    assert (stats.total, stats.skipped, stats.scored, stats.batches) == (20, 0, 20, 5)


@pytest.mark.slow
def test_a_resumed_parquet_run_scores_only_the_rest(reference, tmp_path):
    """A run cut after 7 whole lines and half of the 8th: the rerun keeps the 7, cuts the half line, scores 13."""
    request, _, expected = reference
    parquet = _parquet(tmp_path / "inputs.parquet", INPUTS)
    output = tmp_path / "results.jsonl"
    lines = [json.dumps(record) + "\n" for record in expected]
    output.write_text("".join(lines[:7]) + lines[7][:25])
    progress: list[tuple[int, int]] = []
    stats = score.run_ray(
        json.loads(request.read_text()),
        parquet,
        output,
        pool=_engine_pool(),
        batch_size=4,
        resume=True,
        progress=lambda done, total: progress.append((done, total)),
    )
    assert read_jsonl(output) == expected
    assert (stats.skipped, stats.scored, stats.batches) == (7, 13, 4)
    assert progress == [(7, 20), (11, 20), (15, 20), (19, 20), (20, 20)]


@pytest.mark.slow
def test_http_tasks_through_a_running_server_write_what_spinf_serve_score_writes(reference, tmp_path):
    from contrib.loadtest.harness import ServerProcess

    request, inputs, expected = reference
    server = ServerProcess(tmp_path / "server", hf_home=Path(os.environ["HF_HOME"]))
    try:
        output = tmp_path / "results.jsonl"
        pool = score.Pool(2, urls=(server.url,))
        stats = score.run_ray(json.loads(request.read_text()), inputs, output, pool=pool, batch_size=4)
    finally:
        assert server.stop() == 0
    assert read_jsonl(output) == expected
    assert server.output().count("POST /v1/score 200") == stats.batches == 5


@pytest.mark.slow
def test_the_command_line_runs_the_job_on_a_ray_of_its_own(reference, tmp_path):
    """``python -m contrib.ray.score`` as the docs give it (``--address local``: a new Ray, not the module's)."""
    request, inputs, expected = reference
    output = tmp_path / "results.jsonl"
    command = [sys.executable, "-m", "contrib.ray.score", str(request), MODEL, "--device", "cpu"]
    command += ["--inputs", str(inputs), "--output", str(output), "--batch-size", "4", "--actors", "2"]
    command += ["--gpus-per-actor", "0", "--address", "local"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert read_jsonl(output) == expected
    assert done.stderr.splitlines()[-1].startswith(f"contrib.ray.score: wrote 20 results to {output} in ")
