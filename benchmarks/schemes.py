"""Issue 12 item 4's measurement: the Gemma schemes of engine spec B.8 on the 12B-shaped random model, in one command.

Run on the GPU machine: ``python benchmarks/schemes.py [--schemes bf16,fp8s,fp8,fp8row,w8a16,w8a8] [--heads …]
[--work DIR]``. In order, each line printed and appended to benchmarks/RESULTS.md (``--results``) as it is measured:

1. The row-invariance probe (``--no-probe`` skips it): for each 12B linear shape (q/k/v and gate/up fused), whether
   every output row of each scheme's GEMM is bit-identical to the same row inside an 8,192-row product, by row count
   M and offset, as benchmarks/gpu_probe.py does for the per-tensor fp8 product. Rows: fp8s with per-tensor weight
   scales; fp8s with per-row weight scales (a fused weight's q/k/v each their own scale: the row-wise
   ``_scaled_mm`` of `spinf.engine.quant.fp8_matmul`, the product an fp8-static checkpoint and a bf16 one quantized
   at load both run); the candidate fallback for it (per-tensor ``_scaled_mm`` with fp32 output, then the row
   scales, then bf16); fp8row, w8a16 and w8a8 as `spinf.engine.schemes` runs them. With each, the time of one
   16384-row product of the gate/up shape (3840 → 30720), its input's quantization included.
2. The checkpoint folder (`benchmarks.checkpoint`: the 12B shape, random bf16 weights, sharded safetensors) and an
   fp8s scale table shipped in it (`spinf.engine.calibrate` over the first inputs of J1–J3).
3. Per scheme, an `Engine` on the folder as ``spinf-serve serve bench/gemma12b-random --model-dir … --quant …``
   opens it (the manifest here allows every Gemma scheme), warmed on J1's first inputs and one call of each job,
   then J1 and J2 one call each (``--rounds``) and J3 one call after another (``--latency-calls``): questions/s,
   MFU against the fp8 ``_scaled_mm`` peak measured first, peak memory, and the largest |Δ log-prob| of J1's and
   J2's answers against the first scheme's (bf16 by default: the random model's float reference on a GPU).
4. ``--heads``: under ``--head-scheme`` (fp8s), each LM-head mode (engine spec B.7) on J1 and J3, with the same
   figures and |Δ log-prob| against f32out.

On the CPU (``--device cpu --scaled``, the smoke test) the folder is fp32 and opened by its path, every scheme runs
emulated, and the probe runs the emulations on small shapes (row-stable by construction; the fallback row needs
CUDA). ``--json`` gets every figure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.baseline import BENCH_LIMITS  # noqa: E402
from benchmarks.checkpoint import (  # noqa: E402
    Folder,
    calibrate_folder,
    free_memory,
    work_dir,
    write_checkpoint,
    write_manifest,
)
from benchmarks.gemma12b import decoder_linear_params  # noqa: E402
from benchmarks.gpu_fast import calibration_corpus, fp8_peak_tflops  # noqa: E402
from benchmarks.gpu_jobsets import (  # noqa: E402
    Report,
    engine_call,
    job_bodies,
    max_difference,
    measure,
    note_row,
    row,
    small,
)
from benchmarks.results import RESULTS, revision  # noqa: E402
from benchmarks.scheme_probe import probe_lines  # noqa: E402
from benchmarks.shapes import model_config, model_title  # noqa: E402
from spinf.catalog.manifest import GEMMA_SCHEMES  # noqa: E402
from spinf.engine.engine import Engine  # noqa: E402
from spinf.engine.head import HEAD_MODES  # noqa: E402

SCHEMES = ("bf16", "fp8s", "fp8", "fp8row", "w8a16", "w8a8")
JOBS = ("J1", "J2", "J3")
ALLOWED = 'allowed = ["fp8s", "bf16"]'  # what the benchmarks' manifest allows (benchmarks.checkpoint), widened here


def widened_manifest(root: Path, folder: Folder) -> Path:
    """The folder of ``folder``'s manifest (`benchmarks.checkpoint.write_manifest`) with every Gemma scheme allowed."""
    manifests = write_manifest(root, folder)
    manifest = manifests / "bench.toml"
    text = manifest.read_text()
    if ALLOWED not in text:
        raise RuntimeError(f"{manifest} does not say {ALLOWED}: benchmarks/schemes.py widens that line")
    manifest.write_text(text.replace(ALLOWED, f"allowed = {json.dumps(list(GEMMA_SCHEMES))}"))
    return manifests


