"""``usage`` (api spec §5.7, engine spec A.9 and A.11.2) against counts derived here, independently of the engine.

Every expected count comes from the request body and the checkpoint's tokenizer loaded with plain transformers
(``add_special_tokens=False``): contents, filled templates and options are tokenised separately (engine spec A.4.1).
"""

from __future__ import annotations

import itertools
import re

import pytest
from transformers import AutoTokenizer

POS = {"id": "pos", "template": "\nQuestion: Is it positive? Answer:{?}", "options": [" yes", " no"]}
GRID = {
    "id": "grid",
    "template": "\nTopic: {topic}, tone: {tone}? Answer:{?}",
    "combinations": "all",
    "values": {"tone": ["calm", "angry", "sad"], "topic": ["sports", "politics"]},
    "options": [" yes", " no", " maybe"],  # " maybe" is two tokens
}
RATE = {
    "id": "rate",
    "template": "\nRating:{?}",
    "options": [" good", " bad", " definitely not"],
    "empty_floor": False,
}
OWN = {
    "id": "own",
    "template": "\nIs it {x}? Answer:{?}",
    "combinations": [{"x": "long"}, {"x": "short"}],
    "options": [" yes", " no"],
}
TWO_MESSAGES = [
    {"role": "system", "content": "Review follows."},
    {"role": "user", "content": [{"type": "text", "text": "The movie "}, {"type": "text", "text": "was great."}]},
]
BODY = {
    "inputs": [
        {"id": "a", "messages": TWO_MESSAGES, "queries": [OWN]},  # every shared query, then its own
        {"id": "b", "messages": [{"content": "Dull and slow."}], "query_ids": ["grid"], "queries": [OWN]},
        {
            "id": "c",
            "messages": [{"content": "Nice."}],
            "query_ids": ["rate", "pos"],
            "queries": [{**POS, "id": "pos2"}],
        },
    ],
    "scoring": {"queries": [POS, GRID, RATE]},
}
TOPICS = ["sports", "politics", "music", "food", "travel", "science", "movies", "books", "games", "weather"]


class Tok:
    """``tok(s)`` of the engine spec, from the checkpoint's tokenizer through transformers."""

    def __init__(self, folder):
        self._tokenizer = AutoTokenizer.from_pretrained(folder)
        self.bos = self._tokenizer("", add_special_tokens=True)["input_ids"]

    def __call__(self, text: str) -> list[int]:
        return self._tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def tok(tiny_engine) -> Tok:
    return Tok(tiny_engine.folder)


def combinations(q: dict) -> list[dict]:
    """§4.7: ``{}``, the list, or the ``"all"`` product with the template's first placeholder varying slowest."""
    if q.get("combinations") is None:
        return [{}]
    if q["combinations"] != "all":
        return q["combinations"]
    names = list(dict.fromkeys(re.findall(r"\{(\w+)\}", q["template"])))
    return [dict(zip(names, row, strict=True)) for row in itertools.product(*(q["values"][n] for n in names))]


def filled(q: dict, combo: dict) -> str:
    text = q["template"].removesuffix("{?}")
    for name, value in combo.items():
        text = text.replace("{" + name + "}", value)
    return text


def content_text(inp: dict) -> str:
    """§4.3: messages joined by a blank line, a message's text parts concatenated."""
    parts = [
        m["content"] if isinstance(m["content"], str) else "".join(p["text"] for p in m["content"])
        for m in inp["messages"]
    ]
    return "\n\n".join(parts)


def chosen(request: dict, inp: dict) -> list[tuple[tuple, dict]]:
    """The input's queries (§4.2), each with a key that names it once per call (shared) or once per input."""
    shared = request["scoring"]["queries"]
    ids = inp.get("query_ids")
    picked = shared if ids is None else [next(q for q in shared if q["id"] == i) for i in ids]
    own = inp.get("queries", [])
    return [(("shared", q["id"]), q) for q in picked] + [((inp["id"], q["id"]), q) for q in own]


