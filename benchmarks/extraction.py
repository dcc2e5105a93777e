"""Issue 14's measurement: what extraction and generated slots cost, in tokens-of-scoring equivalents, and slots/s.

Run on the GPU machine: ``python benchmarks/extraction.py [--shape 12b] [--work DIR]``; the CPU smoke test is
``python benchmarks/extraction.py --device cpu --scaled --inputs 4``.

1. The 12B shape with random bf16 weights as a checkpoint folder (`benchmarks.checkpoint`), calibrated and served in
   fp8s as ``spinf-serve serve`` would (on the CPU: fp32).
2. A base call: ``--inputs`` articles (11 sentences each, as J1's) × ``--questions`` scored yes/no questions. Its
   time over its processed tokens is the **time of one token of scoring** in that call.
3. The same call plus one slot per input: a searched ``{n}`` (``max_tokens`` 16), a generated ``{*}`` of 32 tokens
   (greedy), and 8 slots per input (3 ``{*}``, 3 ``{n}``, 2 ``{$}``; then 8 generated slots of 32 tokens). A slot's
   cost = (the call's time − the base call's time) / slots, given in tokens of scoring.
4. Random weights spread the next-token mass thinly: every beam falls under the 0.002 pruning floor after a step and
   every generated sequence ends at once (its stop set outweighs any one token). So each slot call runs twice: as
   served (``as served``), and with the extractor's measurement switch ``full_length`` (no pruning, no stop: every
   beam and sequence runs to ``max_tokens``), which is the cost a real model's long answers pay. The decode steps
   each run took (``usage.extraction.decode_tokens``, ``usage.completion_tokens``) are printed beside it.

Every timing is the median of ``--repeats`` calls after one warm call of the same body. One section goes to
benchmarks/RESULTS.md (``--no-results`` prints only).

``--count`` times nothing and runs on any device: each slot call runs once and prints what it ran besides the base
call (per slot: the tokens its passes scored, the decoder's rows; per call: passes, decodes, chunks, model steps,
rows, the rows of a live beam or sequence and the rows whose full-vocabulary log-probs a choice ranked, from
`Extractor.tally`). Each decode step streams every weight once and runs every row of its chunk, live or not, through
the model and the full-vocabulary head; on a GPU a step costs about the same for a few rows as for a hundred, so the
steps, and the rows the choices rank, say most of what a slot costs there.
``--like-12b`` (with ``--count``) gives a small model the 12B's budgets: both decode budgets and the decoder's
log-prob bytes per row are scaled so that every term of what the loop and the decoder hold stands to its budget
as the 12B's does (its keys and values in bf16, its 262,144-wide log-probs), so its passes capture, flush and
chunk as the 12B's would at the default budgets (the step-0 log-probs aside: the flush counts them, a few percent
more on a small model).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.baseline import BENCH_LIMITS  # noqa: E402
from benchmarks.checkpoint import calibrate_folder, open_engine, work_dir, write_checkpoint  # noqa: E402
from benchmarks.gemma12b import GEMMA_12B_TEXT_CONFIG, scaled  # noqa: E402
from benchmarks.gpu_fast import calibration_corpus  # noqa: E402
from benchmarks.jobsets import article  # noqa: E402
from benchmarks.results import RESULTS, append_section, cpu_machine  # noqa: E402

QUESTIONS = [
    "is the news good for households",
    "does it mention a company",
    "is a government involved",
    "is it about prices",
    "is it about jobs",
    "does it name a country",
    "is the tone negative",
    "is it about energy",
    "does it cite a survey",
    "is it about the future",
]


def base_body(inputs: int, questions: int, seed: int = 1) -> dict:
    rng = random.Random(seed)
    queries = [
        {
            "id": f"q{k}",
            "template": f"\n\nQuestion {k}: {QUESTIONS[k % len(QUESTIONS)]}? Answer:{{?}}",
            "options": [" yes", " no"],
        }
        for k in range(questions)
    ]
    contents = [{"id": f"a{i}", "messages": [{"role": "user", "content": article(rng, 11)}]} for i in range(inputs)]
    return {"inputs": contents, "scoring": {"queries": queries}}


SEARCHED_N = {"id": "n0", "template": "\n\nThe number of people asked: {n}", "max_tokens": 16}
GENERATED = {"id": "g0", "template": "\n\nIn one line:{*}", "generate": True, "max_tokens": 32}
EIGHT_SEARCHED = [
    *({"id": f"t{k}", "template": f'\n\nName {k} in the text: "{{*}}"', "max_tokens": 16} for k in range(3)),
    *({"id": f"n{k}", "template": f"\n\nNumber {k} in the text: {{n}}", "max_tokens": 16} for k in range(3)),
    *({"id": f"c{k}", "template": f"\n\nAmount {k} in the text: {{$}}", "max_tokens": 16} for k in range(2)),
]
EIGHT_GENERATED = [
    {"id": f"g{k}", "template": f"\n\nSummary {k}:{{*}}", "generate": True, "max_tokens": 32} for k in range(8)
]


CASES = [
    ("+1 searched {n} per input", [SEARCHED_N]),
    ("+1 generated 32-token {*} per input", [GENERATED]),
    ("+8 searched slots per input", EIGHT_SEARCHED),
    ("+8 generated 32-token slots per input", EIGHT_GENERATED),
]


def with_slots(body: dict, slots: list[dict]) -> dict:
    return {**body, "scoring": {"queries": body["scoring"]["queries"] + slots}}


def timed(engine, body: dict, repeats: int, device: torch.device) -> tuple[float, dict]:
    """The median seconds of ``repeats`` calls of ``body`` after a warm one, and the last response."""
    engine.score(body, trusted=True)
    times, response = [], None
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        response = engine.score(body, trusted=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times), response


def budgets(engine, gib: float) -> None:
    """Both decode budgets at ``gib`` GiB (0: the defaults, 4 GiB each), set on the running engine."""
    import attrs

    from spinf.engine.extractor import DEFAULT_DECODE_BUDGET_GIB, DEFAULT_DECODER_BUDGET_GIB

    extractor = engine.extractor
    extractor.decode_budget = int((gib or DEFAULT_DECODE_BUDGET_GIB) * 2**30)
    extractor.decoder_budget = int((gib or DEFAULT_DECODER_BUDGET_GIB) * 2**30)
    engine.loop.shape = attrs.evolve(engine.loop.shape, capture_tokens=extractor.capture_tokens())
    engine.loop.scheduler.capture_budget = extractor.capture_tokens()


def profile(engine, body: dict, device: torch.device) -> None:
    """One full-length call of ``body`` under torch.profiler: how many decodes ran, the top kernels and host ops."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    engine.extractor.full_length = True
    engine.score(body, trusted=True)
    decodes = []
    original = engine.extractor.decode

    def counted(tasks):
        out, seconds = original(tasks)
        decodes.append((len(tasks), seconds))
        return out, seconds

    engine.extractor.decode = counted
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        started = time.perf_counter()
        engine.score(body, trusted=True)
        print(f"call {1000 * (time.perf_counter() - started):.1f} ms; decodes (slots, s): {decodes}", flush=True)
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=30), flush=True)
    engine.extractor.decode = original