def open_scheme(folder: Folder, root: Path, scheme: str, lm_head: str = "f32out") -> Engine:
    """The engine on ``folder`` in ``scheme``: its catalog model (`benchmarks.checkpoint.write_manifest`, every Gemma
    scheme allowed) with ``--model-dir`` on a GPU, the folder by its path on the CPU (every scheme emulated there)."""
    if not folder.on_gpu:
        return Engine(str(folder.path), device="cpu", quant=scheme, limits=BENCH_LIMITS, lm_head=lm_head)
    os.environ["SPINF_MANIFEST_DIRS"] = str(widened_manifest(root, folder))
    model = folder.model_id
    return Engine(model, device="cuda", quant=scheme, model_dir=str(folder.path), limits=BENCH_LIMITS, lm_head=lm_head)


class Run:
    def __init__(self, args: argparse.Namespace, root: Path, folder: Folder, report: Report, peak: float | None):
        self.args, self.root, self.folder, self.report, self.peak = args, root, folder, report, peak
        self.device = torch.device(args.device)
        self.flops_per_token = 2 * decoder_linear_params(model_config(args))
        self.bodies = {name: job_bodies(name, args.max_inputs if name != "J3" else None)[0][0] for name in JOBS}
        self.figures: dict = {"folder": {"bytes": folder.num_bytes, "write_s": folder.write_s}, "schemes": {}}
        self.reference: dict[str, list] = {}  # J1 and J2 log-probs of the first scheme run

    def line(self, job: str, text: str) -> None:
        self.report.line(note_row(job, text))


def header(run: Run, command: str) -> None:
    args, device = run.args, run.device
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    peak = f"{run.peak:.0f} TFLOP/s" if run.peak else "not measured"
    served = (
        f"the catalog model {run.folder.model_id} (--model-dir), bf16 weights quantized at load"
        if run.folder.on_gpu
        else "the fp32 folder by its path, every scheme emulated on the CPU (the smoke test)"
    )
    run.report.line(
        f"\n## The Gemma schemes (engine spec B.8) on {model_title(args)} — {datetime.date.today().isoformat()}, "
        f"revision {revision()}\n\n"
        f"- command: `{command}`; device: {gpu}; torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"Python {platform.python_version()}\n"
        f"- one checkpoint folder for every scheme: random weights, {decoder_linear_params(model_config(args)):,} "
        f"decoder linear parameters; served as {served}; bodies: fixtures/jobsets j1, j2, j3 (tiny tokenizer ids)\n"
        f"- MFU: tokens run × 2 × linear parameters / time / the fp8 `_scaled_mm` peak measured in this run ({peak});"
        " times are medians of timed rounds after a warm-up call of each body; Δ log-prob: the largest absolute "
        f"difference of J1's and J2's option log-probs against the first scheme run ({args.schemes.split(',')[0]})\n"
    )


def probe(run: Run) -> None:
    run.report.line(
        "Row invariance (the probe): the row counts M at which some row of the product of M rows, at offsets 0, 3, "
        "128 and 1000, differs from the same row of the 8,192-row product ('none': every row the same at every M); "
        "and one 16384-row product of the gate/up shape, its input's quantization included:\n"
    )
    for text in probe_lines(run.device, small=run.args.scaled):
        run.report.line(text)
    run.report.line("")


