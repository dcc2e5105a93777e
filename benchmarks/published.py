"""The catalog's published checkpoints on a GPU (issue 12): fp8-static folders laid out as the Hub lays them out,
served as ``spinf-serve serve`` serves the catalog model.

    python benchmarks/published.py --model spinf/gemma-4-12b-fp8 --hf-home /tmp/hf --serve --cap-gib 24 \\
        --jobs J1,J2,J3 --against-bf16 /tmp/bf16 --results benchmarks/RESULTS.md

1. The manifest's checkpoint (repo and pinned revision) is written, unless complete already, to
   ``$HF_HOME/hub/models--<org>--<name>/snapshots/<revision>/`` with ``refs/main``: random weights in the model's
   real shape (the 12B's of engine spec B.19, the 31B's of benchmarks/gemma31b.py with its vision tower), drawn on
   the GPU shard by shard and compressed by compressed-tensors as they are written (contrib/fp8_static_checkpoint.py),
   so the 31B's bf16 form never has to fit on the disk. Every decoder linear gets the input scale ``--input-scale``
   (random weights have no corpus to calibrate on; an input past the scale's range clips, which costs accuracy on
   random weights, not speed).
2. ``--serve``: ``spinf-serve serve`` (no model argument for the default model, else the id) in a child process with
   that ``HF_HOME`` and ``HF_HUB_OFFLINE=1``: the seconds to ready, ``/v1/models``, ``/v0/info`` and one
   ``/v1/score`` answer.
3. In this process, ``Engine(model)`` through the same catalog lookup, under ``--cap-gib`` GiB of device memory when
   given (``torch.cuda.set_per_process_memory_fraction``, a smaller card emulated): the load, the scheme and its
   table id, then each job set of benchmarks/gpu_jobsets.py through `Engine.score`: questions/s, peak memory, and
   the margin left under the cap.
4. ``--against-bf16 DIR``: the same random draws written as the bf16 original (benchmarks/checkpoint.py) in
   ``DIR``, served by its path in fp8s with a shipped table of the same input scales: J1's option log-probs from
   both, and how many differ (the property is none).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import torch  # noqa: E402

from benchmarks.checkpoint import (  # noqa: E402
    COMPLETE,
    SHARD_BYTES,
    checkpoint_config,
    drawn_shards,
    free_memory,
    write_checkpoint,
    write_tokenizer,
)
from benchmarks.gemma12b import GEMMA_12B_TEXT_CONFIG, decoder_linear_params  # noqa: E402
from benchmarks.gemma31b import GEMMA_31B_TEXT_CONFIG, GEMMA_31B_VISION_CONFIG  # noqa: E402
from benchmarks.gpu_jobsets import Report, engine_call, job_bodies, measure, response_logprobs, row  # noqa: E402
from contrib.fp8_static_checkpoint import write_shards  # noqa: E402
from contrib.loadtest.harness import ServerProcess  # noqa: E402
from spinf.catalog import load_catalog  # noqa: E402

SHAPES = {
    "spinf/gemma-4-12b-fp8": (GEMMA_12B_TEXT_CONFIG, None),
    "spinf/gemma-4-31b-fp8": (GEMMA_31B_TEXT_CONFIG, GEMMA_31B_VISION_CONFIG),
}
SHAPES_DEFAULT = "spinf/gemma-4-12b-fp8"  # the catalog's default model: `spinf-serve serve` with no model argument
GIB = 2**30
SMALL = {
    "messages": [{"role": "user", "content": "I was charged twice for my order. Please refund one payment."}],
    "scoring": {"queries": [{"id": "refund", "template": "\n\nRefund? Answer:{?}", "options": [" yes", " no"]}]},
}


def snapshot_folder(hf_home: Path, repo: str, revision: str) -> Path:
    repo_dir = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    return repo_dir / "snapshots" / revision


def write_published(
    folder: Path, text_config: dict, vision_config: dict | None, input_scale: float, device: str = "cuda"
) -> float:
    """The fp8-static checkpoint of the shape in ``folder`` (seconds spent; 0 when it was complete already)."""
    if (folder / COMPLETE).exists():
        return 0.0
    started = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    dtype = torch.bfloat16
    shards = drawn_shards(text_config, dtype, vision_config, SHARD_BYTES, device=torch.device(device), seed=0)
    config = checkpoint_config(text_config, dtype, vision_config)
    write_shards(folder, config, shards, lambda names: dict.fromkeys(names, input_scale), index=True)
    write_tokenizer(folder)
    (folder / COMPLETE).write_text("")
    return time.perf_counter() - started


def serve(model: str | None, hf_home: Path, report: Report, device: str = "cuda:0") -> None:
    """``spinf-serve serve`` as a user starts it on this host (``model`` None: the default model, no argument), with
    ``hf_home`` offline: the seconds to ready, /v1/models, /v0/info and one answer."""
    out = Path(os.environ.get("OUT", "/tmp"))
    env = {"HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    try:
        server = ServerProcess(
            out, "--trusted-token", "boss", model=model, env=env, hf_home=hf_home, device=device, ready_s=480
        )
    except RuntimeError as exc:
        report.line(f"- `spinf-serve serve {model or ''}` did not become ready: {str(exc).splitlines()[0]}")
        return
    ready_s = time.perf_counter() - started
    auth = {"Authorization": "Bearer boss"}
    try:
        models = httpx.get(f"{server.url}/v1/models", headers=auth, timeout=30).json()
        info = httpx.get(f"{server.url}/v0/info", headers=auth, timeout=30).json()
        answer = httpx.post(f"{server.url}/v1/score", json=SMALL, headers=auth, timeout=120)
    finally:
        code = server.stop(timeout_s=120)
    entry = models["models"][0]
    engine = info.get("engine", info)
    option = answer.json()["results"][0]["queries"][0]["combinations"][0]["options"][0] if answer.is_success else None
    report.line(
        f"- `spinf-serve {' '.join(server.command)}` (HF_HOME with the folder above, offline): ready in {ready_s:.1f} "
        f"s; /v1/models: id {entry['id']}, status {entry['status']}, aliases {entry['aliases']}; /v0/info: quant "
        f"{engine.get('quant')}, scale_table {engine.get('scale_table')}, batch_invariant "
        f"{engine.get('batch_invariant')}; /v1/score: {answer.status_code}, first option {option}; exit {code}"
    )


def in_process(args: argparse.Namespace, report: Report) -> None:
    from spinf import Engine

    device = torch.device("cuda:0")
    if args.cap_gib:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(args.cap_gib * GIB / total, device)
    os.environ["HF_HOME"] = str(args.hf_home)
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    engine = Engine(args.model, device="cuda:0")
    load_s = time.perf_counter() - started
    loaded = torch.cuda.max_memory_allocated(device) / GIB
    engine.score(SMALL)
    cap = f" under a {args.cap_gib:g} GiB cap" if args.cap_gib else ""
    report.line(
        f"- `Engine({args.model!r})`{cap}: loaded in {load_s:.1f} s ({engine.quant}, table {engine.scale_table}, "
        f"batch invariant {engine.batch_invariant}, fingerprint {engine.system_fingerprint}), "
        f"{loaded:.2f} GiB at load"
    )
    text, _ = SHAPES[args.model]
    flops = 2 * decoder_linear_params(text)
    report.line("")
    report.line("| job | runner | questions | time | questions/s | tokens | passes | peak memory | MFU |")
    report.line("|---|---|---|---|---|---|---|---|---|")
    peaks = [loaded]
    for job in args.jobs.split(","):
        bodies, note = job_bodies(job, args.max_inputs)
        if bodies is None:
            report.line(f"| {job} | skipped: {note} |")
            continue
        for body in bodies[:1]:
            engine_call(engine, body)  # compiles and graph captures before the clock
        m = measure(lambda b: engine_call(engine, b), bodies, device, 3 if job != "J3" else 100, (2.0, 60.0))
        peaks.append(m["peak_gib"])
        report.line(row(job, f"ours ({engine.quant})", m, flops, None))
    peak = max(peaks)
    report.line("")
    margin = f"; margin under the cap {args.cap_gib - peak:.2f} GiB" if args.cap_gib else ""
    report.line(f"- peak device memory {peak:.2f} GiB (torch's allocator, load included){margin}")


def against_original(args: argparse.Namespace, report: Report, device: str = "cuda:0") -> None:
    """Issue 12's property on the real shape: the published checkpoint scores J1 bit for bit as its bf16 original
    (the same random draws, written by benchmarks/checkpoint.py) does in fp8s with a table of the same input scales,
    quantized at load on this device. One engine at a time."""
    from spinf import Engine
    from spinf.engine.scales import SHIPPED_TABLE, TABLE_FORMAT, write_table

    os.environ["HF_HOME"], os.environ["HF_HUB_OFFLINE"] = str(args.hf_home), "1"
    bodies, _ = job_bodies("J1", args.max_inputs)

    def scored(engine) -> list:
        return [response_logprobs(engine.score(body, trusted=True)["results"]) for body in bodies]

    published = Engine(args.model, device=device)
    names, want = published.model.linear_names(), scored(published)
    del published
    free_memory()
    text, vision = SHAPES[args.model]
    original = write_checkpoint(args.against_bf16, text, device=torch.device(device), seed=0, vision_config=vision)
    table = {"format": TABLE_FORMAT, "scheme": "fp8s", "scales": dict.fromkeys(names, args.input_scale)}
    write_table(table, original.path / SHIPPED_TABLE)
    at_load = Engine(str(original.path), device=device, quant="fp8s")
    got = scored(at_load)
    del at_load
    free_memory()
    flat = list(zip(_flat(want), _flat(got), strict=True))
    differing = sum(a != b for a, b in flat)
    report.line(
        f"- J1 from the published checkpoint against its bf16 original ({original.path.name}, written in "
        f"{original.write_s:.0f} s) quantized at load in fp8s with the same input scales: {differing} of {len(flat)} "
        f"option log-probs differ (largest |Δ| {max((abs(a - b) for a, b in flat), default=0.0):.3g})"
    )


def _flat(nested) -> list[float]:
    if isinstance(nested, list):
        return [value for item in nested for value in _flat(item)]
    return [nested]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=SHAPES_DEFAULT, choices=sorted(SHAPES))
    parser.add_argument("--hf-home", type=Path, required=True)
    parser.add_argument("--input-scale", type=float, default=0.25)
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--cap-gib", type=float, default=0.0)
    parser.add_argument("--jobs", default="J1,J2,J3")
    parser.add_argument("--max-inputs", type=int, default=None)
    parser.add_argument("--results", type=Path)
    parser.add_argument("--no-engine", action="store_true", help="write (and serve) only")
    parser.add_argument("--against-bf16", type=Path, help="a folder for the bf16 original: compare J1 bit for bit")
    args = parser.parse_args(argv)
    report = Report(args.results)
    manifest = load_catalog().find(args.model)
    folder = snapshot_folder(args.hf_home, manifest.source.repo, manifest.source.revision)
    text, vision = SHAPES[args.model]
    write_s = write_published(folder, text, vision, args.input_scale)
    size = sum(p.stat().st_size for p in folder.glob("*.safetensors")) / 1e9
    report.line(f"\n### {args.model} ({torch.cuda.get_device_name(0)}, git {os.environ.get('GIT_SHA', 'unknown')})\n")
    report.line(
        f"- checkpoint: {folder} ({size:.1f} GB of safetensors in the fp8-static layout, written by compressed-tensors"
        f" in {write_s:.0f} s; input scale {args.input_scale:g} on every linear)"
    )
    if args.serve:
        serve(None if args.model == SHAPES_DEFAULT else args.model, args.hf_home, report)
    if not args.no_engine:
        in_process(args, report)
    if args.against_bf16:
        against_original(args, report)


if __name__ == "__main__":
    main()
