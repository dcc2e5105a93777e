"""The reference engine, spinf-serve 0.1.1, in-process on a checkpoint folder: job sets as one call each, timed.

Run by ``benchmarks/versus.py`` in a process of its own, so its GPU memory goes with it; by hand:
``python benchmarks/reference.py --folder DIR --scales FILE --body J1=j1.json --body J2=j2.json --json OUT``
(``--body NAME=FILE``: a ``/v1/score`` body; by default J1 and J2 from fixtures/jobsets). The reference must be
importable (its wheel installed, or ``PYTHONPATH`` at an unpacked copy); nothing here imports spinf.

How it is run, from its own API (``spinf_serve/service.py``, ``config.py``, ``protocol.py``):

- ``ScoreService(EngineConfig(model_dir=FOLDER, quant="fp8s", model_id=MODEL_ID, served_model=MODEL_ID,
  media=False, warmup="none"))``, ``.load()``, ``.warmup()``, then ``.score_request(protocol.ScoreRequest)`` with
  the job-set body as it is plus ``model``; the default token budget (16,384) and content limit (4,096) as ours.
- fp8s reads a scale table at ``spinf_serve/quant/tables/<model_id>/<revision>.json``, the revision of a plain
  folder being its name. ``--scales`` is ours for the same folder (`benchmarks.checkpoint.reference_scales`: the
  same numbers under its unfused linears' names), written there before the load, so both engines quantize every
  activation with the same scale. The table it ships for google/gemma-4-12B was calibrated on the real weights and
  does not fit random ones.
- warm-up ``none`` and then one call of each job set before timing: its own ``full`` warm-up also compiles the
  extraction decoder, which these jobs never use. Its decoder layers are ``torch.compile``d (its default).

Each timed round is one ``score_request`` call; the median of ``--rounds`` rounds is reported, with the
questions, packed tokens, GPU-busy seconds and peak memory the reference itself reports for the call.
``--dry-run`` only loads the tokenizer and compiles the requests (no GPU): what would run, in tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOBSETS = ROOT / "fixtures" / "jobsets"
MODEL_ID = "bench/gemma12b-random"  # benchmarks.checkpoint.MODEL_ID, spelled out: this file imports no spinf


def request(protocol, body: dict):
    """The reference's request for a job-set body."""
    return protocol.ScoreRequest.model_validate({"model": MODEL_ID, **body})


def questions(out: dict) -> int:
    return sum(len(q["combinations"]) for r in out["results"] for q in r["queries"])


def logprobs(out: dict) -> list:
    """Per input, per query, per combination, per option: the log-probs (the order of ours)."""
    return [
        [[[o["logprob"] for o in c["options"]] for c in q["combinations"]] for q in r["queries"]]
        for r in out["results"]
    ]


def install_table(folder: Path, scales_path: Path) -> Path:
    """Our scales where the reference looks for the folder's table."""
    from spinf_serve.quant import TABLES_DIR

    target = Path(TABLES_DIR) / MODEL_ID.replace("/", "__") / f"{folder.name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    scales = json.loads(scales_path.read_text())
    target.write_text(json.dumps({"scales": scales, "source": "benchmarks/versus.py (ours, renamed)"}))
    return target


def dry_run(args: argparse.Namespace, bodies: dict[str, dict]) -> dict:
    from spinf_serve import compiler, protocol
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.folder))
    found = {}
    for name, body in bodies.items():
        compiled = compiler.compile_request(request(protocol, body), tok, 16_384, None, 65_536, True, frozenset())
        found[name] = {
            "processed_tokens": compiled.processed_tokens,
            "content_tokens": compiled.usage["content_tokens"],
        }
        print(f"{name}: {found[name]}", flush=True)
    return {"dry_run": found}


def run(args: argparse.Namespace, bodies: dict[str, dict]) -> dict:
    from importlib import metadata

    import torch
    from spinf_serve import protocol
    from spinf_serve.config import EngineConfig
    from spinf_serve.service import ScoreService

    table = install_table(args.folder, args.scales)
    config = EngineConfig(
        served_model=MODEL_ID, model_id=MODEL_ID, model_dir=str(args.folder), quant="fp8s", media=False, warmup="none"
    )
    service = ScoreService(config, "cuda:0")
    started = time.perf_counter()
    service.load()
    service.warmup()
    load_s = time.perf_counter() - started
    print(f"reference: loaded in {load_s:.1f} s ({service.boot}); scale table {table}", flush=True)
    requests = {name: request(protocol, body) for name, body in bodies.items()}
    started = time.perf_counter()
    first = next(iter(bodies.values()))
    service.score_request(request(protocol, {**first, "inputs": first["inputs"][:2]}))
    for req in requests.values():  # torch.compile specialises on the first shapes, then compiles dynamic ones
        service.score_request(req)
    warm_s = time.perf_counter() - started
    print(f"reference: warm-up (one call of each job set) {warm_s:.1f} s", flush=True)
    jobs = {}
    for name, req in requests.items():
        torch.cuda.reset_peak_memory_stats()
        rounds, out = [], None
        for _ in range(args.rounds):
            started = time.perf_counter()
            out = service.score_request(req)
            rounds.append(time.perf_counter() - started)
        jobs[name] = {
            "seconds": statistics.median(rounds),
            "rounds": rounds,
            "questions": questions(out),
            "packed_tokens": out["usage"]["packed_tokens"],
            "gpu_busy_s": out["timing"]["gpu_busy_s"],
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            "logprobs": logprobs(out),
        }
        print(f"reference: {name} {jobs[name]['questions'] / jobs[name]['seconds']:,.0f} questions/s", flush=True)
    version = metadata.version("spinf-serve")
    return {"version": version, "load_s": load_s, "warm_s": warm_s, "boot": service.boot, "jobs": jobs}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--folder", type=Path, required=True)
    p.add_argument("--scales", type=Path, help="the scale table to give it (our scales, its names)")
    p.add_argument("--body", action="append", default=None, metavar="NAME=FILE", help="a body to time (repeatable)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, required=True, help="where the figures go")
    p.add_argument("--dry-run", action="store_true", help="compile the requests only (no GPU)")
    args = p.parse_args(argv)
    if not args.dry_run and args.scales is None:
        p.error("--scales is needed to run fp8s")
    pairs = [
        b.split("=", 1) for b in args.body or ["J1=" + str(JOBSETS / "j1.json"), "J2=" + str(JOBSETS / "j2.json")]
    ]
    bodies = {name: json.loads(Path(path).read_text()) for name, path in pairs}
    found = dry_run(args, bodies) if args.dry_run else run(args, bodies)
    args.json.write_text(json.dumps(found))


if __name__ == "__main__":
    sys.exit(main())
