"""The pack evaluation pipeline up to the decision (packs spec §6.1–§6.5), pure arithmetic on plain data.

One input's answers to a pack's queries (§6.1, from a result's ``queries`` list in the pack's answer form) become the
reads' standardised values z (§6.2), the category macros (§6.3), the Platt scores and percentiles (§6.4), and the
flags under the effective thresholds and ``requires`` (§6.5). ``spinf.packs.evaluate`` adds the decision (§6.6).

The arithmetic follows the spec's order of operations exactly (sums left to right from 0, the stated LSE and
sigmoid), so flags and decisions agree with spinf-client's evaluator at their boundaries, not only to 1e-6. The pack
is the parsed JSON of a validated pack file and is not validated again; ``PackEvaluationError`` marks what makes
evaluation itself impossible (a ``views`` category without a viewed read, an answer missing for a read, an unknown
category in ``thresholds``). The server answers it with 500 ``engine_error`` (§5.4).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from spinf.errors import SpinfError

Answers = dict[tuple[str, str | None], list[float]]
"""Per (query id, the combination's ``F`` or None): the probability vector over the query's options (§6.1)."""

_CLIP = 1e-9
_PAIR_CLAMP = 1e-6


class PackEvaluationError(SpinfError):
    """A pack that cannot be evaluated on these answers and call settings (the server's 500 ``engine_error``)."""


def lse(xs: Sequence[float]) -> float:
    """log Σ exp(x), as m + ln Σ exp(x − m) with m = max(x), summed in order (§6)."""
    m = max(xs)
    total = 0.0
    for x in xs:
        total += math.exp(x - m)
    return m + math.log(total)


def sigmoid(x: float) -> float:
    """σ(x), in the form that does not overflow on either side (§6)."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def _combination_key(combination: Mapping) -> str | None:
    values = combination.get("values")
    if values and "F" in values:
        return values["F"]
    return None


def answers_from_queries(pack: Mapping, queries: Sequence[Mapping]) -> Answers:
    """The pack's answers from one result's ``queries`` list (§6.1): the pack's queries only, keyed by (id, F).

    ``answers: "p"`` (the default) takes each option's ``p`` as returned; ``"logprob"`` rebuilds the probabilities
    from the options' ``logprob`` values as exp(ℓ − LSE(ℓ)). A later combination with the same key wins.
    """
    pack_ids = {query["id"] for query in pack["scoring"]["queries"]}
    from_logprob = pack.get("answers", "p") == "logprob"
    answers: Answers = {}
    for query in queries:
        if query.get("id") not in pack_ids:
            continue
        for combination in query["combinations"]:
            options = combination["options"]
            if from_logprob:
                logprobs = [option["logprob"] for option in options]
                total = lse(logprobs)
                probs = [math.exp(logprob - total) for logprob in logprobs]
            else:
                probs = [option["p"] for option in options]
            answers[(query["id"], _combination_key(combination))] = probs
    return answers


def _answer(read: Mapping, answers: Answers) -> list[float]:
    key = (read["query"], read.get("F"))
    if key not in answers:
        shown = key[0] if key[1] is None else f"{key[0]} with F = {key[1]!r}"
        raise PackEvaluationError(f"read {read['id']!r} has no answer: query {shown} is missing from the result")
    return answers[key]


def read_value(read: Mapping, answers: Answers) -> float:
    """A read's raw value v (§6.2) from the clipped probabilities of its query's answer."""
    clipped = [max(p, _CLIP) for p in _answer(read, answers)]
    kind = read["kind"]
    if kind == "pair":
        pi = clipped[0] / (clipped[0] + clipped[1])
        pi = min(max(pi, _PAIR_CLAMP), 1 - _PAIR_CLAMP)
        return read.get("sign", 1) * math.log(pi / (1 - pi))
    total = 0.0
    for p in clipped:
        total += p
    logs = [math.log(p / total) for p in clipped]
    if kind == "option":
        return logs[read["option"]] - read["mu"]
    shifted = [lam - mu for lam, mu in zip(logs, read["mu"], strict=True)]
    if kind == "any":
        return lse(shifted[1:]) - shifted[0]
    if kind == "set":
        unsafe = sorted(set(read["unsafe"]))
        safe = [j for j in range(len(shifted)) if j not in unsafe]
        return lse([shifted[j] for j in unsafe]) - lse([shifted[j] for j in safe])
    raise PackEvaluationError(f"read {read['id']!r} has an unknown kind {kind!r}")


def read_z(pack: Mapping, answers: Answers) -> dict[str, float]:
    """Every read's z = (v − mean) / sd, by read id in file order (§6.2)."""
    return {read["id"]: (read_value(read, answers) - read["mean"]) / read["sd"] for read in pack["reads"]}


def _mean(values: Sequence[float]) -> float:
    total = 0.0
    for value in values:
        total += value
    return total / len(values)


def category_macros(pack: Mapping, z: Mapping[str, float]) -> dict[str, float]:
    """Every category's macro M (§6.3): the mean z of its reads, or with ``aggregate: "views"`` the mean of the
    per-view means (views in order of first appearance; reads without a view ignored)."""
    macros = {}
    for category_id, spec in pack["categories"].items():
        reads = [read for read in pack["reads"] if read["category"] == category_id]
        if spec.get("aggregate") == "views":
            views: dict[str, list[float]] = {}
            for read in reads:
                if read.get("view"):
                    views.setdefault(read["view"], []).append(z[read["id"]])
            if not views:
                raise PackEvaluationError(f"category {category_id!r} aggregates views but no read has a view")
            macros[category_id] = _mean([_mean(group) for group in views.values()])
        elif reads:
            macros[category_id] = _mean([z[read["id"]] for read in reads])
        else:
            raise PackEvaluationError(f"category {category_id!r} has no read")
    return macros


def percentile(quantiles: Mapping | None, score: float) -> float | None:
    """The level of ``score`` on the ``normal_quantiles`` map (§6.4), or None without one.

    Linear interpolation between the last value at or below the score and the next one, which is above it, so
    tied values never divide by zero.
    """
    if not quantiles:
        return None
    levels, values = quantiles["levels"], quantiles["values"]
    if score <= values[0]:
        return levels[0]
    if score >= values[-1]:
        return levels[-1]
    i = max(j for j, value in enumerate(values) if value <= score)
    return levels[i] + (score - values[i]) * (levels[i + 1] - levels[i]) / (values[i + 1] - values[i])


def effective_thresholds(pack: Mapping, thresholds: Mapping[str, float | None] | None) -> dict[str, float | None]:
    """Each category's threshold, the call's ``thresholds`` replacing the pack's (null included) (§6.5)."""
    effective = {category_id: spec.get("threshold") for category_id, spec in pack["categories"].items()}
    for category_id, value in (thresholds or {}).items():
        if category_id not in effective:
            raise PackEvaluationError(f"thresholds names {category_id!r}, which is not a category of the pack")
        effective[category_id] = value
    return effective


def category_flags(
    pack: Mapping, scores: Mapping[str, float], thresholds: Mapping[str, float | None]
) -> dict[str, bool | None]:
    """Each category's flag (§6.5): null without a threshold, else score ≥ threshold; then one ``requires`` pass in
    pack order, each category reading the flags as they stand at that moment (so chains depend on order)."""
    flags: dict[str, bool | None] = {}
    for category_id, threshold in thresholds.items():
        flags[category_id] = None if threshold is None else scores[category_id] >= threshold
    for category_id, spec in pack["categories"].items():
        required = spec.get("requires")
        if flags[category_id] is True and required:
            flags[category_id] = all(flags.get(other) is True for other in required)
    return flags