def cost_lines(
    engine, device: torch.device, inputs: int, questions: int, repeats: int, say, raised_gib: float = 0.0
) -> None:
    """The base call and the slot calls of the module docstring on ``engine``, each line through ``say``."""
    base = base_body(inputs, questions)
    base_s, base_response = timed(engine, base, repeats, device)
    tokens = base_response["usage"]["processed_tokens"]
    per_token = base_s / tokens
    say(
        f"base: {inputs} inputs × {questions} questions, {tokens} processed tokens in "
        f"{base_s * 1000:.1f} ms: {per_token * 1e6:.2f} µs per token of scoring"
    )
    say("")
    say("| call | mode | slots | ms | ms per slot | tokens of scoring per slot | slots/s | decode steps |")
    say("|---|---|---|---|---|---|---|---|")
    runs = [(name, slots, mode, 0.0) for name, slots in CASES for mode in ("as served", "full_length")]
    if raised_gib:
        runs += [(name, slots, "full_length", raised_gib) for name, slots in CASES]
    for name, slots, mode, raised in runs:
        engine.extractor.full_length = mode == "full_length"
        budgets(engine, raised)
        if raised:
            mode = f"full_length, budgets {raised:g} GiB"
        seconds, response = timed(engine, with_slots(base, slots), repeats, device)
        usage = response["usage"]
        count = inputs * len(slots)
        extra = (seconds - base_s) / count
        steps = usage["extraction"]["decode_tokens"] + usage["completion_tokens"]
        say(
            f"| {name} | {mode} | {count} | {seconds * 1000:.1f} | {extra * 1000:.3f} | "
            f"{extra / per_token:.0f} | {count / (seconds - base_s):.0f} | {steps} |"
        )
    engine.extractor.full_length = False
    budgets(engine, 0.0)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    say("")
    say(f"peak GPU memory {peak:.2f} GiB" if device.type == "cuda" else "CPU run")


