"""The job sets J1–J4 on the 12B-shaped random model in bf16, and optionally the baseline (shared pieces too).

Run on the GPU machine: ``python benchmarks/gpu_jobsets.py [--jobs J1,J2,J3,J4] [--baseline]``. It writes the 12B
shape of engine spec B.19 with random weights as a checkpoint folder (`benchmarks.checkpoint`: sharded bf16
safetensors, ``config.json``, a tokenizer), opens an `Engine` on it in bf16 as ``spinf-serve serve --model-dir``
would, and scores each job set with `Engine.score`, through the engine loop every caller uses (the fp8s
measurement of issue 5 is benchmarks/gpu_fast.py, which reuses this module's pieces). With ``--baseline`` it frees
the engine, builds transformers' model with the folder's weights and times `benchmarks.baseline` on the same
bodies. Token ids come from the built-in tiny tokenizer (8,192 ids, all valid in the 262,144-id vocabulary), so
the job sets' token counts are the tiny tokenizer's, not the real 12B tokenizer's.

Each job's line is printed, and appended to benchmarks/RESULTS.md (``--results``), as soon as it is measured, so a
run cut short keeps what it measured. Per job: questions, seconds (median of the timed rounds), questions/s,
tokens run (the engine's packed tokens; the baseline's content and padded question rows), passes, peak GPU memory,
and MFU against the bf16 GEMM peak measured in the same run. ``GIT_SHA`` names the revision where the working
tree has no git history. Smoke test on a CPU: ``python benchmarks/gpu_jobsets.py --device cpu --scaled`` (fp32: the
CPU engine opens the folder by its path).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from importlib import resources
from pathlib import Path

import attrs
import torch
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import jobsets  # noqa: E402
from benchmarks.baseline import BENCH_LIMITS, DEFAULT_BATCH, run_baseline_stats  # noqa: E402
from benchmarks.checkpoint import Folder, free_memory, open_engine, text_state, work_dir, write_checkpoint  # noqa: E402
from benchmarks.gemma12b import build_random_transformers_model, decoder_linear_params  # noqa: E402
from benchmarks.results import RESULTS, revision  # noqa: E402
from benchmarks.shapes import SHAPE_HELP, SHAPES, model_config, model_title, model_vision  # noqa: E402
from spinf.engine.engine import Engine  # noqa: E402
from spinf.engine.tokenizer import TextTokenizer  # noqa: E402
from spinf.errors import SpinfError  # noqa: E402
from spinf.protocol.request import parse_score_request  # noqa: E402
from spinf.settings.table import DEFAULT_TOKEN_BUDGET  # noqa: E402

MAX_ROUNDS = 50  # short jobs repeat until --min-seconds are measured, up to this many rounds
LATENCY_ROUNDS = {"J3": 100}  # j3 is the latency job: 100 calls of one body (benchmarks/jobsets.py)


@attrs.frozen
class Call:
    seconds: float
    questions: int
    tokens: int
    passes: int
    logprobs: list  # per input, per query, per combination, per option
    busy: float | None = None  # seconds the device was busy (the engine's CUDA events), where known


def tiny_tokenizer() -> TextTokenizer:
    text = (resources.files("spinf.catalog") / "tiny_gemma4" / "tokenizer.json").read_text()
    return TextTokenizer(Tokenizer.from_str(text))


def as_bodies(loaded) -> list[dict]:
    """A job set as a list of ``/v1/score`` bodies, whichever form `load_jobset` gives it in."""
    if isinstance(loaded, dict) and ("inputs" in loaded or "messages" in loaded):
        return [loaded]
    if isinstance(loaded, dict) and isinstance(loaded.get("bodies"), list):
        return loaded["bodies"]
    if isinstance(loaded, list | tuple) and all(isinstance(b, dict) for b in loaded):
        return list(loaded)
    raise ValueError(f"cannot read a job set of type {type(loaded).__name__}")


def job_bodies(name: str, max_inputs: int | None) -> tuple[list[dict] | None, str]:
    """The job set's bodies (None: skipped) and a note on where they came from."""
    load = getattr(jobsets, "load_jobset", None)
    try:
        found = as_bodies(load(name.lower())) if load else None  # the fixtures are named j1.json … j4.json
        bodies, note = (found, "") if load else (None, "benchmarks.jobsets.load_jobset is missing")
    except (OSError, KeyError, ValueError) as exc:
        bodies, note = None, f"load_jobset({name!r}) failed: {exc}"
    if bodies is None and name == "J1":
        bodies, note = [jobsets.j1_body()], f"{note}; J1 from benchmarks.jobsets.j1_body()"
    if bodies is not None and max_inputs:
        bodies = [{**b, "inputs": b["inputs"][:max_inputs]} if "inputs" in b else b for b in bodies]
    return bodies, note


