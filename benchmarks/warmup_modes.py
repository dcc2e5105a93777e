"""Issue 12 item 7's timing: load and warm-up under each ``--warmup`` mode, and what the first calls pay after it.

Run on the GPU machine: ``python benchmarks/warmup_modes.py [--shape 12b|31b] [--modes none,short,full]
[--quant fp8s|bf16] [--work DIR]``; the CPU smoke test is ``python benchmarks/warmup_modes.py --model
spinf/tiny-gemma4 --device cpu``.

The parent writes the random checkpoint of ``--shape`` (`benchmarks.checkpoint`; skipped with ``--model``, which
names a model the engine resolves as ``spinf-serve serve`` does) and, for fp8s, its scale table. Then each mode
runs in a fresh child process (``--child MODE``) with a Triton cache of its own, empty unless ``--triton-cache``
names one, so every mode compiles from nothing as a first start does. In the child:

1. load: the engine opened as the server opens it (`benchmarks.checkpoint.open_engine`, or ``Engine(--model)``);
2. warm-up: the steps the server's warm-up runs (`Engine.warmup_steps`), one after another, timed to the device's
   end, with the passes they ran, the CUDA graphs captured and the peak device memory;
3. probes: calls of several sizes (J3, J1's first input and first 8, contents of 3, 12, 25 and 60 sentences with
   four questions), each made twice in a row, each time through a loop of its own with no floor cache (templates
   compiled and floors read both times): the first pays whatever the warm-up left to compile or capture, the
   second is the warm time; ``paid`` is the sum of the differences, and the graphs the probes captured are counted.

One section goes to benchmarks/RESULTS.md (`benchmarks.results.append_section`; ``--no-results`` prints only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.baseline import BENCH_LIMITS  # noqa: E402
from benchmarks.checkpoint import calibrate_folder, open_engine, work_dir, write_checkpoint  # noqa: E402
from benchmarks.gpu_fast import calibration_corpus  # noqa: E402
from benchmarks.gpu_jobsets import job_bodies  # noqa: E402
from benchmarks.results import RESULTS, append_section, cpu_machine  # noqa: E402
from benchmarks.shapes import SHAPES, model_config, model_title, model_vision  # noqa: E402
from spinf.engine import warm  # noqa: E402
from spinf.engine.engine import Engine  # noqa: E402
from spinf.engine.loop import EngineLoop  # noqa: E402

QUESTION = {"template": "\n\nQuestion {k}: is the customer unhappy? Answer:{{?}}", "options": [" yes", " no"]}


def probe_bodies() -> dict[str, dict]:
    """The probe calls by name: the job sets' (J3, J1's first input and first 8) and contents of n sentences."""
    probes = {}
    j3, _ = job_bodies("J3", None)
    j1, _ = job_bodies("J1", 8)
    if j3:
        probes["J3"] = j3[0]
    if j1:
        probes["J1, 1 input"] = {**j1[0], "inputs": j1[0]["inputs"][:1]}
        probes["J1, 8 inputs"] = j1[0]
    for n in (3, 12, 25, 60):
        queries = [{"id": f"q{k}", **QUESTION, "template": QUESTION["template"].format(k=k)} for k in range(4)]
        probes[f"{n} sentences"] = {"messages": [{"content": warm.SENTENCE * n}], "scoring": {"queries": queries}}
    return probes


def cold_call(engine: Engine, body: dict) -> None:
    """``body`` through a loop of its own with no floor cache (as `Engine.score` runs it otherwise), so a second
    call compiles its templates and reads its floors again: only what is compiled once per process differs."""
    loop = engine.new_loop(share_passes=engine.batch_invariant, floor_cache=0)
    call = EngineLoop.new_call(body, "probe", trusted=True)
    loop.run([call])
    call.unwrap()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    started = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - started


def open_child_engine(args: argparse.Namespace) -> Engine:
    if args.model:
        return Engine(args.model, device=args.device, quant=args.quant, limits=BENCH_LIMITS)
    device = torch.device(args.device)
    folder = write_checkpoint(args.work, model_config(args), device=device, vision_config=model_vision(args))
    return open_engine(folder, args.work, quant=args.quant if folder.on_gpu else "fp32", limits=BENCH_LIMITS)


def child(args: argparse.Namespace) -> dict:
    """One mode in this process: load, warm-up, probes (module docstring)."""
    device = torch.device(args.device)
    started = time.perf_counter()
    engine = open_child_engine(args)
    sync(device)
    found: dict = {"mode": args.child, "load_s": time.perf_counter() - started}
    graphs = engine.scorer.graphs
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    before = engine.loop.statistics().passes
    steps = engine.warmup_steps(args.child)
    found["warmup_s"] = timed(lambda: [step() for step in steps], device)
    found["steps"], found["passes"] = len(steps), engine.loop.statistics().passes - before
    found["graphs"] = len(graphs.captured) if graphs is not None else None
    found["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    found["probes"] = {}
    for name, body in probe_bodies().items():
        first = timed(lambda body=body: cold_call(engine, body), device)
        again = timed(lambda body=body: cold_call(engine, body), device)
        found["probes"][name] = {"first_s": first, "again_s": again}
    found["graphs_after"] = len(graphs.captured) if graphs is not None else None
    found["quant"] = engine.quant
    return found


def run_mode(args: argparse.Namespace, mode: str, scratch: Path) -> dict:
    """``mode`` in a child process with a Triton cache of its own under ``scratch`` (or ``--triton-cache``)."""
    out = scratch / f"warmup-{mode}.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--json", str(out)]
    command += ["--work", str(args.work), "--device", args.device, "--quant", args.quant, "--shape", args.shape]
    command += ["--model", args.model] if args.model else []
    command += ["--scaled"] if args.scaled else []
    command += ["--layers", str(args.layers)] if args.layers else []
    cache = args.triton_cache or scratch / f"triton-{mode}"
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
    subprocess.run(command, check=True, env=env, cwd=ROOT)
    return json.loads(out.read_text())


def row(found: dict) -> str:
    probes = found["probes"].values()
    first, again = sum(p["first_s"] for p in probes), sum(p["again_s"] for p in probes)
    graphs = "–" if found["graphs"] is None else f"{found['graphs']} → {found['graphs_after']}"
    peak = "–" if found["peak_gib"] is None else f"{found['peak_gib']:.1f} GiB"
    return (
        f"| {found['mode']} | {found['load_s']:.1f} s | {found['warmup_s']:.1f} s | {found['steps']} | "
        f"{found['passes']} | {graphs} | {peak} | {first:.2f} s | {again:.2f} s | {first - again:.2f} s |"
    )


def report(args: argparse.Namespace, command: str, runs: list[dict]) -> str:
    device = torch.device(args.device)
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_machine()
    model = args.model or model_title(args)
    probes = ", ".join(runs[0]["probes"]) if runs else ""
    lines = [
        f"- command: `{command}`; device: {machine}; torch {torch.__version__}; model: {model}, "
        f"{runs[0]['quant'] if runs else args.quant}",
        "- each mode in a fresh process with an empty Triton cache (unless `--triton-cache`); load: the engine "
        "opened as `spinf-serve serve` opens it; warm-up: `Engine.warmup_steps(mode)` one after another, to the "
        "device's end; graphs: CUDA graphs captured after the warm-up → after the probes",
        f"- probes, each called twice in a row: {probes}; first = the sum of first calls, again = of second calls, "
        "paid = first − again (what the warm-up left for the first calls)",
        "",
        "| mode | load | warm-up | steps | passes | graphs | peak memory | probes, first | probes, again | paid |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(row(found) for found in runs),
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="none,short,full")
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="", help="a model to resolve instead of a written checkpoint (e.g. tiny)")
    p.add_argument("--shape", choices=SHAPES, default="12b")
    p.add_argument("--scaled", action="store_true", help="the shape scaled down (the CPU smoke test)")
    p.add_argument("--layers", type=int, default=None, help="the shape's width with only this many layers")
    p.add_argument("--quant", default="", help="the scheme (default: fp8s for a written checkpoint on a GPU)")
    p.add_argument("--work", type=Path, default=None, help="where the checkpoint goes (default: a temporary one)")
    p.add_argument("--triton-cache", type=Path, default=None, help="one Triton cache for every mode (warm starts)")
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--no-results", action="store_true")
    p.add_argument("--child", choices=warm.MODES, default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.quant and not args.model and args.device.startswith("cuda"):
        args.quant = "fp8s"
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        args.json.write_text(json.dumps(child(args), indent=1))
        return
    command = ("python benchmarks/warmup_modes.py " + " ".join(sys.argv[1:] if argv is None else argv)).strip()
    with work_dir(args.work) as root, tempfile.TemporaryDirectory(prefix="spinf-triton-") as caches:
        if not args.model:
            device = torch.device(args.device)
            folder = write_checkpoint(root, model_config(args), device=device, vision_config=model_vision(args))
            print(f"checkpoint folder {folder.path} ({folder.num_bytes / 2**30:.2f} GiB)", flush=True)
            if folder.on_gpu and args.quant == "fp8s":
                calibrate_folder(folder, root, calibration_corpus(), BENCH_LIMITS)
        args.work = root
        runs = []
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            found = run_mode(args, mode, Path(caches))
            print(row(found), flush=True)
            runs.append(found)
    body = report(args, command, runs)
    print(body)
    if not args.no_results:
        append_section("Load and warm-up under each --warmup mode", body, args.results)


if __name__ == "__main__":
    main()
