"""`run_bulk`: parity with one engine call, input order under concurrency, bounded work in flight, and resuming
after a crash or a SIGKILL without scoring any input twice."""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from spinf.bulk import BatchFailed, BulkInputError, run_bulk
from tests.bulk.fakes import (
    REQUEST,
    Recorder,
    as_api_input,
    assert_close,
    fake_response,
    make_inputs,
    read_jsonl,
    write_jsonl,
)

ROOT = Path(__file__).resolve().parents[2]


def ids_of(path: Path) -> list[str]:
    return [line["input_id"] for line in read_jsonl(path)]


@pytest.mark.slow  # over 15 s: the default run keeps to 10 minutes on 2 cores
def test_a_thousand_inputs_match_one_engine_call(tiny_engine, tmp_path):
    inputs = make_inputs(1000)
    src, out = write_jsonl(tmp_path / "in.jsonl", inputs), tmp_path / "out.jsonl"
    calls = []

    def scorer(body):
        calls.append(len(body["inputs"]))
        return tiny_engine.score(body)

    stats = run_bulk(REQUEST, src, out, scorer=scorer, batch_size=64)
    assert calls == [64] * 15 + [40]
    assert (stats.total, stats.skipped, stats.scored, stats.batches) == (1000, 0, 1000, 16)
    expected = tiny_engine.score({**REQUEST, "inputs": [as_api_input(item) for item in inputs]})
    warnings = collections.defaultdict(list)
    for warning in expected["warnings"]:
        warnings[warning["input_id"]].append(warning)
    lines = read_jsonl(out)
    assert [line["input_id"] for line in lines] == [item["id"] for item in inputs]
    for line, want in zip(lines, expected["results"], strict=True):
        if warnings[want["input_id"]]:
            want = {**want, "warnings": warnings[want["input_id"]]}
        assert_close(line, want, line["input_id"])


def test_results_stay_in_input_order_when_batches_finish_out_of_order(tmp_path):
    """Every even batch waits until the batch after it has finished, so the batches finish in pairs reversed,
    whatever the timing (the workers take batches in submission order, so the one waited for always runs)."""
    inputs = [{"id": f"in-{k:04d}", "content": "x" * (k % 13)} for k in range(300)]
    src, out = write_jsonl(tmp_path / "in.jsonl", inputs), tmp_path / "out.jsonl"
    num_batches = 43
    finished, done = [], [threading.Event() for _ in range(num_batches)]
    recorders = [Recorder() for _ in range(3)]

    def after_the_next(recorder):
        def scorer(body):
            k = int(body["inputs"][0]["id"].split("-")[1]) // 7
            if k % 2 == 0 and k + 1 < num_batches:
                assert done[k + 1].wait(60), f"batch {k + 1} never finished"
            response = recorder(body)
            finished.append(k)
            done[k].set()
            return response

        return scorer

    run_bulk({}, src, out, scorer=[after_the_next(r) for r in recorders], batch_size=7, concurrency=4)
    assert sorted(finished) == list(range(num_batches))
    assert all(finished.index(k + 1) < finished.index(k) for k in range(0, num_batches - 1, 2))
    assert ids_of(out) == [item["id"] for item in inputs]
    assert [len(r.calls) for r in recorders] == [15, 14, 14]  # round-robin over 43 batches
    assert read_jsonl(out)[5] == fake_response({"inputs": [as_api_input(inputs[5])]})["results"][0]


