"""From read log-probs to the response's numbers: options, floors, warnings and usage (api spec §5.2–§5.7).

A spelling's log-prob is the float64 sum of its tokens' log-probs (the chain rule); an option's ``logprob`` is the
log-sum-exp of its kept spellings; ``p`` is the softmax over the query's options and ``residual`` the mass outside
them. Every returned number is rounded to 6 decimals.
"""

from __future__ import annotations

import math

from spinf.engine.compiler import CompiledInput, CompiledRequest, slot_tokens
from spinf.engine.jobs import Prompt

LOW_MASS_RESIDUAL = 0.9
# The hosted API bills at least this many prompt tokens per call (api spec §5.7, D10).
MIN_BILLED_TOKENS = 1000
Values = dict[tuple[int, int, int], float]


def logsumexp(xs: list[float]) -> float:
    top = max(xs)
    if top == -math.inf:
        return top
    return top + math.log(sum(math.exp(x - top) for x in xs))


def option_logprobs(prompt: Prompt, values: Values) -> list[float]:
    """Each option's log-probability at this prompt (engine spec A.7, A.8)."""
    # one-token spellings and one-spelling options are the common case: fsum([x]) and logsumexp([x]) are x exactly
    spelling_lp = [values[r[0]] if len(r) == 1 else math.fsum(values[read] for read in r) for r in prompt.reads]
    out, at = [], 0
    for per_option in prompt.spellings:
        n = len(per_option)
        out.append(spelling_lp[at] if n == 1 else logsumexp(spelling_lp[at : at + n]))
        at += n
    return out


def softmax_and_residual(logprobs: list[float]) -> tuple[list[float], float]:
    top = max(logprobs)
    weights = [math.exp(x - top) for x in logprobs]
    total = sum(weights)
    mass = math.fsum(math.exp(x) for x in logprobs)
    return [w / total for w in weights], max(0.0, 1.0 - mass)


def r6(x: float) -> float:
    return round(x, 6)


Floor = tuple[list[float], float]  # a floor's option ps and residual
FloorKey = tuple  # (filled template text, options, case rule): what a floor read depends on (engine spec A.9)


def floor_numbers(floor: Prompt, values: Values) -> Floor:
    """A floor prompt's ps and residual, from its reads' values (the loop keeps them by `Prompt.key`)."""
    return softmax_and_residual(option_logprobs(floor, values))


def scored_query(ci: CompiledInput, qi: int, values: Values, deferred: list) -> tuple[dict, float]:
    """The result entry of one chosen scored query, and its mean residual (for ``low_option_mass``).

    Floor fields are left None and what `fill_floors` needs to set them is appended to ``deferred``: the floors
    are read once per key, in passes of their own or from the loop's cache, and arrive when they arrive.
    """
    cq = ci.queries[qi]
    combinations, residuals = [], []
    for k, combo in enumerate(cq.combos):
        lps = option_logprobs(ci.prompts[qi][k], values)
        ps, residual = softmax_and_residual(lps)
        options = [
            {"text": text, "logprob": r6(lp), "p": r6(p), "floor_p": None}
            for text, lp, p in zip(cq.spec.options, lps, ps, strict=True)
        ]
        combination = {"values": dict(combo), "options": options, "residual": r6(residual), "floor_residual": None}
        combinations.append(combination)
        floor = ci.floors[qi][k]
        if floor is not None:
            deferred.append((floor.key, options, combination))
        residuals.append(residual)
    return {"id": cq.spec.id, "combinations": combinations}, sum(residuals) / len(residuals)


def fill_floors(deferred: list, floors: dict[FloorKey, Floor]) -> None:
    """Set the floor fields `scored_query` deferred, from each floor key's numbers."""
    for key, options, combination in deferred:
        ps, residual = floors[key]
        for option, p in zip(options, ps, strict=True):
            option["floor_p"] = r6(p)
        combination["floor_residual"] = r6(residual)


def input_result(ci: CompiledInput, values: Values, deferred: list, slot_entry=None) -> tuple[dict, list[dict]]:
    """One input's ``results`` entry (floor fields deferred) and its ``low_option_mass`` warnings; an extraction
    query's entry comes from ``slot_entry(ci, query index)`` (`spinf.engine.extractor.Extractor.query_entry`)."""
    queries, warnings = [], []
    for qi, cq in enumerate(ci.queries):
        if cq.extracts:
            queries.append(slot_entry(ci, qi))
            continue
        entry, mean_residual = scored_query(ci, qi, values, deferred)
        queries.append(entry)
        if cq.reads_one_row and mean_residual > LOW_MASS_RESIDUAL:
            warnings.append(
                {
                    "code": "low_option_mass",
                    "input_id": ci.spec.id,
                    "query_id": cq.spec.id,
                    "message": f"the options of query {cq.spec.id!r} hold {100 * (1 - mean_residual):.1f}% of "
                    "the next-token mass on average; check the template's wording and the options' spelling",
                }
            )
    return {"input_id": ci.spec.id, "queries": queries}, warnings


