"""The inputs file: checking every line (every bad one reported), ids, ``content``, and batching by count and by
bytes."""

from __future__ import annotations

import json

import pytest

from spinf.bulk.errors import BulkInputError
from spinf.bulk.inputs import MAX_BODY_BYTES, MAX_LISTED, batch_budget, batches, check_shared, read_items, scan_inputs
from tests.bulk.fakes import write_jsonl

MSG = [{"role": "user", "content": "hi"}]


def write_lines(path, lines: list[str]):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ('{"id": "b", "content": "x"', r"not valid JSON \(Expecting ',' delimiter at column 27\)"),
        ('["b"]', "an input must be a JSON object, not list"),
        ('{"id": 7, "content": "x"}', "'id' must be a string, got 7"),
        ('{"content": "x"}', "'id' must be a string, got null"),
        ('{"id": "b"}', r"give exactly one of 'content' \(a string or content parts\) and 'messages'"),
        ('{"id": "b", "content": "x", "messages": []}', r"give exactly one of 'content' .* and 'messages'"),
        ('{"id": "b", "content": 3}', "'content' must be a string or a list of content parts"),
    ],
)
def test_a_malformed_line_is_named_by_its_number(tmp_path, bad, problem):
    path = write_lines(tmp_path / "in.jsonl", ['{"id": "a", "content": "x"}', "", bad])
    with pytest.raises(BulkInputError, match=rf"^{path} line 3: {problem}$"):
        scan_inputs(path)


def test_a_line_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"id": "a", "content": "x"}\n{"id": "b\xff"}\n')
    with pytest.raises(
        BulkInputError, match=rf"^{path} line 2: not valid JSON \('utf-8' codec can't decode byte 0xff"
    ):
        scan_inputs(path)


def test_duplicate_ids_name_both_lines(tmp_path):
    rows = [{"id": k, "content": "x"} for k in ("a", "b", "c", "b")]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    with pytest.raises(BulkInputError, match=rf"^{path} line 4: input id 'b' is already on line 2$"):
        scan_inputs(path)


def test_every_bad_line_is_reported_with_its_number(tmp_path):
    lines = ['{"id": "a", "content": "x"}', '{"id": 7, "content": "x"}', "", '{"id": "a", "content": "y"}']
    lines += ['{"id": "b", "content": "x"}', "[]", '{"id": "c", "content": "x", "messages": []}', '{"id": "b"']
    path = write_lines(tmp_path / "in.jsonl", lines)
    with pytest.raises(BulkInputError) as caught:
        scan_inputs(path)
    assert str(caught.value).splitlines() == [
        f"{path}: 5 bad lines, nothing was scored:",
        "  line 2: 'id' must be a string, got 7",
        "  line 4: input id 'a' is already on line 1",
        "  line 6: an input must be a JSON object, not list",
        "  line 7: give exactly one of 'content' (a string or content parts) and 'messages'",
        "  line 8: not valid JSON (Expecting ',' delimiter at column 11)",
    ]


def test_past_the_cap_bad_lines_are_counted_not_listed(tmp_path):
    lines = ['{"id": "ok", "content": "x"}'] + [f'{{"id": {k}, "content": "x"}}' for k in range(MAX_LISTED + 15)]
    path = write_lines(tmp_path / "in.jsonl", lines)
    with pytest.raises(BulkInputError) as caught:
        scan_inputs(path)
    got = str(caught.value).splitlines()
    assert MAX_LISTED == 20 and len(got) == 1 + MAX_LISTED + 1
    assert got[0] == f"{path}: 35 bad lines, nothing was scored:"
    assert got[1] == "  line 2: 'id' must be a string, got 0" and got[20] == "  line 21: 'id' must be a string, got 19"
    assert got[-1] == "  and 15 more"


def test_an_empty_inputs_file_is_an_error(tmp_path):
    path = write_lines(tmp_path / "in.jsonl", ["", "  "])
    with pytest.raises(BulkInputError, match=r"^the inputs file '.*' holds no input$"):
        scan_inputs(path)