def parse_body(body: dict):
    """A job-set body parsed as a trusted call with the benchmarks' limits (`BENCH_LIMITS`)."""
    return parse_score_request(body, limits=BENCH_LIMITS, trusted=True)


def response_logprobs(results: list[dict]) -> list:
    """A response's option log-probs: per input, per query, per combination, per option."""
    return [[[[o["logprob"] for o in c["options"]] for c in q["combinations"]] for q in r["queries"]] for r in results]


def engine_call(engine: Engine, body: dict) -> Call:
    """One body through `Engine.score` (trusted, so the benchmarks' content limit holds), with the tokens, passes
    and device time the engine loop ran for it."""
    before = engine.loop.statistics()
    started = time.perf_counter()
    response = engine.score(body, trusted=True)
    seconds = time.perf_counter() - started
    after = engine.loop.statistics()
    logprobs = response_logprobs(response["results"])
    questions = sum(len(q) for per_input in logprobs for q in per_input)
    return Call(
        seconds,
        questions,
        after.packed_tokens - before.packed_tokens,
        after.passes - before.passes,
        logprobs,
        after.busy_s - before.busy_s,
    )


def baseline_call(model, tokenizer: TextTokenizer, batch: int, body: dict) -> Call:
    logprobs, stats, seconds = run_baseline_stats(model, tokenizer, body, batch)
    questions = sum(len(q) for per_input in logprobs for q in per_input)
    return Call(seconds, questions, stats.tokens, stats.passes, logprobs)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(call, bodies: list[dict], device: torch.device, repeats: int, seconds: tuple[float, float]) -> dict:
    """Rounds over every body: at least one; ``repeats``, or more until ``seconds[0]`` are measured (latency
    percentiles need calls); none that would end after ``seconds[1]``. Returns the median round time and a round's
    counts, call latencies, peak memory and the last round's log-probs."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    (min_seconds, max_seconds), rounds, latencies, started = seconds, [], [], time.perf_counter()
    busy: list[float] = []
    while True:
        calls = [call(body) for body in bodies]
        sync(device)
        rounds.append(sum(c.seconds for c in calls))
        busy.append(sum(c.busy or 0.0 for c in calls))
        latencies += [c.seconds for c in calls]
        elapsed = time.perf_counter() - started
        wanted = len(rounds) < repeats or (elapsed < min_seconds and len(rounds) < MAX_ROUNDS)
        if not wanted or elapsed + rounds[-1] > max_seconds:
            break
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {
        "seconds": statistics.median(rounds),
        "busy": statistics.median(busy),
        "rounds": len(rounds),
        "latencies": sorted(latencies),
        "questions": sum(c.questions for c in calls),
        "tokens": sum(c.tokens for c in calls),
        "passes": sum(c.passes for c in calls),
        "peak_gib": peak,
        "logprobs": [c.logprobs for c in calls],
    }


def bf16_peak_tflops(device: torch.device) -> float | None:
    """The bf16 GEMM rate at 16384 x 3840 x 15360 on this GPU (the MFU denominator of a bf16 run)."""
    if device.type != "cuda":
        return None
    from benchmarks.gpu_probe import timed

    m, k, n = 16384, 3840, 15360
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
    seconds = timed(lambda: a @ b)
    return 2 * m * k * n / seconds / 1e12


def row(job: str, runner: str, m: dict, flops_per_token: float, peak_tflops: float | None) -> str:
    seconds = m["seconds"]
    latency = ""
    if len(m["latencies"]) >= 10:
        lat = m["latencies"]
        latency = (
            f"; calls p50 {lat[len(lat) // 2] * 1000:.0f} ms, p99 {lat[int(0.99 * (len(lat) - 1))] * 1000:.0f} ms"
        )
    mfu = f"{m['tokens'] * flops_per_token / seconds / (peak_tflops * 1e12):.1%}" if peak_tflops else "–"
    peak = f"{m['peak_gib']:.1f} GiB" if m["peak_gib"] is not None else "–"
    busy = f"; GPU busy {m['busy']:.3f} s" if m.get("busy") else ""
    return (
        f"| {job} | {runner} | {m['questions']:,} | {seconds:.3f} s ({m['rounds']} rounds{latency}{busy}) | "
        f"{m['questions'] / seconds:,.0f} | {m['tokens']:,} | {m['passes']:,} | {peak} | {mfu} |"
    )


def note_row(job: str, text: str) -> str:
    return "| " + " | ".join([job, " ".join(text.split())] + [""] * 7) + " |"


def max_difference(a, b) -> float:
    """Largest |a - b| over two nested lists of the same shape (NaN where the shapes differ)."""
    if isinstance(a, list | tuple):
        if not isinstance(b, list | tuple) or len(a) != len(b):
            return float("nan")
        return max((max_difference(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    return abs(a - b)


class Report:
    """Prints lines and appends them to the results file as they come."""

    def __init__(self, path: Path | None):
        self.path = path

    def line(self, text: str) -> None:
        print(text, flush=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(text + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", default="J1,J2,J3,J4", help="comma-separated job sets (default: J1,J2,J3,J4)")
    p.add_argument("--baseline", action="store_true", help="also time the transformers baseline")
    p.add_argument("--device", default="cuda")
    p.add_argument("--shape", choices=SHAPES, default="12b", help=SHAPE_HELP)
    p.add_argument("--scaled", action="store_true", help="a 2-layer, 64-wide model of the same architecture")
    p.add_argument("--layers", type=int, default=None, help="the shape's width with only this many layers")
    p.add_argument(
        "--work", type=Path, default=None, help="where the checkpoint folder goes (default: a temporary one)"
    )
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="baseline question batch (default 64)")
    p.add_argument("--token-budget", type=int, default=DEFAULT_TOKEN_BUDGET)
    p.add_argument("--repeats", type=int, default=3, help="timed rounds per job (median; default 3)")
    p.add_argument("--min-seconds", type=float, default=2.0, help="repeat short jobs until this long (default 2)")
    p.add_argument("--max-seconds", type=float, default=120.0, help="stop repeating a job after this long")
    p.add_argument("--max-inputs", type=int, default=None, help="keep only the first N inputs of each body")
    p.add_argument("--results", type=Path, default=RESULTS, help="the file the section is appended to")
    p.add_argument("--no-results", action="store_true", help="print only")
    return p.parse_args(argv)


def small(body: dict) -> dict:
    """The first two inputs of a body: the warm-up call."""
    return {**body, "inputs": body["inputs"][:2]} if "inputs" in body else body


@attrs.define
class Bench:
    args: argparse.Namespace
    jobs: dict[str, list[dict]]
    device: torch.device
    config: dict
    root: Path  # the checkpoint folder goes here (`benchmarks.checkpoint.write_checkpoint`)
    report: Report
    peak_tflops: float | None
    engine_logprobs: dict = attrs.field(factory=dict)
    vision: dict | None = None  # the vision tower written beside the text model (`model_vision`)

    @property
    def flops_per_token(self) -> float:
        return 2 * decoder_linear_params(self.config)

    def folder(self) -> Folder:
        """The run's checkpoint folder: written the first time, found after that."""
        return write_checkpoint(self.root, self.config, device=self.device, vision_config=self.vision)

    def header(self, command: str, engine: str, peak_name: str = "bf16 GEMM") -> None:
        import transformers

        device = self.device
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
        peak = f"{self.peak_tflops:.0f} TFLOP/s" if self.peak_tflops else "not measured"
        dtype = "bfloat16" if device.type == "cuda" else "float32"
        self.report.line(
            f"\n## Job sets on {model_title(self.args)} — {datetime.date.today().isoformat()}, "
            f"revision {revision()}\n\n"
            f"- command: `{command}`; device: {gpu}; torch {torch.__version__}, CUDA {torch.version.cuda}, "
            f"transformers {transformers.__version__}, Python {platform.python_version()}\n"
            f"- model: random weights in {dtype}, {decoder_linear_params(self.config):,} decoder linear parameters, "
            "written as a checkpoint folder (sharded safetensors, config.json, tokenizer) and loaded from it; "
            f"runner: {engine}; tokens run are real tokens (this engine runs no pad rows)\n"
            f"- token ids from the tiny tokenizer (8,192 ids, valid in the {self.config['vocab_size']:,}-id "
            f"vocabulary), so counts are the tiny tokenizer's; engine token budget {self.args.token_budget:,}; "
            f"baseline batch {self.args.batch}; content limit {BENCH_LIMITS.max_content_tokens:,} tokens\n"
            f"- MFU: tokens run × 2 × linear parameters / time / the {peak_name} peak measured in this run "
            f"({peak})\n\n"
            "| job | runner | questions | time | questions/s | tokens run | passes | peak memory | MFU |\n"
            "|---|---|---|---|---|---|---|---|---|"
        )

    def run_engine(self) -> None:
        self._engine_jobs()
        free_memory()  # the engine went with the call's frame; its memory goes before the baseline's model comes

    def _engine_jobs(self) -> None:
        folder = self.folder()
        started = time.perf_counter()
        quant = "bf16" if folder.on_gpu else "fp32"
        engine = open_engine(folder, self.root, quant=quant, limits=BENCH_LIMITS, token_budget=self.args.token_budget)
        self.report.line(note_row("setup", setup_text(folder, time.perf_counter() - started)))
        self._run_jobs(lambda body: engine_call(engine, body), f"engine, {engine.quant}")

    def run_baseline(self) -> None:
        started = time.perf_counter()
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        state = text_state(self.folder().path)
        model = build_random_transformers_model(self.device, dtype, config=self.config, state=state)
        del state
        print(f"transformers model loaded from the folder in {time.perf_counter() - started:.1f} s", flush=True)
        self._run_jobs(lambda body: baseline_call(model, tiny_tokenizer(), self.args.batch, body), "baseline")

    def _run_jobs(self, call, runner: str) -> None:
        warm = False
        for name, bodies in self.jobs.items():
            try:
                if not warm:
                    call(small(bodies[0]))  # warm-up on the first two inputs of the first job
                    warm = True
                limits = (self.args.min_seconds, self.args.max_seconds)
                rounds = max(self.args.repeats, LATENCY_ROUNDS.get(name, 0))
                m = measure(call, bodies, self.device, rounds, limits)
            except (SpinfError, ValueError, RuntimeError) as exc:  # torch.OutOfMemoryError is a RuntimeError
                self.report.line(note_row(name, f"{runner} failed: {type(exc).__name__}: {exc}"))
                continue
            self.report.line(row(name, runner, m, self.flops_per_token, self.peak_tflops))
            if runner == "baseline" and name in self.engine_logprobs:
                diff = max_difference(self.engine_logprobs[name], m["logprobs"])
                self.report.line(note_row(name, f"engine vs baseline, same weights: max abs Δ logprob {diff:.3g}"))
            elif runner != "baseline":
                self.engine_logprobs[name] = m["logprobs"]