def expected(request: dict, tok: Tok) -> dict:
    """Every count of ``usage`` that the spec defines from the request, plus the processed-token bounds."""
    scoring = request["scoring"]
    case_rule = scoring.get("case_insensitive", True)
    bos = len(tok.bos)
    content = query_tokens = prompts = lower = naive = exact = 0
    queries: dict[tuple, dict] = {}
    floors: dict[tuple, tuple[int, list[list[int]]]] = {}  # (text, options, case rule) -> (tokens, trie branches)
    for inp in request["inputs"]:
        text = content_text(inp)
        c = len(tok(text))
        content += c
        lower += bos + c
        naive += bos + c
        branches = []
        for key, q in chosen(request, inp):
            queries[key] = q
            option_tokens = [tok(o) for o in q["options"]]
            extra = sum(len(t) - 1 for t in option_tokens)
            floor_on = q.get("empty_floor") if q.get("empty_floor") is not None else scoring.get("empty_floor", True)
            for k, combo in enumerate(combinations(q)):
                f = filled(q, combo)
                f_tokens = tok(f)
                if k == 0:  # precondition of the bounds: no content/template cut (engine spec A.5)
                    assert tok(text[-256:] + f) == tok(text[-256:]) + f_tokens, (inp["id"], f)
                prompts += 1
                query_tokens += len(f_tokens) + extra
                naive += len(f_tokens) + extra
                own = [f_tokens + t[:-1] for t in option_tokens]  # the prompt and its options' lead-ins
                branches += own
                if floor_on:
                    floors[(f, tuple(q["options"]), case_rule)] = (len(f_tokens) + extra, own)
        exact += bos + c + trie_size(branches)
    floor_tokens = sum(n for n, _ in floors.values())
    if floors:
        naive += sum(bos + n for n, _ in floors.values())
        exact += bos + trie_size([b for _, branches in floors.values() for b in branches])
    return {
        "content": content,
        "query_tokens": query_tokens,
        "floor_tokens": floor_tokens,
        "queries": len(queries),
        "combinations": sum(len(combinations(q)) for q in queries.values()),
        "options": sum(len(q["options"]) for q in queries.values()),
        "prompts": prompts,
        "floor_prompts": len(floors),
        "lower": lower,
        "naive": naive,
        "exact": exact,
    }


def trie_size(branches: list[list[int]]) -> int:
    """The distinct non-empty prefixes of the branches: the nodes of their token trie."""
    return len({tuple(b[:n]) for b in branches for n in range(1, len(b) + 1)})


def test_usage_counts(tiny_engine, tok):
    response = tiny_engine.score(BODY)
    usage, exp = response["usage"], expected(BODY, tok)
    assert set(usage) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "prompt_tokens_details",
        "inputs",
        "content",
        "scoring",
        "processed_tokens",
        "billed_tokens",
    }  # no extraction, generation or packs; packed_tokens only with debug
    content, query_tokens, floor_tokens = exp["content"], exp["query_tokens"], exp["floor_tokens"]
    prompt_tokens = content + query_tokens + floor_tokens
    assert usage["prompt_tokens_details"] == {
        "content_tokens": content,
        "text_tokens": content,
        "query_tokens": query_tokens,
        "floor_tokens": floor_tokens,
    }
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        prompt_tokens,
        0,
        prompt_tokens,
    )
    assert usage["billed_tokens"] == max(prompt_tokens, 1000)
    assert usage["inputs"] == 3
    assert usage["content"] == {
        "tokens": content,
        "text_tokens": content,
        "images": 0,
        "image_tokens": 0,
        "video_frames": 0,
        "video_tokens": 0,
        "audio_seconds": 0.0,
        "audio_tokens": 0,
    }
    assert usage["scoring"] == {
        "queries": exp["queries"],
        "combinations": exp["combinations"],
        "options": exp["options"],
        "prompts": exp["prompts"],
        "floor_prompts": exp["floor_prompts"],
        "query_tokens": query_tokens,
        "floor_tokens": floor_tokens,
    }
    # The structure, by hand: pos, grid and rate once; own per input a and b; pos2 of input c.
    assert (exp["queries"], exp["combinations"], exp["options"]) == (6, 1 + 6 + 1 + 2 + 2 + 1, 2 + 3 + 3 + 2 + 2 + 2)
    # Prompts per input: a 1 + 6 + 1 + 2, b 6 + 2, c 1 + 1 + 1. Floors: pos (= pos2), the grid's 6, own's 2 (a = b).
    assert (exp["prompts"], exp["floor_prompts"]) == (21, 9)
    assert "packed_tokens" in tiny_engine.score(BODY, debug=True)["usage"]


def test_inputs_sharing_a_floor_key_read_the_same_floor(tiny_engine):
    results = {r["input_id"]: r["queries"] for r in tiny_engine.score(BODY)["results"]}
    floor = [[o["floor_p"] for o in c["options"]] for q in results["a"] if q["id"] == "own" for c in q["combinations"]]
    assert floor == [
        [o["floor_p"] for o in c["options"]] for q in results["b"] if q["id"] == "own" for c in q["combinations"]
    ]
    assert all(
        o["floor_p"] is None
        for q in results["c"]
        if q["id"] == "rate"
        for c in q["combinations"]
        for o in c["options"]
    )