def test_at_most_two_batches_per_worker_are_in_flight(tmp_path, monkeypatch):
    """Counted at every submission against the lines written so far: both happen in the run's own thread, so the
    count does not depend on how fast the workers are."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": str(k), "content": "x"} for k in range(100)])
    in_flight, written = [], [0]

    class CountingPool(ThreadPoolExecutor):
        def submit(self, *args, **kwargs):
            in_flight.append(len(in_flight) + 1 - written[0] // 5)  # batches submitted, less those written
            return super().submit(*args, **kwargs)

    monkeypatch.setattr("spinf.bulk.run.ThreadPoolExecutor", CountingPool)
    progress = lambda done, total: written.__setitem__(0, done)  # noqa: E731
    run_bulk({}, src, tmp_path / "out.jsonl", scorer=Recorder(), batch_size=5, concurrency=2, progress=progress)
    assert in_flight == [1, 2, 3, 4] + [4] * 16  # the window fills to 2 x 2 batches and never grows past it
    assert len(ids_of(tmp_path / "out.jsonl")) == 100


def test_progress_reports_done_and_total_after_each_batch(tmp_path):
    src, out = write_jsonl(tmp_path / "in.jsonl", [{"id": str(k), "content": "x"} for k in range(25)]), tmp_path / "o"
    out.write_text("".join(json.dumps({"input_id": str(k), "queries": []}) + "\n" for k in range(5)))
    seen = []
    run_bulk({}, src, out, scorer=Recorder(), batch_size=8, resume=True, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(5, 25), (13, 25), (21, 25), (25, 25)]


def test_resume_after_a_crash_scores_each_input_once(tmp_path):
    inputs = [{"id": f"in-{k:04d}", "content": f"text {k}"} for k in range(95)]
    src, out = write_jsonl(tmp_path / "in.jsonl", inputs), tmp_path / "out.jsonl"
    first = Recorder(fail_after=3)
    with pytest.raises(RuntimeError, match="^the scorer died$"):
        run_bulk({}, src, out, scorer=first, batch_size=10)
    assert ids_of(out) == [item["id"] for item in inputs[:30]]
    second = Recorder()
    stats = run_bulk({}, src, out, scorer=second, batch_size=10, resume=True)
    assert (stats.skipped, stats.scored) == (30, 65)
    assert first.counts + second.counts == collections.Counter(item["id"] for item in inputs)
    assert ids_of(out) == [item["id"] for item in inputs]


def test_resume_after_sigkill_and_a_partial_line(tmp_path):
    inputs = [{"id": f"in-{k:04d}", "content": f"text {k}"} for k in range(200)]
    src, out, log = write_jsonl(tmp_path / "in.jsonl", inputs), tmp_path / "out.jsonl", tmp_path / "scored.log"
    command = [sys.executable, "-m", "tests.bulk.slow_run", str(src), str(out), str(log), "100"]
    proc = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120  # a guard against a hang, not a measure: the batches from 100 never end
        while not (out.exists() and out.read_bytes().count(b"\n") >= 100):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the run never wrote 100 lines"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    assert ids_of(out) == [item["id"] for item in inputs[:100]]
    with out.open("ab") as file:  # as if the process had died in the middle of a write
        file.write(b'{"input_id":"in-0100","queries":[{"id":"si')
    first = collections.Counter(log.read_text().split())
    second = Recorder()
    run_bulk({}, src, out, scorer=second, batch_size=10, concurrency=2, resume=True)
    assert first + second.counts == collections.Counter(item["id"] for item in inputs)
    lines = read_jsonl(out)  # every line parses: the partial one is gone
    assert [line["input_id"] for line in lines] == [item["id"] for item in inputs]
    assert lines == fake_response({"inputs": [as_api_input(item) for item in inputs]})["results"]


def test_a_refused_batch_stops_the_run_and_names_the_input(tiny_engine, tmp_path):
    inputs = make_inputs(30)
    inputs[17]["query_ids"] = ["pos", "nope"]
    src, out = write_jsonl(tmp_path / "in.jsonl", inputs), tmp_path / "out.jsonl"
    with pytest.raises(BatchFailed) as info:
        run_bulk(REQUEST, src, out, scorer=tiny_engine.score, batch_size=8)
    failed = info.value
    assert (failed.error.code, failed.param, failed.culprit.id) == (
        "unknown_query_id",
        "inputs.17.query_ids.1",
        "in-0017",
    )
    assert failed.where == "input 'in-0017' (line 18)"
    assert "rejected" not in failed.envelope()
    assert ids_of(out) == [item["id"] for item in inputs[:16]]


def test_nothing_is_scored_when_a_line_is_bad(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "content": "x"}\n{"id": "b", "content": "x"}\n{"id": "c"\n')
    scorer = Recorder()
    with pytest.raises(BulkInputError, match=r"line 3: not valid JSON"):
        run_bulk({}, src, tmp_path / "out.jsonl", scorer=scorer, batch_size=1)
    assert scorer.calls == []