def count_lines(engine, inputs: int, questions: int, say) -> None:
    """The slot calls of `cost_lines`, each run once: what each ran beyond the base call, through ``say``."""
    from spinf.engine.extraction.decoder import DecodeTally

    base = base_body(inputs, questions)
    before = engine.loop.statistics()
    engine.score(base, trusted=True)
    ran = engine.loop.statistics()
    base_passes, base_tokens = ran.passes - before.passes, ran.packed_tokens - before.packed_tokens
    say(f"base: {inputs} inputs × {questions} questions, {base_passes} passes, {base_tokens} scored tokens")
    say("")
    say(
        "| call | mode | slots | passes | scored tokens per slot | decodes | chunks | model steps | rows | "
        "live rows | rows per slot | ranked rows |"
    )
    say("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, slots in CASES:
        for mode in ("as served", "full_length"):
            engine.extractor.full_length = mode == "full_length"
            engine.extractor.tally = tally = DecodeTally()
            before = engine.loop.statistics()
            engine.score(with_slots(base, slots), trusted=True)
            ran = engine.loop.statistics()
            count = inputs * len(slots)
            scored = (ran.packed_tokens - before.packed_tokens - base_tokens) / count
            say(
                f"| {name} | {mode} | {count} | {ran.passes - before.passes} | {scored:.1f} | {tally.decodes} | "
                f"{tally.chunks} | {tally.steps} | {tally.rows} | {tally.live_rows} | {tally.rows / count:.1f} | "
                f"{tally.ranked} |"
            )
    engine.extractor.full_length = False


def kv_bytes(config: dict) -> int:
    """A Gemma config's keys and values per token over all layers in bf16 (`Gemma4Text.kv_bytes_per_token`)."""
    full = 2 * config["num_global_key_value_heads"] * config["global_head_dim"]
    sliding = 2 * config["num_key_value_heads"] * config["head_dim"]
    return sum(2 * (full if kind == "full_attention" else sliding) for kind in config["layer_types"])


@contextlib.contextmanager
def like_12b(engine):
    """The default budgets scaled by the engine's keys and values per token over the 12B's, and the decoder's
    log-prob bytes per row by the vocabularies too, while the block runs (`--like-12b`)."""
    from spinf.engine.extraction import budget
    from spinf.engine.extractor import DEFAULT_DECODE_BUDGET_GIB

    scale = engine.extractor.cost.prefix_token / kv_bytes(GEMMA_12B_TEXT_CONFIG)
    vocab = engine.model.cfg.vocab_size
    logit_bytes = budget.LOGIT_BYTES
    budget.LOGIT_BYTES = logit_bytes * GEMMA_12B_TEXT_CONFIG["vocab_size"] / vocab * scale
    budgets(engine, DEFAULT_DECODE_BUDGET_GIB * scale)
    try:
        yield
    finally:
        budget.LOGIT_BYTES = logit_bytes
        budgets(engine, 0.0)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--scaled", action="store_true", help="a 2-layer, 64-wide model of the 12B's architecture")
    p.add_argument("--work", type=Path, default=None, help="where the checkpoint folder goes (default: temporary)")
    p.add_argument("--inputs", type=int, default=64)
    p.add_argument("--questions", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--no-results", action="store_true")
    p.add_argument(
        "--raised-gib",
        type=float,
        default=0.0,
        help="also time every slot call at full length with both decode budgets raised to this many GiB",
    )
    p.add_argument(
        "--profile",
        nargs="?",
        const="searched",
        choices=("searched", "generated"),
        help="profile one full-length call instead (torch.profiler): +1 searched {n} per input (the default), or +1 "
        "generated 32-token {*}",
    )
    p.add_argument("--count", action="store_true", help="count what each slot call ran instead of timing it")
    p.add_argument("--like-12b", action="store_true", help="with --count: the 12B's budgets on a small model")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    config = scaled(GEMMA_12B_TEXT_CONFIG) if args.scaled else GEMMA_12B_TEXT_CONFIG
    lines = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    with work_dir(args.work) as root:
        folder = write_checkpoint(root, config, device=device)
        quant = "fp32"
        if folder.on_gpu:
            quant = "fp8s"
            calibrate_folder(folder, root, calibration_corpus(), BENCH_LIMITS)
        engine = open_engine(folder, root, quant=quant, limits=BENCH_LIMITS)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        if args.profile:
            slot = SEARCHED_N if args.profile == "searched" else GENERATED
            profile(engine, with_slots(base_body(args.inputs, args.questions), [slot]), device)
            return
        if args.count:
            engine.loop.scheduler.max_pass_s = 0.0  # passes of the whole token budget, as on a GPU (no time bound)
            with like_12b(engine) if args.like_12b else contextlib.nullcontext():
                count_lines(engine, args.inputs, args.questions, print)
            return
        cost_lines(engine, device, args.inputs, args.questions, args.repeats, say, args.raised_gib)
    if args.no_results:
        return
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_machine()
    command = "python benchmarks/extraction.py " + " ".join(sys.argv[1:] if argv is None else argv)
    shape = "the 12B shape (scaled)" if args.scaled else "the 12B shape"
    body = f"Command: `{command.strip()}`. Machine: {machine}. Model: {shape}, random weights, {quant}.\n\n"
    append_section("Issue 14: extraction and generation costs", body + "\n".join(lines), args.results)


if __name__ == "__main__":
    main()
