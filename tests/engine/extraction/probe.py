"""Engine-side probes for the decode tests: what each extraction slot of a call decoded, read where the loop builds
the response (the raw `Decoded` outcome and the prompt's tokens), without changing what the engine computes."""

from __future__ import annotations

import contextlib

from spinf.engine.loop import EngineLoop


@contextlib.contextmanager
def outcomes(loop: EngineLoop):
    """Yields a dict filled as calls finish: ``(request id, input id, query id, combination) -> (Decoded, prompt
    tokens)``, the prompt tokens being BOS + content (to the cut) + the slot's branch."""
    found: dict = {}
    respond = loop._respond

    def spy(scored):
        for ci in scored.compiled.inputs:
            for qi, cq in enumerate(ci.queries):
                if not cq.extracts:
                    continue
                for k, prompt in enumerate(ci.prompts[qi]):
                    key = (scored.call.request_id, ci.spec.id, cq.spec.id, k)
                    found[key] = (scored.decoded[id(prompt)], tuple(ci.prefix) + tuple(prompt.branch))
        return respond(scored)

    loop._respond = spy
    try:
        yield found
    finally:
        loop._respond = respond


def only(found: dict, query_id: str, input_id: str | None = None, k: int = 0):
    """The one outcome of ``query_id`` (combination ``k``) among ``found``."""
    hits = [v for (_, i, q, kk), v in found.items() if q == query_id and kk == k and input_id in (None, i)]
    if len(hits) != 1:
        raise LookupError(f"{len(hits)} outcomes for {query_id!r}")
    return hits[0]
