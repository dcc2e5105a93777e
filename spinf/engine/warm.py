"""What the warm-up runs (``--warmup full|short|none``): before ``/readyz`` turns 200, what a request would pay.

On a GPU a request can pay for three kinds of compile, each once per process:

1. the CUDA graph of each token bucket (`spinf.engine.graphs.all_buckets`: every 128 tokens up to 1,024), captured
   the first time a pass of that size runs. One capture per bucket, whatever the pass's jobs and depth, since a
   graph's tables are sized for the most jobs and the deepest paths it takes;
2. each Triton kernel in each specialisation a pass reaches. The kernels' configurations are fixed per layer kind
   and scheme, and Triton specialises an integer argument only on whether it is a multiple of 16; of the
   arguments, only the attention plan's path width changes with the pass (64 in a graph's plan; as deep as the
   deepest question in an eager pass's);
3. the LM head's soft-capped log-sum-exp, whose rows come in chunks of exactly 128: one shape for every pass.

The cuBLAS products pick their kernel per row count at run time; there is nothing of theirs to compile.

``short``: two small scoring calls through `Engine.score` (a question on one sentence; 40 queries on 40
sentences), which compile the kernels and the head and capture the graphs of the buckets they land in. ``full``:
the same calls, then one pass per graph bucket of exactly the bucket's tokens (paths 16 deep: a multiple of 16, as
a graph's plan is, for an engine whose graphs are off), then one pass of the whole token budget (the largest pass,
so running out of memory fails the boot rather than a call; eager, with paths 3 deep). Those passes are jobs built
here (`RawJobs`) and run through the engine loop like every caller's work, so each lands in its bucket whatever
the tokenizer. ``none``: nothing; the first requests pay. On the CPU there is no graph and no Triton: the same steps
run and check the memory.

An engine with media embedders also runs one media call after the two scoring calls (`media_body`): a small image
and, when audio is read, half a second of silence, so the embedders' first use and the attention kernel's
image-span variant are paid before ready (on the CPU too: its shapes are checked the same way).

After the scoring steps, an engine that can extract (``engine.extractor`` set: the model's capabilities and the
``extraction`` switch allow it) and a mode other than ``none`` run one extraction call (`extract_body`): a searched
``{*}``, a ``{n}``, a ``{$}`` and, when generation is on, a greedy and a sampled generated slot, a few tokens each,
so the decode path's first use (its buffers, and on a GPU its kernels) is paid before ready. Its seconds are
``boot.warmup_extract_s`` rather than part of ``boot.warmup_s`` (api spec §3.1): each step says which it counts
in (`Step.part`).

Every warm-up call's answer is checked for a non-finite number (`checked_score`): a checkpoint that loads but
computes NaN (a damaged or wrongly quantized shard) would otherwise turn ready and answer every call 500, since
the JSON encoder refuses NaN (api spec §2.1). The warm-up fails with a `ModelError` naming where the first one
appeared, so the boot fails (api spec §3.1: ``/readyz`` answers 503 with the reason, calls 503
``model_unavailable``). Under ``none`` nothing runs, so nothing is checked.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator
from typing import Protocol

import attrs

from spinf.engine.compiler import EngineShape
from spinf.engine.extractor import Extractor
from spinf.engine.graphs import all_buckets
from spinf.engine.loop import EngineLoop
from spinf.engine.tokenizer import TextTokenizer
from spinf.engine.trie import Job
from spinf.engine.work import RawJobs
from spinf.errors import ModelError
from spinf.settings import Features, Limits

MODES = ("full", "short", "none")
SENTENCE = "The parcel arrived late and the box was damaged. "
BUCKET_DEPTH = 16  # a multiple of 16, as the 64-wide path tables of a graph
EAGER_DEPTH = 3  # not a multiple of 16: the other specialisation of the attention kernel
# tokens per job of the budget pass: on a GPU a pass's tokens, not its jobs' lengths, set its memory, while the
# CPU's attention costs the square of a job's length (16 jobs of 1,024 tokens took 4 s on the tiny model, 32 of 512
# took 1.3 s)
BUDGET_JOB = 512
WARM_DECODE_TOKENS = 4  # decode steps per slot of the extraction call: its shapes, not its length, are paid


class Warmable(Protocol):
    """What the warm-up reads of an engine (`spinf.engine.engine.Engine` is one): its loop runs the built passes,
    ``score`` the calls; ``shape.media_kinds`` are the kinds whose embedders are loaded and switched on."""

    tokenizer: TextTokenizer
    shape: EngineShape
    features: Features
    limits: Limits
    extractor: Extractor | None
    loop: EngineLoop

    def score(self, body: object) -> dict: ...


@attrs.frozen
class Step:
    """One warm-up step: call it to run it; ``part`` is the ``boot`` field its seconds count in (api spec §3.1)."""

    run: Callable[[], object]
    part: str = "warmup_s"  # or "warmup_extract_s"

    def __call__(self) -> object:
        return self.run()


@attrs.frozen
class WarmPass:
    """One pass of built jobs: each job's tokens, and the depth of the one question path each ends in."""

    sizes: tuple[int, ...]
    depth: int

    @property
    def num_tokens(self) -> int:
        return sum(self.sizes)