def test_a_missing_inputs_file_is_an_error(tmp_path):
    with pytest.raises(BulkInputError, match=r"^cannot read the inputs file '.*nope.jsonl': "):
        scan_inputs(tmp_path / "nope.jsonl")


def test_content_becomes_one_user_message_and_other_keys_pass_through(tmp_path):
    parts = [{"type": "text", "text": "hello"}]
    rows = [
        {"id": "a", "content": "hello", "query_ids": ["q"], "parameters": {"lang": "en"}},
        {"id": "b", "content": parts},
        {"id": "c", "messages": MSG, "queries": [{"id": "own"}]},
    ]
    items = list(read_items(write_jsonl(tmp_path / "in.jsonl", rows)))
    assert [item.body for item in items] == [
        {
            "id": "a",
            "messages": [{"role": "user", "content": "hello"}],
            "query_ids": ["q"],
            "parameters": {"lang": "en"},
        },
        {"id": "b", "messages": [{"role": "user", "content": parts}]},
        {"id": "c", "messages": MSG, "queries": [{"id": "own"}]},
    ]


def test_blank_lines_are_skipped_but_line_numbers_stay_physical(tmp_path):
    path = write_lines(
        tmp_path / "in.jsonl", ["", '{"id": "a", "content": "x"}', "   ", '{"id": "b", "content": "y"}']
    )
    assert [(item.index, item.line, item.id) for item in read_items(path)] == [(0, 2, "a"), (1, 4, "b")]


def test_item_size_is_its_json_on_the_wire_plus_a_comma(tmp_path):
    (item,) = read_items(write_jsonl(tmp_path / "in.jsonl", [{"id": "é", "content": "ü" * 10}]))
    assert item.size == len(json.dumps(item.body).encode()) + 1
    assert item.size == len(json.dumps(item.body, ensure_ascii=False).encode()) + 1 + 11 * 4


def test_batches_by_count(tmp_path):
    rows = [{"id": str(k), "content": "x"} for k in range(10)]
    items = read_items(write_jsonl(tmp_path / "in.jsonl", rows))
    assert [[item.id for item in batch] for batch in batches(items, 3, 10**6)] == [
        ["0", "1", "2"],
        ["3", "4", "5"],
        ["6", "7", "8"],
        ["9"],
    ]


def test_batches_by_bytes_and_a_larger_input_alone(tmp_path):
    rows = [{"id": str(k), "content": "x" * 300} for k in range(5)]
    rows.insert(2, {"id": "big", "content": "x" * 5000})
    items = list(read_items(write_jsonl(tmp_path / "in.jsonl", rows)))
    budget = 2 * items[0].size + 10  # two small ones fit, a third does not
    got = [[item.id for item in batch] for batch in batches(items, 64, budget)]
    assert got == [["0", "1"], ["big"], ["2", "3"], ["4"]]
    for batch in batches(items, 64, budget):
        assert len(batch) == 1 or sum(item.size for item in batch) <= budget


def test_the_batch_budget_leaves_room_for_the_shared_part():
    assert batch_budget({"scoring": {}}) == 1_000_000
    big = {"scoring": {"queries": [{"id": "q", "template": "x" * 1_500_000}]}}
    shared = len(json.dumps(big))
    assert shared + batch_budget(big) < MAX_BODY_BYTES
    huge = {"scoring": {"queries": [{"id": "q", "template": "x" * MAX_BODY_BYTES}]}}
    with pytest.raises(BulkInputError, match=r"^the shared request part alone is [\d,]+ bytes of JSON; "):
        batch_budget(huge)


@pytest.mark.parametrize("key", ["inputs", "messages"])
def test_the_shared_part_must_not_hold_inputs(key):
    with pytest.raises(BulkInputError, match=rf"^the request holds '{key}': with --inputs, the request file holds"):
        check_shared({"scoring": {}, key: []})
