"""The output file: result lines with their warnings, the writer, and reading a previous run back."""

from __future__ import annotations

import json

import pytest

from spinf.bulk.errors import BulkError, BulkInputError
from spinf.bulk.inputs import InputIndex, Item
from spinf.bulk.output import OutputWriter, check_fresh, dumps, read_done, result_lines


def item(index: int, input_id: str) -> Item:
    return Item(index, index + 1, input_id, {"id": input_id, "messages": []}, 10)


def result(input_id: str) -> dict:
    return {"input_id": input_id, "queries": [{"id": "q", "combinations": []}]}


def test_each_line_is_its_result_plus_its_own_warnings():
    batch = [item(40, "a"), item(41, "b"), item(42, "c")]
    mass = {"code": "low_option_mass", "input_id": "c", "query_id": "q", "message": "low"}
    join = {"code": "join_not_merged", "message": "not merged", "param": "inputs.1"}
    response = {"results": [result("a"), {**result("b"), "packs": []}, result("c")], "warnings": [mass, join]}
    lines = [json.loads(line) for line in result_lines(batch, response)]
    assert lines == [
        result("a"),
        {**result("b"), "packs": [], "warnings": [{**join, "param": "inputs.41"}]},  # counted over the file
        {**result("c"), "warnings": [mass]},
    ]


def test_lines_are_whole_compact_utf8_json():
    lines = result_lines([item(0, "ü")], {"results": [result("ü")], "warnings": []})
    assert lines == ['{"input_id":"ü","queries":[{"id":"q","combinations":[]}]}\n'.encode()]
    assert dumps("\ud800") == '"\\ud800"'  # a lone surrogate cannot be UTF-8: escaped instead


@pytest.mark.parametrize(
    ("response", "problem"),
    [
        (
            {"results": [result("a")]},
            r"^the scorer answered 1 results for a batch of 2 inputs \(starting at input 'a'",
        ),
        ({"error": {}}, r"^the scorer answered no results for a batch of 2 inputs"),
        (
            {"results": [result("a"), result("x")]},
            r"^the scorer's result for input 'b' \(line 2\) names another input$",
        ),
    ],
)
def test_a_response_that_does_not_fit_the_batch_is_an_error(response, problem):
    with pytest.raises(BulkError, match=problem):
        result_lines([item(0, "a"), item(1, "b")], response)


INDEX = InputIndex({"a": 1, "b": 2, "c": 3})


def test_read_done_cuts_a_partial_last_line(tmp_path):
    path = tmp_path / "out.jsonl"
    whole = b'{"input_id":"a","queries":[]}\n{"input_id":"b","queries":[]}\n'
    path.write_bytes(whole + b'{"input_id":"c","quer')
    assert read_done(path, INDEX) == {"a", "b"}
    assert path.read_bytes() == whole


def test_read_done_cuts_a_partial_only_line_longer_than_a_chunk(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"input_id":"a","queries":["' + b"x" * 200_000)
    assert read_done(path, INDEX) == set()
    assert path.read_bytes() == b""


def test_read_done_of_a_missing_file_is_empty(tmp_path):
    assert read_done(tmp_path / "none.jsonl", INDEX) == set()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"input_id":"a"}\nnot json\n', r"line 2: not a result line of spinf-serve score$"),
        (b'{"input_id":"a"}\n{"input_id":"z"}\n', r"line 2: input id 'z' is not in the inputs file$"),
        (b'{"input_id":"a"}\n{"input_id":"b"}\n{"input_id":"a"}\n', r": input id 'a' is on line 1 and line 3$"),
    ],
)
def test_read_done_refuses_a_foreign_output(tmp_path, content, problem):
    path = tmp_path / "out.jsonl"
    path.write_bytes(content)
    with pytest.raises(BulkInputError, match=problem):
        read_done(path, INDEX)


def test_a_fresh_run_refuses_a_non_empty_output(tmp_path):
    path = tmp_path / "out.jsonl"
    check_fresh(path)
    path.write_bytes(b"")
    check_fresh(path)
    path.write_bytes(b"{}\n")
    with pytest.raises(BulkInputError, match=r"^the output file '.*' is not empty: pass --resume to continue it"):
        check_fresh(path)


def test_the_writer_appends(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(b"1\n")
    with OutputWriter(path) as out:
        out.write([b"2\n", b"3\n"])
        assert path.read_bytes() == b"1\n2\n3\n"  # flushed line by line, before close
    assert path.read_bytes() == b"1\n2\n3\n"
