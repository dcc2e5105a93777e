"""Issue 5's and 11's measurement: the fp8s engine on the 12B-shaped random model, J1–J4, invariance, the baseline.

Run on the GPU machine: ``python benchmarks/gpu_fast.py [--jobs J1,J2,J3,J4] [--baseline] [--invariance]``.

1. The fp8 GEMM peak of this GPU, measured first (a 16384 × 3840 × 15360 ``_scaled_mm``): the MFU denominator.
2. The 12B shape (engine spec B.19) with random bf16 weights written as a checkpoint folder (`benchmarks.checkpoint`:
   sharded safetensors, ``config.json``, the tiny tokenizer), served as the catalog model
   ``bench/gemma12b-random`` with ``--model-dir`` as ``spinf-serve serve`` would. ``--shape 31b``: the 31B's shape
   instead (`benchmarks.gemma31b`; a ``gemma4`` folder with the vision tower's weights too, 58 GiB in bf16, so give
   ``--work`` a file system with the room), served as ``bench/gemma31b-random``.
3. fp8s: a scale table from `spinf.engine.calibrate` (what ``spinf-serve calibrate`` runs) on the folder in bf16,
   over a synthetic corpus (the first inputs of each job set), shipped in the folder; then an `Engine` in fp8s
   on it, which quantizes layer by layer while loading, as the server does. On the CPU (``--device cpu``) the
   engine loads no fp8s: the fp32 engine's model is quantized in place with the same kind of table, so the
   smoke test still runs the fp8s arithmetic.
4. Warm-up (one small call and one call of each job set: Triton compiles here), timed.
5. Each job set through `Engine.score`, the engine loop every caller uses: questions/s, tokens run (no pads exist
   on this path), MFU = tokens run × 2 × linear parameters / time / fp8 peak, J3's p50 and p99 over 100 calls,
   peak GPU memory.
6. ``--invariance``: every J1 question's log-probs alone, with its input's other questions, as one call per
   input, shuffled, with the floor cache off, and in the same passes as J2; J2 as 256 concurrent calls against J2
   in one call (`benchmarks.invariance`); the number of differing bits is reported.
7. ``--timeline DIR``: one extra call per job set with the host's steps and the device's passes on one clock
   (`benchmarks/timeline.py`): where the device waited for the host.
8. ``--baseline``: the engine is freed and transformers' model with the folder's weights scores the same bodies
   with each content's KV cache reused (`benchmarks.baseline`).

Lines go to stdout and are appended to benchmarks/RESULTS.md (``--results``) as they are measured.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.baseline import BENCH_LIMITS  # noqa: E402
from benchmarks.checkpoint import calibrate_folder, free_memory, open_engine, work_dir  # noqa: E402
from benchmarks.gpu_jobsets import (  # noqa: E402
    RESULTS,
    Bench,
    Report,
    engine_call,
    job_bodies,
    note_row,
    read_jobs,
    setup_text,
)
from benchmarks.gpu_probe import timed  # noqa: E402
from benchmarks.invariance import invariance_lines  # noqa: E402
from benchmarks.shapes import SHAPE_HELP, SHAPES, model_config, model_vision  # noqa: E402
from spinf.engine import hostgc  # noqa: E402
from spinf.engine.engine import Engine  # noqa: E402
from spinf.settings.table import DEFAULT_TOKEN_BUDGET  # noqa: E402


def fp8_peak_tflops(device: torch.device) -> float | None:
    """The fp8 ``_scaled_mm`` rate at 16384 × 3840 × 15360 with bf16 output (the issue's MFU denominator)."""
    if device.type != "cuda":
        return None
    m, k, n = 16384, 3840, 15360
    a = torch.randn(m, k, device=device).clamp(-448, 448).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device=device).clamp(-448, 448).to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=device)
    seconds = timed(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    return 2 * m * k * n / seconds / 1e12


def calibration_corpus() -> list[dict]:
    """The synthetic calibration corpus: the first 4 inputs of J1, J2 and J3, whatever ``--jobs`` says, so
    the scales (and so a recorded parity reference) do not depend on which job sets a run times."""
    corpus = []
    for name in ("J1", "J2", "J3"):
        bodies, _ = job_bodies(name, 4)
        corpus += bodies or []
    return corpus


def live_cuda_tensors(top: int = 6) -> str:
    """The largest CUDA tensors reachable from Python (a memory diagnostic), as one line."""
    seen = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.is_cuda:
                seen[obj.untyped_storage().data_ptr()] = (obj.untyped_storage().nbytes(), tuple(obj.shape), obj.dtype)
        except Exception:  # noqa: BLE001 - objects that are not really tensors
            continue
    biggest = sorted(seen.values(), key=lambda t: -t[0])[:top]
    total = sum(v[0] for v in seen.values()) / 2**30
    return f"{total:.2f} GiB in {len(seen)} storages; largest: " + ", ".join(
        f"{shape} {str(dtype).removeprefix('torch.')} {size / 2**30:.2f} GiB" for size, shape, dtype in biggest
    )


def profile(call, body: dict, path: Path) -> None:
    """One call under torch.profiler; the kernels by total GPU time go to ``path``."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    with profiler(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call(body)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=70)
    path.write_text(table)
    print(table[:6000], flush=True)


def parity(args: argparse.Namespace, engine: Engine, report: Report) -> None:
    """The built-in parity fixture (engine spec B.15) on this engine: recorded, or compared with a recording."""
    from spinf.engine.parity import check_reference, read_fixture, run_parity, write_fixture

    fixture = read_fixture(None)
    reference = read_fixture(args.parity_reference, flag="--parity-reference") if args.parity_reference else None
    if reference is not None:
        check_reference(fixture, reference, "--parity-reference")
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    name = f"12B-shaped random model (seed 0), fp8s from the benchmark's calibration; {gpu}"
    record = name if args.parity_record else None
    found = run_parity(engine.loop, fixture, reference, passes=2, record=record)
    last = found["passes"][-1]
    if args.parity_record:
        write_fixture(found["recorded"], args.parity_record)
    text = (
        f"parity fixture ({len(fixture['jobs'])} jobs): last pass {last['wall_s']:.2f} s, {last['tok_s']:,.0f} tok/s"
    )
    if last.get("parity"):
        text += (
            f"; vs reference: exact share {last['parity']['lp_exact_share']}, max abs {last['parity']['lp_max_abs']}"
        )
    report.line(note_row("parity", text + (f"; recorded to {args.parity_record.name}" if args.parity_record else "")))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", default="J1,J2,J3,J4")
    p.add_argument("--baseline", action="store_true")
    p.add_argument("--baseline-jobs", default="J1,J3")
    p.add_argument("--invariance", action="store_true")
    p.add_argument("--max-alone", type=int, default=None, help="cap the 'alone' calls of the invariance check")
    p.add_argument("--scheme", choices=("fp8s", "bf16"), default="fp8s")
    p.add_argument("--device", default="cuda")
    p.add_argument("--shape", choices=SHAPES, default="12b", help=SHAPE_HELP)
    p.add_argument("--scaled", action="store_true", help="a 2-layer, 64-wide model (smoke test)")
    p.add_argument("--layers", type=int, default=None, help="the shape's width with only this many layers")
    p.add_argument("--work", type=Path, default=None, help="where the checkpoint folder goes (default: temporary)")
    p.add_argument("--token-budget", type=int, default=DEFAULT_TOKEN_BUDGET)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--min-seconds", type=float, default=2.0)
    p.add_argument("--max-seconds", type=float, default=60.0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--max-inputs", type=int, default=None)
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--no-results", action="store_true")
    p.add_argument("--profile", type=Path, default=None, help="profile one call of each job set into this folder")
    p.add_argument("--timeline", type=Path, default=None, help="host/device timeline of one call per job set, here")
    p.add_argument("--parity-record", type=Path, default=None, help="record the built-in parity fixture here")
    p.add_argument("--parity-reference", type=Path, default=None, help="compare the parity fixture with this file")
    args = p.parse_args(argv)
    if args.timeline is not None and not args.device.startswith("cuda"):
        p.error("--timeline times device passes with CUDA events: it needs --device cuda")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    report = Report(None if args.no_results else args.results)
    peak = fp8_peak_tflops(device)
    with work_dir(args.work) as root:
        config, vision = model_config(args), model_vision(args)
        bench = Bench(args, read_jobs(args), device, config, root, report, peak, vision=vision)
        command = "python benchmarks/gpu_fast.py " + " ".join(sys.argv[1:] if argv is None else argv)
        bench.header(
            command.strip(), f"`Engine.score` (the engine loop every caller uses), {args.scheme}", "fp8 `_scaled_mm`"
        )
        engine_part(args, bench)  # its engine is freed when it returns
        free_memory()
        if args.baseline:
            bench.jobs = {k: v for k, v in bench.jobs.items() if k in args.baseline_jobs.split(",")}
            bench.run_baseline()


def load_engine(args: argparse.Namespace, bench: Bench) -> tuple[Engine, str]:
    """The engine on the run's folder in ``args.scheme`` (calibrated first for fp8s), and a setup note."""
    folder = bench.folder()
    note = ""
    if args.scheme == "fp8s":
        corpus = calibration_corpus()
        table, seconds = calibrate_folder(folder, bench.root, corpus, BENCH_LIMITS)
        note = f"; calibrated on {len(corpus)} bodies (the first 4 inputs of J1, J2 and J3) in {seconds:.1f} s"
    started = time.perf_counter()
    engine = open_engine(folder, bench.root, quant=args.scheme, limits=BENCH_LIMITS, token_budget=args.token_budget)
    if args.scheme == "fp8s" and not folder.on_gpu:
        engine.model.to_fp8s(table["scales"])  # the CPU engine loads no fp8s: the same arithmetic, quantized here
    return engine, setup_text(folder, time.perf_counter() - started) + note


def engine_part(args: argparse.Namespace, bench: Bench) -> None:
    """Calibrate and load the engine, warm it up, time the job sets, check parity and invariance."""
    device, jobs, report = bench.device, bench.jobs, bench.report
    engine, setup = load_engine(args, bench)
    free_memory()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    weights_gib = torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    warm = warm_up(engine, jobs, device)
    text = f"{setup}; weights resident {weights_gib:.2f} GiB; warm-up (one call of each job set) {warm:.1f} s"
    report.line(note_row("setup", text))
    if device.type == "cuda":
        print("live after warm-up:", live_cuda_tensors(), flush=True)
    extra_calls(args, engine, jobs)
    bench._run_jobs(lambda body: engine_call(engine, body), f"engine, {args.scheme}")
    if args.parity_record or args.parity_reference:
        parity(args, engine, report)
    if args.invariance and "J1" in jobs:
        j2 = jobs.get("J2", [None])[0]
        for job, line in invariance_lines(engine, jobs["J1"][0], j2, args.max_alone):
            report.line(note_row(job, line))


def warm_up(engine: Engine, jobs: dict[str, list[dict]], device: torch.device) -> float:
    """One small call, then one call of each job set's first body (every kernel shape compiles here), then the
    heap frozen as the server freezes it once warm; the seconds it took."""
    started = time.perf_counter()
    first = next(iter(jobs.values()))[0]
    engine_call(engine, {**first, "inputs": first["inputs"][:1]} if "inputs" in first else first)
    for bodies in jobs.values():
        engine_call(engine, bodies[0])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    hostgc.settle()
    return seconds


def extra_calls(args: argparse.Namespace, engine: Engine, jobs: dict[str, list[dict]]) -> None:
    """``--profile`` and ``--timeline``: one more call of each job set, profiled or on a host/device timeline."""
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        for name, bodies in jobs.items():
            profile(lambda body: engine_call(engine, body), bodies[0], args.profile / f"{name}.txt")
    if args.timeline is not None:
        from benchmarks.timeline import Timeline

        args.timeline.mkdir(parents=True, exist_ok=True)
        for name, bodies in jobs.items():
            with Timeline(engine.scorer) as timeline:
                engine_call(engine, bodies[0])
            text = timeline.report(name)
            (args.timeline / f"{name}.txt").write_text(text + "\n")
            lines = text.splitlines()
            print(
                "\n".join(lines[:1] + [line for line in lines if line.lstrip().startswith(("gap", "tail"))]),
                flush=True,
            )


if __name__ == "__main__":
    main()