def media_counts(compiled: CompiledRequest) -> dict:
    """``usage.content``'s media counts (api spec §5.7): images and video frames with their placeholders and 2
    markers each, audio segments likewise, and the audio's length (the 600 s each input reads, A.14.4)."""
    counts = {"images": 0, "image_tokens": 0, "video_frames": 0, "video_tokens": 0, "audio_seconds": 0.0}
    counts["audio_tokens"] = 0
    audio_ms = 0.0
    for ci in compiled.inputs:
        for _, item in ci.media:
            kind = {"image": "images", "video": "video_frames"}.get(item.kind)
            if kind is not None:
                counts[kind] += 1
            counts[f"{item.kind}_tokens"] += item.num_tokens + 2
            audio_ms += item.milliseconds
    counts["audio_seconds"] = round(audio_ms / 1000, 3)
    return counts


def usage(compiled: CompiledRequest, decoded: dict | None = None) -> dict:
    """The ``usage`` block: every count defined by the request alone (api spec §5.7); ``decoded`` holds each
    extraction prompt's outcome by prompt id (`spinf.engine.extraction.decoder.Decoded`).

    ``billed_tokens`` is what the hosted API would bill: the prompt tokens (generated tokens are not billed), at
    least `MIN_BILLED_TOKENS`. It is informational here, present because real clients read it (D10).
    """
    content = sum(len(ci.content_tokens) for ci in compiled.inputs)
    media = media_counts(compiled)
    text = content - media["image_tokens"] - media["video_tokens"] - media["audio_tokens"]
    query_tokens = sum(_query_tokens(cq) for ci in compiled.inputs for cq in ci.queries)
    floor_tokens = sum(len(p.branch) + p.query.extra_option_tokens for p in compiled.floors.values())
    # usage.scoring counts the scored queries ({?}); extraction slots are counted in usage.extraction (api spec §5.7)
    distinct = {cq.spec.path: cq for ci in compiled.inputs for cq in ci.queries if not cq.extracts}
    prompt_tokens = content + query_tokens + floor_tokens
    slots = [p for ci in compiled.inputs for per_query in ci.prompts for p in per_query if p.extracts]
    generated = [p for p in slots if p.query.spec.generate is not None]
    outcomes = decoded or {}
    completion = sum(len(tokens) for p in generated for tokens, _ in outcomes[id(p)].sequences)
    out = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {
            "content_tokens": content,
            "text_tokens": text,
            "query_tokens": query_tokens,
            "floor_tokens": floor_tokens,
        },
        "inputs": len(compiled.inputs),
        "content": {"tokens": content, "text_tokens": text, **media},
        "scoring": {
            "queries": len(distinct),
            "combinations": sum(len(cq.combos) for cq in distinct.values()),
            "options": sum(len(cq.spec.options or ()) for cq in distinct.values()),
            "prompts": sum(len(cq.combos) for ci in compiled.inputs for cq in ci.queries if not cq.extracts),
            "floor_prompts": len(compiled.floors),
            "query_tokens": query_tokens,
            "floor_tokens": floor_tokens,
        },
    }
    if slots:
        kinds = [p.query.spec.template.slot.kind for p in slots]
        searched = [outcomes[id(p)] for p in slots if p.query.spec.generate is None]
        out["extraction"] = {
            "slots": len(slots),
            **{kind: kinds.count(kind) for kind in ("text", "number", "currency")},
            "answers": sum(len(o.answers) for o in searched),
            "decode_tokens": sum(o.steps for o in searched),
        }
    if generated:
        out["generation"] = {
            "slots": len(generated),
            "sequences": sum(p.query.spec.generate.n for p in generated),
            "max_tokens": max(slot_tokens(p.query) for p in generated),
            "generated_tokens": completion,
        }
    if compiled.request.packs:
        pack_tokens = sum(_query_tokens(cq) for ci in compiled.inputs for cq in ci.queries if cq.spec.pack)
        out["packs"] = {"count": len(compiled.request.packs), "query_tokens": pack_tokens}
    out["processed_tokens"] = compiled.processed_tokens
    out["billed_tokens"] = max(prompt_tokens, MIN_BILLED_TOKENS)
    return out


def _query_tokens(cq) -> int:
    """A chosen query's share of ``query_tokens`` for one input: its filled templates, plus each option's tokens
    beyond its first for every combination."""
    return sum(map(len, cq.filled_tokens)) + len(cq.combos) * cq.extra_option_tokens