def setup_text(folder: Folder, load_s: float) -> str:
    written = f"written in {folder.write_s:.1f} s" if folder.write_s else "written earlier in this run"
    return f"checkpoint folder {folder.num_bytes / 2**30:.2f} GiB {written}; engine loaded in {load_s:.1f} s"


def read_jobs(args: argparse.Namespace) -> dict[str, list[dict]]:
    jobs = {}
    for name in [j.strip() for j in args.jobs.split(",") if j.strip()]:
        bodies, note = job_bodies(name, args.max_inputs)
        if note:
            print(f"{name}: {note}" + ("" if bodies is not None else "; skipped"), flush=True)
        if bodies is not None:
            jobs[name] = bodies
    return jobs


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    with work_dir(args.work) as root:
        bench = Bench(
            args,
            read_jobs(args),
            device,
            model_config(args),
            root,
            Report(None if args.no_results else args.results),
            bf16_peak_tflops(device),
            vision=model_vision(args),
        )
        command = ("python benchmarks/gpu_jobsets.py " + " ".join(sys.argv[1:] if argv is None else argv)).strip()
        bench.header(command, "`Engine.score` (the engine loop every caller uses)")
        bench.run_engine()
        if args.baseline:
            bench.run_baseline()


if __name__ == "__main__":
    main()
