"""One request as a pipeline: compile, run and read back overlapped (engine spec B.12), for in-process calls.

`score_streamed` hands each input's jobs to the scorer as soon as the input is compiled, and turns an input's
values into its ``results`` entry as soon as its jobs are read back, while the device works on later passes. The
floor jobs are laid out last, so floor fields are filled at the end (`results.fill_floors`). Because a question's
numbers do not depend on what shares its pass (engine spec C.1), the answer is the one `compile_request`,
`Scorer.run_many` and `input_results` give in sequence; only the time differs. The server's executor keeps the
sequential path, which lets concurrent requests share passes.
"""

from __future__ import annotations

import time

import attrs

from spinf.engine.compiler import CompiledRequest, CompileStream, EngineShape
from spinf.engine.results import FloorCache, fill_floors, input_result
from spinf.engine.scorer import RunStats, Scorer
from spinf.engine.tokenizer import TextTokenizer
from spinf.protocol.types import ScoreRequest


@attrs.frozen
class Scored:
    compiled: CompiledRequest
    results: list[dict]  # in input order
    warnings: list[dict]  # the low_option_mass warnings, in input order
    stats: RunStats
    compile_s: float  # time spent compiling (overlapped with the device after the first input)


def score_streamed(scorer: Scorer, tokenizer: TextTokenizer, shape: EngineShape, req: ScoreRequest) -> Scored:
    """Compile, run and read ``req`` as one pipeline; raises what `compile_request` raises. Call it with the cyclic
    collector paused (`hostgc.paused`), dropping the result before the pause ends, as `Engine.score` does."""
    started = time.perf_counter()
    stream = CompileStream(req, tokenizer, shape)
    owner: dict[int, int | None] = {}  # job index -> its input (None: a floor job)
    remaining: dict[int, int] = {}  # input -> its jobs not yet read back
    compile_s = 0.0

    def arrivals():
        nonlocal compile_s
        steps = iter(stream)
        while True:
            began = time.perf_counter()
            step = next(steps, None)
            compile_s += time.perf_counter() - began
            if step is None:
                return
            i, indices = step
            for j in indices:
                owner[j] = i
            if i is not None:
                remaining[i] = len(indices)
            yield indices

    values: dict = {}
    entries: dict[int, tuple[dict, list[dict]]] = {}
    floors: FloorCache = {}
    deferred: list = []
    per_pass: list[RunStats] = []
    for finished, found in scorer.stream(stream.jobs, arrivals(), per_pass):
        values.update(found)
        for j in finished:
            i = owner[j]
            if i is not None:
                remaining[i] -= 1
                if not remaining[i]:
                    entries[i] = input_result(stream.inputs[i], values, floors, deferred)
    compiled = stream.result()
    for i, ci in enumerate(compiled.inputs):  # inputs without jobs of their own (nothing to read)
        if i not in entries:
            entries[i] = input_result(ci, values, floors, deferred)
    fill_floors(deferred, values, floors)
    stats = RunStats(
        passes=sum(w.passes for w in per_pass),
        packed_tokens=sum(w.packed_tokens for w in per_pass),
        busy_s=sum(w.busy_s for w in per_pass),
        wall_s=time.perf_counter() - started,
    )
    results = [entries[i][0] for i in range(len(compiled.inputs))]
    warnings = [w for i in range(len(compiled.inputs)) for w in entries[i][1]]
    return Scored(compiled, results, warnings, stats, compile_s)
