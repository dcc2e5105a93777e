"""Compilation: the content/template join and cut (engine spec A.5), and job splitting (A.11.1)."""

from __future__ import annotations

import re

import pytest

from spinf.engine.compiler import EngineShape, compile_request
from spinf.protocol.request import parse_score_request
from spinf.settings import Limits


class OddFirstTokenizer:
    """A toy tokenizer whose split depends on where a string starts: its first character is a token, then pairs.

    Cutting a content anywhere but its start re-aligns the pairs, so no cut is ever valid, and nothing it joins
    tokenizes the same as its parts: the case where the engine must warn ``join_not_merged``.
    """

    bos = (2,)

    def _pieces(self, text: str) -> list[str]:
        pieces = []
        for word in re.findall(r" ?[^ ]+| +", text):  # words keep their leading space, as in byte-level BPE
            pieces += [word[:1]] + [word[i : i + 2] for i in range(1, len(word), 2)]
        return pieces

    def tok(self, text: str) -> tuple[int, ...]:
        return tuple(10 + hash(p) % 1000 for p in self._pieces(text))

    def tok_many(self, texts):
        return [self.tok(t) for t in texts]

    def boundaries(self, text: str) -> list[int]:
        starts, at = [], 0
        for piece in self._pieces(text):
            starts.append(at)
            at += len(piece)
        return starts


class SplitCharTokenizer:
    """A toy byte-level tokenizer: "ab" is one token, "@" two (both starting at its offset, as the bytes of a
    character split over tokens do), every other character one."""

    bos = (2,)

    def _pieces(self, text: str) -> list[tuple[int, int]]:
        out, at = [], 0
        while at < len(text):
            if text.startswith("ab", at):
                out.append((at, 900))
                at += 2
            elif text[at] == "@":
                out += [(at, 901), (at, 902)]
                at += 1
            else:
                out.append((at, 10 + ord(text[at]) % 800))
                at += 1
        return out

    def tok(self, text: str) -> tuple[int, ...]:
        return tuple(token for _, token in self._pieces(text))

    def tok_many(self, texts):
        return [self.tok(t) for t in texts]

    def boundaries(self, text: str) -> list[int]:
        return [start for start, _ in self._pieces(text)]


DEFAULT_SHAPE = EngineShape(16_384, 65_536)
DEFAULT_LIMITS = Limits()


def compiled(body, tokenizer, shape=DEFAULT_SHAPE, limits=DEFAULT_LIMITS):
    return compile_request(parse_score_request(body, limits=limits), tokenizer, shape)


def one_input(content: str, queries: list[dict]) -> dict:
    return {"messages": [{"content": content}], "scoring": {"queries": queries}}


YES_NO = {"options": [" yes", " no"]}


def test_no_valid_cut_warns_and_keeps_the_content_whole():
    content = "x" * 300  # 151 toy tokens: the start (the one valid cut) is not among the last 64 boundaries
    result = compiled(one_input(content, [{"id": "q", "template": "ab{?}", **YES_NO}]), OddFirstTokenizer())
    assert result.warnings == [
        {"code": "join_not_merged", "message": result.warnings[0]["message"], "param": "inputs.0"}
    ]
    ci = result.inputs[0]
    assert ci.prefix == OddFirstTokenizer.bos + ci.content_tokens


def test_a_cut_never_falls_inside_a_character_split_over_tokens():
    tk = SplitCharTokenizer()
    content = "x" * 300 + "@" + "y" * 30 + "a"  # "a" + "b..." merges; the last cut with a 32-character tail: "@"
    ci = compiled(one_input(content, [{"id": "q", "template": "b{?}", **YES_NO}]), tk).inputs[0]
    assert ci.prefix == tk.bos + tk.tok("x" * 300)  # before both of "@"'s tokens, not between them
    assert ci.prompts[0][0].branch == tk.tok(content[300:] + "b")
    assert ci.fixed <= len(ci.prefix)


def test_a_short_content_is_taken_whole_as_the_tail():
    content = "x" * 200  # at most 256 characters: the whole run may become the tail
    result = compiled(one_input(content, [{"id": "q", "template": "ab{?}", **YES_NO}]), OddFirstTokenizer())
    assert result.warnings == []
    ci = result.inputs[0]
    assert ci.prefix == OddFirstTokenizer.bos
    assert ci.prompts[0][0].branch == OddFirstTokenizer().tok(content + "ab")


def test_a_merging_template_cuts_the_content_and_retokenizes_the_tail(tiny_engine):
    tk = tiny_engine.tokenizer
    content = "We wrote to the support team about the order and the customer"
    body = one_input(content, [{"id": "q", "template": "s are angry? Answer:{?}", **YES_NO}])
    ci = compiled(body, tk).inputs[0]
    assert tk.tok(content + "s") != tk.tok(content) + tk.tok("s")  # the join really merges
    kept = len(ci.prefix) - len(tk.bos)
    assert 0 < kept < len(ci.content_tokens)
    tail = tk.decode(ci.content_tokens[kept:])
    assert len(tail) >= 32 and content.endswith(tail)
    assert ci.prompts[0][0].branch == tk.tok(tail + "s are angry? Answer:")