def bodies(mode: str) -> list[dict]:
    """The scoring calls of ``short`` and ``full``: a question on one sentence; 40 queries on 40 sentences."""
    check_mode(mode)
    if mode == "none":
        return []
    yes_no = {"template": "\n\nIs the customer unhappy? Answer:{?}", "options": [" yes", " no"]}
    queries = [{"id": f"w{k}", **yes_no} for k in range(40)]
    return [{"messages": [{"content": SENTENCE * n}], "scoring": {"queries": queries[:n]}} for n in (1, 40)]


def media_body(mode: str, kinds: frozenset[str]) -> dict | None:
    """The media call of ``short`` and ``full`` for an engine whose embedders read ``kinds``: a 96 x 64 PNG (low
    detail) when it reads images, half a second of 16 kHz silence when it reads audio, and one question; None
    under ``none`` or without media."""
    check_mode(mode)
    if mode == "none" or not kinds & {"image", "audio"}:
        return None
    import base64
    import io
    import struct

    from PIL import Image

    parts: list[dict] = [{"type": "text", "text": SENTENCE}]
    if "image" in kinds:
        buffer = io.BytesIO()
        Image.new("RGB", (96, 64), (200, 120, 40)).save(buffer, "PNG")
        url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
        parts.append({"type": "image_url", "image_url": {"url": url, "detail": "low"}})
    if "audio" in kinds:
        pcm = bytes(16_000)  # 8,000 samples of 16-bit silence
        fmt = struct.pack("<HHIIHH", 1, 1, 16_000, 32_000, 2, 16)
        wav = b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt " + struct.pack("<I", 16) + fmt
        wav += b"data" + struct.pack("<I", len(pcm)) + pcm
        parts.append({"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}})
    question = {"id": "w", "template": "\n\nIs the customer unhappy? Answer:{?}", "options": [" yes", " no"]}
    return {"messages": [{"content": parts}], "scoring": {"queries": [question]}}


def extract_body(mode: str, *, max_slots: int, generation: bool) -> dict | None:
    """The extraction call of ``short`` and ``full``, for an engine that can extract: one input per slot (so any
    ``max_extractions_per_input`` of 1 or more admits it), each slot a few tokens long; the generated slots only
    when ``generation`` is on. None under ``none``, or when the limit admits no slot."""
    check_mode(mode)
    if mode == "none" or max_slots < 1:
        return None
    slots = [
        {"id": "text", "template": '\n\nWhat went wrong: "{*}"', "max_tokens": WARM_DECODE_TOKENS},
        {"id": "number", "template": "\n\nHow many days late?{n}", "max_tokens": WARM_DECODE_TOKENS},
        {"id": "amount", "template": "\n\nThe refund asked for:{$}", "max_tokens": WARM_DECODE_TOKENS},
    ]
    if generation:
        generated = {"template": '\n\nA short reply: "{*}"', "max_tokens": WARM_DECODE_TOKENS}
        slots.append({"id": "greedy", **generated, "generate": True})
        slots.append({"id": "sampled", **generated, "generate": {"temperature": 0.7, "seed": 0, "n": 2}})
    inputs = [{"id": slot["id"], "messages": [{"content": SENTENCE}], "queries": [slot]} for slot in slots]
    return {"inputs": inputs, "scoring": {"queries": []}}


def passes(mode: str, token_budget: int) -> list[WarmPass]:
    """The built passes of ``mode``: under ``full`` one per graph bucket, then one of the token budget (at least one
    token past the largest bucket, so it runs eagerly) in jobs of at most `BUDGET_JOB` tokens."""
    check_mode(mode)
    if mode != "full":
        return []
    found = [WarmPass((bucket,), BUCKET_DEPTH) for bucket in all_buckets()]
    total = max(token_budget, all_buckets()[-1] + 1)
    count = -(-total // BUDGET_JOB)
    sizes = tuple(total // count + (i < total % count) for i in range(count))  # as even as they come
    found.append(WarmPass(sizes, EAGER_DEPTH))
    return found


def jobs(plan: WarmPass, filler: tuple[int, ...]) -> list[Job]:
    """The jobs of ``plan``: each a prefix of ``filler`` repeated, then one path of ``plan.depth`` more of its tokens,
    the last one read (so the pass goes through the LM head too)."""
    out = []
    for size in plan.sizes:
        tokens = tuple(itertools.islice(itertools.cycle(filler), size + 1))
        prefix = tokens[: size - plan.depth]
        job = Job(prefix, fixed=len(prefix))  # the whole prefix fixed: a Qwen pass compiles its chunked kernels
        nodes = job.trie.insert(tokens[size - plan.depth : size])
        job.reads.add((nodes[-1], tokens[size]))
        out.append(job)
    return out


def run_pass(loop: EngineLoop, built: list[Job]) -> int:
    """``built`` through ``loop`` as one caller's jobs; the tokens run (the error of a failed pass is raised)."""
    work = RawJobs(jobs=built)
    loop.run([work])
    work.unwrap()
    return work.ran_tokens


def steps(engine: Warmable, mode: str) -> list[Step]:
    """The warm-up of ``mode`` as steps to run one after another (the server runs each as its own executor job):
    the scoring calls, the built passes, then the extraction call when the engine can extract."""
    filler = engine.tokenizer.bos + engine.tokenizer.tok(SENTENCE)
    options = answer_options(engine)
    calls = [Step(functools.partial(checked_score, engine, with_options(body, options))) for body in bodies(mode)]
    media = media_body(mode, engine.shape.media_kinds)
    if media is not None:
        calls.append(Step(functools.partial(checked_score, engine, with_options(media, options))))
    built = passes(mode, engine.shape.token_budget)
    found = calls + [Step(functools.partial(run_pass, engine.loop, jobs(plan, filler))) for plan in built]
    if engine.extractor is not None:
        body = extract_body(
            mode, max_slots=engine.limits.max_extractions_per_input, generation=engine.features.generation
        )
        if body is not None:
            found.append(Step(functools.partial(checked_score, engine, body), part="warmup_extract_s"))
    return found


def checked_score(engine: Warmable, body: dict) -> dict:
    """``engine.score(body)``; a `ModelError` when the answer holds a non-finite number (the model computes NaN or
    infinity: no call it answers could be sent)."""
    response = engine.score(body)
    where = next(non_finite(response["results"], "results"), None)
    if where is not None:
        raise ModelError(
            f"the model computes non-finite scores (the warm-up call's {where} is not a finite number): the "
            "checkpoint's weights or its quantization are damaged"
        )
    return response


def non_finite(value: object, path: str) -> Iterator[str]:
    """The dotted paths of the NaN and infinite floats in a JSON-shaped value, in order."""
    if isinstance(value, float) and not math.isfinite(value):
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from non_finite(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for k, item in enumerate(value):
            yield from non_finite(item, f"{path}.{k}")


def answer_options(engine: Warmable) -> list[str] | None:
    """Two options a decision model answers with (its first two codes whose text tokenizes back to that one code),
    for warm-up questions that are not refused there (its options must be codes); None for any other model."""
    if not engine.shape.answer_codes:
        return None
    tk = engine.tokenizer
    texts = {code: tk.decode([code]) for code in sorted(engine.shape.answer_codes)}
    usable = [text for code, text in texts.items() if tk.tok(text) == (code,)]
    return usable[:2] if len(usable) >= 2 else None


def with_options(body: dict, options: list[str] | None) -> dict:
    """``body`` with every query's options replaced by ``options`` (None: as it is)."""
    if options is None:
        return body
    queries = [{**q, "options": options} for q in body["scoring"]["queries"]]
    return {**body, "scoring": {**body["scoring"], "queries": queries}}


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"warm-up mode {mode!r}: one of {', '.join(MODES)}")
