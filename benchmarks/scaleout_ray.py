"""The Ray Data leg of benchmarks/scaleout.py: contrib/ray/score.py's job on the same inputs, one actor per GPU.

The inputs are the scale-out's J2 messages cycled ``--ray-repeat`` times (ids ``m000-0``, ``m000-1``, …), the
request its shared part. The reference is ``spinf-serve score`` in-process (a child process) on the first cycle; the
Ray job's first lines must be those bytes. The Ray job runs in this process on a local Ray with one engine actor per
GPU (``--gpus-per-actor 1``) or, on the CPU, one per replica (no GPU, one CPU each); its rate is read from its
progress: the questions of the second half of the inputs over the time they took, which leaves out Ray's start and
the actors' loading, and is set against the replicas' questions/s at the same N. Without ray installed the leg is
skipped with a line that says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import attrs


@attrs.frozen
class RayJob:
    """What the leg needs from the scale-out run: where, the model as the replicas open it, the inputs."""

    work: Path
    on_gpu: bool
    model: str  # the model argument, and the flags beside it (``--model-dir``, ``--quant``)
    flags: tuple[str, ...]
    env: dict[str, str]  # HF_HOME, SPINF_MANIFEST_DIRS: what the replicas ran with
    request: dict
    inputs: list[dict]  # the first cycle
    questions_per_input: int
    repeat: int
    batch_size: int
    actors: int


def ray_lines(job: RayJob, replicas_rate: float | None) -> list[str]:
    """The report's lines; ``replicas_rate`` is the replicas' questions/s at N = ``job.actors``, where measured."""
    try:
        import ray.data  # noqa: F401
    except ImportError:
        return ["\n- Ray Data: skipped, ray[data] is not installed (pip install -e '.[ray]')"]
    folder = job.work / "ray"
    folder.mkdir(parents=True, exist_ok=True)
    request = folder / "request.json"
    request.write_text(json.dumps(job.request))
    inputs = [{**item, "id": f"{item['id']}-{r}"} for r in range(job.repeat) for item in job.inputs]
    first = write_lines(folder / "reference-inputs.jsonl", inputs[: len(job.inputs)])
    reference, reference_s = score_in_process(job, request, first, folder / "reference.jsonl")
    timing = run_job(job, request, write_lines(folder / "inputs.jsonl", inputs), folder / "ray.jsonl")
    got = (folder / "ray.jsonl").read_text(encoding="utf-8").splitlines()
    per_input = job.questions_per_input
    whole = len(inputs) * per_input / timing["elapsed_s"]
    return [
        f"\n- Ray Data (contrib/ray/score.py, {job.actors} engine actors, batches of {job.batch_size}): "
        f"{len(inputs):,} inputs × {per_input} questions; {steady_text(timing, per_input, job, replicas_rate)}; "
        f"{whole:,.0f} questions/s over the whole job ({timing['elapsed_s']:.1f} s, Ray's start and the actors' "
        "loading included)",
        f"- Ray Data output against `spinf-serve score` in-process on the first {len(reference)} inputs "
        f"({len(reference) * per_input / reference_s:,.0f} questions/s, the load included): "
        + ("identical" if got[: len(reference)] == reference else "DIFFERENT"),
    ]


def steady_text(timing: dict, per_input: int, job: RayJob, replicas_rate: float | None) -> str:
    if timing["steady_inputs_per_s"] is None:
        return "too few batches after the first half for a steady rate (more --ray-repeat)"
    rate = timing["steady_inputs_per_s"] * per_input
    versus = f", {rate / replicas_rate:.2f}× the {job.actors} replicas' {replicas_rate:,.0f}" if replicas_rate else ""
    return f"{rate:,.0f} questions/s over the second half{versus}"


def write_lines(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def score_in_process(job: RayJob, request: Path, inputs: Path, output: Path) -> tuple[list[str], float]:
    """``spinf-serve score`` with the replicas' model on the first device; its lines and the seconds it took."""
    output.unlink(missing_ok=True)
    device = "cuda:0" if job.on_gpu else "cpu"
    command = [sys.executable, "-m", "spinf", "score", str(request), job.model, *job.flags, "--device", device]
    command += ["--inputs", str(inputs), "--output", str(output), "--batch-size", str(job.batch_size)]
    started = time.monotonic()
    done = subprocess.run([*command, "--no-progress"], env={**os.environ, **job.env}, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"spinf-serve score failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return output.read_text(encoding="utf-8").splitlines(), time.monotonic() - started


def run_job(job: RayJob, request: Path, inputs: Path, output: Path) -> dict[str, float | None]:
    """contrib/ray/score.py's `run_ray` on a local Ray of its own; its seconds, and inputs/s over the second half."""
    import ray

    from contrib.ray import score

    output.unlink(missing_ok=True)
    os.environ.update({**job.env, "RAY_AUTH_MODE": "disabled"})  # the workers inherit the driver's environment
    argv = [str(request), job.model, *job.flags, "--device", "cuda:0" if job.on_gpu else "cpu"]
    argv += ["--inputs", str(inputs), "--output", str(output), "--actors", str(job.actors)]
    argv += ["--gpus-per-actor", "1" if job.on_gpu else "0"]
    gpus = job.actors if job.on_gpu else 0
    ray.init(num_cpus=max(job.actors, 2), num_gpus=gpus, include_dashboard=False, log_to_driver=False)
    progress: list[tuple[float, int]] = []
    try:
        stats = score.run_ray(
            json.loads(request.read_text()),
            inputs,
            output,
            pool=score._pool(score._parser().parse_args(argv)),
            batch_size=job.batch_size,
            progress=lambda done, total: progress.append((time.monotonic(), done)),
        )
    finally:
        ray.shutdown()
    (half_s, half), (end_s, end) = next(p for p in progress if p[1] >= stats.total / 2), progress[-1]
    steady = (end - half) / (end_s - half_s) if end > half else None
    return {"elapsed_s": stats.elapsed_s, "steady_inputs_per_s": steady}