def test_the_fixed_prefix_is_the_same_whatever_the_queries(tiny_engine):
    """`Job.fixed` (what the Qwen stack runs chunked) ends before any cut a query could bring: a content whose end
    one template merges with has the same fixed rows with that template as without it."""
    tk = tiny_engine.tokenizer
    content = "We wrote to the support team about the order and the customer. " * 6 + "the customer"
    merging = {"id": "m", "template": "s are angry? Answer:{?}", **YES_NO}
    clean = {"id": "c", "template": "\n\nLate? Answer:{?}", **YES_NO}
    alone, both = (compiled(one_input(content, queries), tk) for queries in ([clean], [clean, merging]))
    (one,), (two,) = alone.inputs, both.inputs
    assert len(two.prefix) < len(one.prefix) == len(tk.bos) + len(one.content_tokens)  # the merging one cut
    assert one.fixed == two.fixed <= len(two.prefix)
    assert one.fixed >= len(tk.bos) + len(one.content_tokens) - 64
    assert {job.fixed for job in both.jobs if len(job.prefix) > len(tk.bos)} == {two.fixed}
    short = compiled(one_input("The parcel arrived late.", [clean]), tk).inputs[0]
    assert short.fixed == len(tk.bos)  # at most 256 characters: a cut could take the whole run


def test_a_clean_join_does_not_cut(tiny_engine):
    body = one_input("The parcel arrived late.", [{"id": "q", "template": "\n\nLate? Answer:{?}", **YES_NO}])
    result = compiled(body, tiny_engine.tokenizer)
    assert result.inputs[0].prefix == tiny_engine.tokenizer.bos + result.inputs[0].content_tokens
    assert result.warnings == []


def many_questions(n: int, group: str | None = None, start: int = 0) -> list[dict]:
    out = []
    for k in range(start, start + n):
        q = {"id": f"q{k}", "template": f"\n\nQuestion number {k} about the order? Answer:{{?}}", **YES_NO}
        if group:
            q["group"] = group
        out.append(q)
    return out


def test_a_job_over_the_budget_is_split_and_each_piece_resends_the_content(tiny_engine):
    tk = tiny_engine.tokenizer
    content = "The parcel arrived late and the box was damaged. " * 3
    body = one_input(content, many_questions(40))
    whole = compiled(body, tk)
    split = compiled(body, tk, EngineShape(256, 65_536))
    assert len(whole.jobs) == 2  # the input and the floors
    pieces = [job for job in split.jobs if job.prefix != tk.bos]  # the rest are floor jobs
    assert len(pieces) > 1
    prefix = whole.jobs[0].prefix
    assert all(job.prefix == prefix and job.num_tokens <= 256 for job in pieces)
    assert split.processed_tokens > whole.processed_tokens


def test_groups_split_first_ungrouped_then_by_name(tiny_engine):
    queries = many_questions(6, "zeta") + many_questions(6, start=6) + many_questions(6, "alpha", start=12)
    body = one_input("A short message about an order.", queries)
    result = compiled(body, tiny_engine.tokenizer, EngineShape(128, 65_536))
    ci = result.inputs[0]
    job_of = {id(p): p.reads[0][0][0] for per_query in ci.prompts for p in per_query}
    ungrouped = min(job_of[id(ci.prompts[k][0])] for k in range(6, 12))
    alpha = min(job_of[id(ci.prompts[k][0])] for k in range(12, 18))
    zeta = min(job_of[id(ci.prompts[k][0])] for k in range(6))
    assert len({p.reads[0][0][0] for per_query in ci.prompts for p in per_query}) >= 3
    assert ungrouped < alpha < zeta


def test_a_long_input_runs_alone_up_to_the_engine_maximum(tiny_engine):
    content = "The parcel arrived late and the box was damaged. " * 20  # > half of a 256-token budget
    body = one_input(content, many_questions(10))
    result = compiled(body, tiny_engine.tokenizer, EngineShape(256, 2048), Limits(max_content_tokens=4096))
    assert len(result.inputs[0].content_tokens) > 128
    input_jobs = [job for job in result.jobs if len(job.prefix) > 1]
    assert len(input_jobs) == 1 and input_jobs[0].num_tokens > 256


def test_content_over_the_engine_maximum_is_refused(tiny_engine):
    content = "The parcel arrived late and the box was damaged. " * 20
    body = one_input(content, many_questions(1))
    with pytest.raises(Exception) as info:
        compiled(body, tiny_engine.tokenizer, EngineShape(128, 128), Limits(max_content_tokens=4096))
    assert (info.value.status, info.value.code, info.value.param) == (400, "content_too_long", "inputs.0")


def _laid_out(compiled) -> list:
    """Everything a compiled request hands the loop: each job's prefix, trie and reads, each prompt's reads."""
    jobs = [(j.prefix, j.trie.tokens, j.trie.parent, j.trie.preorder(), sorted(j.reads)) for j in compiled.jobs]
    prompts = [p.reads for ci in compiled.inputs for per_query in ci.prompts for p in per_query]
    floors = [(key, p.spellings, p.reads) for key, p in compiled.floors.items()]
    return [jobs, prompts, floors, compiled.processed_tokens]


def test_a_warm_compile_cache_compiles_exactly_as_a_cold_one(tiny_engine):
    from spinf.engine.compiler import CompileCache
    from tests.engine.test_independence import CONTENT, TARGETS, body, other_questions

    cache = CompileCache()
    shape = EngineShape(384, 1024)  # small: the second request's input is split into several jobs
    requests = [
        body(other_questions(40) + TARGETS, [("a", CONTENT), ("b", "Nothing to see here.")]),
        body(other_questions(40) + TARGETS, [("c", "Nothing to see here."), ("d", CONTENT)]),  # the same tries
        body(TARGETS, [("e", CONTENT + " The end")]),  # another cut, the same queries
    ]
    for request in requests * 2:
        parsed = tiny_engine.parse(request)
        cold = compile_request(parsed, tiny_engine.tokenizer, shape)
        warm = compile_request(parsed, tiny_engine.tokenizer, shape, cache)
        assert _laid_out(warm) == _laid_out(cold)
    # a query is keyed by its spec as sent, path included: the third request's targets sit at other paths
    assert len(cache.queries) == len(other_questions(40)) + 2 * len(TARGETS) and len(cache.tries) > 0
