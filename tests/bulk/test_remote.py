"""Scoring through servers: retries of 429/5xx/connection errors as spinf-client does, refusals, several URLs.

The servers are `FakeServer` on 127.0.0.1 scoring with the tiny engine; ``sleep`` is recorded, not slept.
"""

from __future__ import annotations

import socket

import pytest

from spinf.bulk import BatchFailed, BulkError, RemoteApiError, http_scorers, run_bulk
from spinf.bulk.remote import retry_wait, score_url
from tests.bulk.fakes import REQUEST, FakeServer, as_api_input, assert_close, make_inputs, read_jsonl, write_jsonl

BUSY = (429, {"Retry-After": "0"}, {"error": {"type": "rate_limited", "code": "concurrency_limit", "message": "busy"}})


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def body(inputs: list[dict]) -> dict:
    return {**REQUEST, "inputs": [as_api_input(item) for item in inputs]}


def test_429_is_retried_then_answered(tiny_engine):
    inputs = make_inputs(6)
    waits = []
    with FakeServer(tiny_engine, [BUSY, BUSY]) as server:
        (scorer,) = http_scorers([server.url], sleep=waits.append)
        response = scorer(body(inputs))
    assert len(server.seen) == 3 and all(path == "/v1/score" for path, _, _ in server.seen)
    assert len(waits) == 2 and all(0 <= w < 1 for w in waits)  # Retry-After: 0, plus up to 1 s of jitter
    assert_close(response["results"], tiny_engine.score(body(inputs))["results"])


@pytest.mark.parametrize(
    ("status", "headers", "low"),
    [
        (503, {}, 1.0),
        (500, {"Retry-After": "soon"}, 1.0),
        (503, {"Retry-After": "500"}, 120.0),
        (429, {"Retry-After": "2.5"}, 2.5),
    ],
)
def test_the_wait_follows_retry_after_or_backs_off(tiny_engine, status, headers, low):
    waits = []
    with FakeServer(tiny_engine, [(status, headers, {"error": {}})]) as server:
        http_scorers([server.url], sleep=waits.append)[0](body(make_inputs(1)))
    assert len(waits) == 1 and low <= waits[0] < low + 1


def test_retry_wait_is_the_clients_rule():
    assert [retry_wait(None, k) for k in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert (retry_wait("7", 3), retry_wait("0.5", 0), retry_wait("1e3", 0), retry_wait("-1", 2)) == (7, 0.5, 1, 4)


def test_retries_are_spent_after_six_tries(tiny_engine):
    waits = []
    with FakeServer(tiny_engine, [(503, {}, {"error": {"code": "warming_up"}})] * 6) as server:
        scorer = http_scorers([server.url + "/"], sleep=waits.append)[0]
        with pytest.raises(
            BulkError, match=r"^POST http://127\.0\.0\.1:\d+/v1/score failed 6 times; the last answer: HTTP 503: "
        ):
            scorer(body(make_inputs(1)))
    assert len(server.seen) == 6
    assert [int(w) for w in waits] == [1, 2, 4, 8, 16]


def test_a_refused_connection_is_retried_like_a_503():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    waits = []
    scorer = http_scorers([f"http://127.0.0.1:{port}"], tries=3, sleep=waits.append)[0]
    with pytest.raises(BulkError, match=r"failed 3 times; the last answer: URLError: .*refused"):
        scorer({"inputs": []})
    assert len(waits) == 2


def test_a_400_stops_at_once_with_the_servers_code(tiny_engine, tmp_path):
    inputs = make_inputs(20)
    inputs[13]["query_ids"] = ["nope"]
    src, out = write_jsonl(tmp_path / "in.jsonl", inputs), tmp_path / "out.jsonl"
    waits = []
    with FakeServer(tiny_engine) as server:
        scorers = http_scorers([server.url], sleep=waits.append)
        with pytest.raises(BatchFailed) as info:
            run_bulk(REQUEST, src, out, scorer=scorers, batch_size=5)
    failed = info.value
    assert isinstance(failed.error, RemoteApiError) and waits == []
    assert (failed.error.status, failed.error.code, failed.error.param) == (
        400,
        "unknown_query_id",
        "inputs.3.query_ids.0",
    )
    assert failed.param == "inputs.13.query_ids.0" and failed.culprit.id == "in-0013"
    assert failed.envelope()["request_id"] == "scr_fake"
    # the fourth batch may have been sent while the third was out (two batches in flight per worker), not later ones
    assert [len(ids) for _, _, ids in server.seen] in ([5, 5, 5], [5, 5, 5, 5])
    assert len(read_jsonl(out)) == 10


def test_a_non_json_refusal_keeps_the_start_of_the_body(tiny_engine):
    with FakeServer(tiny_engine, [(404, {}, b"<html>nope</html>")]) as server:
        with pytest.raises(RemoteApiError) as info:
            http_scorers([server.url])[0](body(make_inputs(1)))
    # FakeServer labels everything application/json; an unparsable body still gives code "error" and its text
    assert (info.value.status, info.value.code, info.value.message) == (404, "error", "<html>nope</html>")


def test_two_urls_are_both_used_and_the_output_is_in_order(tiny_engine, tmp_path):
    """Batch k goes to server k % 2, and a retry to the same server. Server one refuses batch 4 (inputs 16-19)
    once, whichever of its three concurrent calls comes first, so nothing here depends on timing."""
    inputs = make_inputs(40)
    src, out = write_jsonl(tmp_path / "in.jsonl", inputs), tmp_path / "out.jsonl"
    with FakeServer(tiny_engine, once_for={"in-0016": BUSY}) as one, FakeServer(tiny_engine) as two:
        scorers = http_scorers([one.url, two.url], token="k-123", sleep=lambda s: None)
        run_bulk(REQUEST, src, out, scorer=scorers, batch_size=4, concurrency=3)
    batches = [[item["id"] for item in inputs[k : k + 4]] for k in range(0, 40, 4)]
    assert sorted(ids for _, _, ids in one.seen) == sorted([*batches[0::2], batches[4]])
    assert sorted(ids for _, _, ids in two.seen) == batches[1::2]
    assert {auth for server in (one, two) for _, auth, _ in server.seen} == {"Bearer k-123"}
    expected = tiny_engine.score(body(inputs))["results"]
    assert_close([{k: v for k, v in line.items() if k != "warnings"} for line in read_jsonl(out)], expected)


def test_score_url():
    assert score_url("http://h:8000") == "http://h:8000/v1/score"
    assert score_url("https://h/base/") == "https://h/base/v1/score"
    assert score_url("http://h/v1/score") == "http://h/v1/score"
    with pytest.raises(BulkError, match=r"^--url 'h:8000' is not an http:// or https:// URL$"):
        score_url("h:8000")