def test_processed_tokens_bounds(tiny_engine, tok):
    processed, exp = tiny_engine.score(BODY)["usage"]["processed_tokens"], expected(BODY, tok)
    assert exp["lower"] <= processed <= exp["naive"]
    # A.11.2 with one job per input and one floor job: content once, each trie node once.
    assert processed == exp["exact"]


def test_questions_sharing_a_stem_read_the_content_once(tiny_engine, tok):
    queries = [
        {"id": t, "template": f"\nQuestion: Is the text about {t}? Answer:" + "{?}", "options": [" yes", " no"]}
        for t in TOPICS
    ]
    request = {
        "inputs": [{"id": "a", "messages": [{"content": "The movie was great."}]}],
        "scoring": {"queries": queries},
    }
    usage, exp = tiny_engine.score(request)["usage"], expected(request, tok)
    processed, bos, content = usage["processed_tokens"], len(tok.bos), exp["content"]
    assert (usage["scoring"]["prompts"], usage["scoring"]["floor_prompts"]) == (10, 10)
    own = [len(tok(filled(q, {}))) for q in queries]
    re_read = sum(bos + content + n for n in own) + sum(bos + n for n in own)  # every question alone, floors too
    assert processed < re_read
    assert processed < (bos + content + sum(own)) + (bos + sum(own))  # content once, and the stem shared too
    assert exp["lower"] <= processed == exp["exact"]


def test_floors_off_are_not_counted(tiny_engine, tok):
    on = {**OWN, "empty_floor": True}
    request = {
        "inputs": [{"id": "a", "messages": [{"content": "Nice."}], "queries": [on]}],
        "scoring": {"queries": [POS, GRID], "empty_floor": False},
    }
    usage, exp = tiny_engine.score(request)["usage"], expected(request, tok)
    assert (usage["scoring"]["floor_prompts"], exp["floor_prompts"]) == (2, 2)
    assert (
        usage["scoring"]["floor_tokens"]
        == exp["floor_tokens"]
        == sum(len(tok(filled(OWN, c))) for c in OWN["combinations"])
    )
    assert usage["processed_tokens"] == exp["exact"]


def test_floor_reads_are_keyed_by_text_options_and_case_rule(tiny_engine, tok):
    """A.9: one floor read per (filled text, options, case rule), whichever queries share it.

    Query "wide" also reads the ending "Answer ke", after which the case variants "yes" and "no" fail the boundary
    rule and are dropped for the whole query; its "Answer:" floor still has the same key as query "narrow"'s.
    """
    narrow = {"id": "narrow", "template": "{x}{?}", "combinations": [{"x": "Answer:"}], "options": [" yes", " no"]}
    wide = {**narrow, "id": "wide", "combinations": [{"x": "Answer:"}, {"x": "Answer ke"}]}
    request = {
        "inputs": [{"id": "a", "messages": [{"content": "Some text."}]}],
        "scoring": {"queries": [narrow, wide]},
    }
    usage, exp = tiny_engine.score(request)["usage"], expected(request, tok)
    assert exp["floor_prompts"] == 2
    assert (usage["scoring"]["floor_prompts"], usage["scoring"]["floor_tokens"]) == (2, exp["floor_tokens"])


@pytest.mark.parametrize(("sentences", "billed_above_the_floor"), [(1, False), (80, True)])
def test_billed_tokens_are_the_prompt_tokens_with_a_floor_of_1000(tiny_engine, tok, sentences, billed_above_the_floor):
    """§5.7 (D10): ``billed_tokens`` = max(prompt_tokens, 1000), whether the call is small or large."""
    text = "The parcel never arrived, so I ask for a refund. " * sentences
    request = {"inputs": [{"id": "a", "messages": [{"content": text}]}], "scoring": {"queries": [POS, RATE]}}
    exp = expected(request, tok)
    prompt_tokens = exp["content"] + exp["query_tokens"] + exp["floor_tokens"]
    assert (prompt_tokens > 1000) == billed_above_the_floor  # each case is on the side of the floor it claims
    for debug in (False, True):
        usage = tiny_engine.score(request, debug=debug)["usage"]
        assert usage["prompt_tokens"] == prompt_tokens
        assert usage["billed_tokens"] == (prompt_tokens if billed_above_the_floor else 1000)