def table_head(run: Run) -> None:
    run.report.line(
        "| job | runner | questions | time | questions/s | tokens run | passes | peak memory | MFU |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )


def prepare(run: Run) -> None:
    folder = run.folder
    written = f"written in {folder.write_s:.1f} s" if folder.write_s else "found"
    if "fp8s" not in run.args.schemes.split(",") and not run.args.heads:
        run.line("setup", f"checkpoint folder {folder.num_bytes / 2**30:.2f} GiB {written}")
        return
    corpus = calibration_corpus()
    _, seconds = calibrate_folder(folder, run.root, corpus, BENCH_LIMITS)
    run.line(
        "setup",
        f"checkpoint folder {folder.num_bytes / 2**30:.2f} GiB {written}; fp8s scale table from {len(corpus)} bodies "
        f"(the first 4 inputs of J1, J2 and J3) in {seconds:.1f} s, load included",
    )


def one_scheme(run: Run, scheme: str, lm_head: str, jobs: tuple[str, ...], against: str | None) -> dict:
    """One engine: loaded, warmed, each job measured; its figures (and, for the first run, the reference)."""
    started = time.perf_counter()
    engine = open_scheme(run.folder, run.root, scheme, lm_head)
    load_s, idle = time.perf_counter() - started, engine.idle_gib()
    started = time.perf_counter()
    engine_call(engine, small(run.bodies["J1"]))
    for name in jobs:
        engine_call(engine, run.bodies[name])
    runner = f"{scheme}" + (f", lm-head {lm_head}" if lm_head != "f32out" else "")
    run.line(
        "setup",
        f"{runner}: loaded in {load_s:.1f} s ({idle:.1f} GiB idle), warm-up {time.perf_counter() - started:.1f} s; "
        f"{engine.info()['lm_head']} head; batch-invariant: {engine.batch_invariant}",
    )
    found, limits = {"load_s": load_s, "idle_gib": idle}, (run.args.min_seconds, run.args.max_seconds)
    for name in jobs:
        rounds = run.args.latency_calls if name == "J3" else run.args.rounds
        m = measure(lambda body: engine_call(engine, body), [run.bodies[name]], run.device, rounds, limits)
        run.report.line(row(name, runner, m, run.flops_per_token, run.peak))
        lat = m["latencies"]
        found[name] = {
            "questions_per_s": m["questions"] / m["seconds"],
            "seconds": m["seconds"],
            "peak_gib": m["peak_gib"],
            "p50_ms": lat[len(lat) // 2] * 1000,
            "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1000,
        }
        if name != "J3":
            key = ("head", name) if against == "head" else name
            if key not in run.reference:
                run.reference[key] = m["logprobs"]
            else:
                found[name]["max_dlogprob"] = max_difference(run.reference[key], m["logprobs"])
    deltas = {n: found[n]["max_dlogprob"] for n in jobs if "max_dlogprob" in found.get(n, {})}
    if deltas:
        base = "f32out" if against == "head" else run.args.schemes.split(",")[0]
        text = ", ".join(f"{n} {d:.3g}" for n, d in deltas.items())
        run.line("Δ", f"{runner} against {base}: max abs Δ log-prob {text}")
    return found


def schemes(run: Run) -> None:
    for scheme in run.args.schemes.split(","):
        try:
            run.figures["schemes"][scheme] = one_scheme(run, scheme, "f32out", JOBS, "scheme")
        except (RuntimeError, ValueError) as exc:  # a scheme this GPU or build refuses; torch's OOM is one too
            run.line(scheme, f"{scheme} failed: {type(exc).__name__}: {exc}")
        free_memory()


def heads(run: Run) -> None:
    scheme = run.args.head_scheme
    for mode in ["f32out", *(m for m in run.args.heads.split(",") if m != "f32out")]:
        try:
            found = one_scheme(run, scheme, mode, ("J1", "J3"), "head")
        except (RuntimeError, ValueError) as exc:
            run.line(mode, f"{scheme}, lm-head {mode} failed: {type(exc).__name__}: {exc}")
            continue
        run.figures.setdefault("heads", {})[mode] = found
        free_memory()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--scaled", action="store_true", help="a 2-layer, 64-wide model (the CPU smoke test)")
    p.add_argument("--layers", type=int, default=None, help="the 12B width with only this many layers")
    p.add_argument("--schemes", default=",".join(SCHEMES), help="in order; the first is the Δ reference")
    p.add_argument("--heads", default="bf16,fp32", help=f"LM-head modes beside f32out (of {', '.join(HEAD_MODES)})")
    p.add_argument("--head-scheme", default="fp8s", help="the scheme the head modes run under")
    p.add_argument("--no-probe", action="store_true", help="skip the row-invariance probe")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds of J1 and J2")
    p.add_argument("--latency-calls", type=int, default=100, help="timed J3 calls, one after another")
    p.add_argument("--min-seconds", type=float, default=0.0)
    p.add_argument("--max-seconds", type=float, default=60.0)
    p.add_argument("--max-inputs", type=int, default=None, help="keep the first N inputs of J1 and J2")
    p.add_argument("--work", type=Path, default=None, help="where the folder goes (default: a temporary one)")
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--no-results", action="store_true")
    p.add_argument("--json", type=Path, default=None, help="every figure, as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    report = Report(None if args.no_results else args.results)
    peak = fp8_peak_tflops(device)
    with work_dir(args.work) as root:
        folder = write_checkpoint(root, model_config(args), device=device)
        run = Run(args, root, folder, report, peak)
        header(run, ("python benchmarks/schemes.py " + " ".join(sys.argv[1:] if argv is None else argv)).strip())
        if not args.no_probe:
            probe(run)
        table_head(run)
        prepare(run)
        schemes(run)
        if args.heads:
            heads(run)
        if args.json is not None:
            args.json.write_text(json.dumps(run.figures, indent=1))


if __name__ == "__main__":
    main()
