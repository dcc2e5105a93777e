"""``spinf-serve score`` through `spinf.bulk.main`: one body (api spec §10) or an inputs file, exit statuses, and
Ctrl-C on the real command (a subprocess sent SIGINT)."""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from spinf.bulk import main
from tests.bulk.fakes import REQUEST, FakeServer, fake_response, make_inputs, read_jsonl, write_jsonl

ROOT = Path(__file__).resolve().parents[2]

SETTINGS = types.SimpleNamespace(server=types.SimpleNamespace(debug=False))  # the engine itself is replaced here


def args(**given) -> argparse.Namespace:
    defaults = {
        "request": None,
        "model": None,
        "inputs": None,
        "output": None,
        "url": None,
        "batch_size": 64,
        "concurrency": 4,
        "resume": False,
        "no_progress": False,
    }
    return argparse.Namespace(**{**defaults, **given})


@pytest.fixture
def run(tiny_engine):
    def call(**given) -> int:
        return main(args(**given), SETTINGS, make_engine=lambda: tiny_engine)

    return call


def test_one_body_prints_the_response(run, tmp_path, capsys, tiny_engine):
    body = {**REQUEST, "messages": [{"role": "user", "content": "great film"}], "endpoint": "e"}
    path = write_jsonl(tmp_path / "req.json", [body])
    assert run(request=path) == 0
    response = json.loads(capsys.readouterr().out)
    assert (response["object"], response["endpoint"], response["results"][0]["input_id"]) == ("score", "e", "0")
    assert response["results"] == tiny_engine.score(body)["results"]


def test_the_request_is_read_from_stdin_or_given_inline(run, capsys, monkeypatch, tiny_engine):
    body = {**REQUEST, "messages": [{"role": "user", "content": "great film"}]}
    expected = tiny_engine.score(body)["results"]
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(json.dumps(body).encode())))
    assert run(request="-") == 0
    assert json.loads(capsys.readouterr().out)["results"] == expected
    assert run(request=" " + json.dumps(body)) == 0  # a shell's quoting may leave a leading space
    assert json.loads(capsys.readouterr().out)["results"] == expected


@pytest.mark.parametrize(
    ("request_argument", "stdin", "message"),
    [
        ("-", b"{", "the request on stdin is not valid JSON: "),
        ("-", b"[1]", "the request on stdin must be a JSON object, not list"),
        ('{"scoring": ', b"", "the inline request is not valid JSON: "),
    ],
)
def test_a_bad_request_from_stdin_or_inline_is_one_line(run, capsys, monkeypatch, request_argument, stdin, message):
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(stdin)))
    assert run(request=request_argument) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"spinf-serve score: {message}") and err.count("\n") == 1


def test_an_api_error_prints_the_envelope_without_rejected(run, tmp_path, capsys):
    path = write_jsonl(tmp_path / "req.json", [{**REQUEST, "inputs": [{"id": "a", "messages": "no"}]}])
    assert run(request=path) == 1
    captured = capsys.readouterr()
    envelope = json.loads(captured.err)
    assert captured.out == "" and envelope.keys() == {"error", "request_id"}
    assert (envelope["error"]["type"], envelope["error"]["code"]) == ("invalid_request", "invalid_field")
    assert envelope["request_id"].startswith("scr_")


def test_bulk_mode_writes_the_output_without_a_bar_off_a_terminal(run, tmp_path, capsys):
    inputs = make_inputs(20)
    src, out = write_jsonl(tmp_path / "in.jsonl", inputs), tmp_path / "out.jsonl"
    req = write_jsonl(tmp_path / "req.json", [REQUEST])
    assert run(request=req, inputs=src, output=out, batch_size=8) == 0
    assert [line["input_id"] for line in read_jsonl(out)] == [item["id"] for item in inputs]
    err = capsys.readouterr().err
    assert "\r" not in err and err.startswith(f"spinf-serve score: wrote 20 results to {out} in ")
    assert run(request=req, inputs=src, output=out, resume=True) == 0
    assert capsys.readouterr().err.endswith("(20 were there already)\n")


def test_bulk_mode_refuses_a_request_with_inputs(run, tmp_path, capsys):
    req = write_jsonl(tmp_path / "req.json", [{**REQUEST, "inputs": [{"id": "a", "messages": []}]}])
    src = write_jsonl(tmp_path / "in.jsonl", make_inputs(2))
    assert run(request=req, inputs=src, output=tmp_path / "out.jsonl") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"spinf-serve score: the request file '{req}' holds 'inputs': with --inputs, the request")
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"output": "o.jsonl"}, "--output needs --inputs FILE.jsonl"),
        ({"output": "o.jsonl", "resume": True}, "--output and --resume need --inputs FILE.jsonl"),
        ({"inputs": "i.jsonl"}, "--inputs needs --output FILE.jsonl"),
        (
            {"request": "missing.json", "inputs": "i.jsonl", "output": "o"},
            "cannot read the request file 'missing.json'",
        ),
    ],
)
def test_bad_arguments_exit_2(run, capsys, given, message):
    assert run(**{"request": "r.json", **given}) == 2
    assert capsys.readouterr().err.startswith(f"spinf-serve score: {message}")


def test_a_bad_line_stops_before_the_engine_loads(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "content": "x"}\n{"id": "a", "content": "y"}\n')
    req = write_jsonl(tmp_path / "req.json", [REQUEST])

    def no_engine():
        raise AssertionError("the engine must not load before the inputs are checked")

    assert main(args(request=req, inputs=src, output=tmp_path / "o.jsonl"), SETTINGS, make_engine=no_engine) == 2
    assert capsys.readouterr().err == f"spinf-serve score: {src} line 2: input id 'a' is already on line 1\n"


def test_a_model_that_cannot_load_is_one_line_and_status_2(tmp_path, capsys):
    from spinf.settings import load_settings

    req = write_jsonl(tmp_path / "req.json", [{**REQUEST, "messages": [{"content": "x"}]}])
    settings = load_settings({"model": "no-such-model"}, {}, manifest_defaults=lambda model: {})
    assert main(args(request=req), settings) == 2
    err = capsys.readouterr().err
    assert err.startswith("spinf-serve score: ") and "no-such-model" in err and err.count("\n") == 1


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("no_progress", [False, True])
def test_the_bar_shows_on_a_terminal_unless_turned_off(run, tmp_path, monkeypatch, no_progress):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    src, out = write_jsonl(tmp_path / "in.jsonl", make_inputs(6)), tmp_path / "out.jsonl"
    req = write_jsonl(tmp_path / "req.json", [REQUEST])
    assert run(request=req, inputs=src, output=out, batch_size=2, no_progress=no_progress) == 0
    shown = terminal.getvalue()
    if no_progress:
        assert "\r" not in shown
    else:
        assert shown.startswith("\r0/6 [") and "\r6/6 [" in shown and "items/s ETA" in shown


def test_a_refused_input_names_its_line_and_counts_params_over_the_file(run, tmp_path, capsys):
    inputs = make_inputs(12)
    inputs[9]["query_ids"] = ["nope"]
    src, out = write_jsonl(tmp_path / "in.jsonl", inputs), tmp_path / "out.jsonl"
    assert run(request=write_jsonl(tmp_path / "req.json", [REQUEST]), inputs=src, output=out, batch_size=4) == 1
    context, envelope = capsys.readouterr().err.splitlines()
    assert context == "spinf-serve score: input 'in-0009' (line 10) was refused:"
    error = json.loads(envelope)["error"]
    assert (error["code"], error["param"]) == ("unknown_query_id", "inputs.9.query_ids.0")
    assert len(read_jsonl(out)) == 8


def test_urls_get_the_key_from_spinf_api_key(tiny_engine, tmp_path, monkeypatch, capsys):
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPINF_API_KEY", "sk-test")
    src, out = write_jsonl(tmp_path / "in.jsonl", make_inputs(10)), tmp_path / "out.jsonl"
    req = write_jsonl(tmp_path / "req.json", [REQUEST])

    def no_engine():
        raise AssertionError("--url must not build an engine")

    with FakeServer(tiny_engine) as server:
        given = args(request=req, inputs=src, output=out, url=[server.url], batch_size=3, concurrency=2)
        assert main(given, SETTINGS, make_engine=no_engine) == 0
    assert [auth for _, auth, _ in server.seen] == ["Bearer sk-test"] * 4
    assert len(read_jsonl(out)) == 10


def test_a_single_body_is_scored_as_a_trusted_caller(tmp_path, capsys, tiny_engine):
    body = {
        "messages": [{"content": "Refund me."}],
        "scoring": {"queries": [{"id": "q", "template": "\n\nRefund? Answer:{?}", "options": [" yes", " no"]}]},
        "limits": {"max_options": 1},  # honoured: the command line is the server's own operator
    }
    req = write_jsonl(tmp_path / "req.json", [body])
    assert main(args(request=req), SETTINGS, make_engine=lambda: tiny_engine) == 1
    err = capsys.readouterr().err
    assert '"code": "too_many_options"' in err and "rejected" not in err


# -- Ctrl-C -----------------------------------------------------------------------------------------------------------


class Stalling:
    """An "engine" for `FakeServer`: answers the first ``answered`` calls, then holds each call until ``release``."""

    def __init__(self, answered: int):
        self.answered = answered
        self.calls = 0
        self.release = threading.Event()

    def score(self, body: dict) -> dict:
        self.calls += 1
        if self.calls > self.answered:
            self.release.wait(60)
        return fake_response(body)


AS_FROM_A_SHELL = (
    "import os, signal, sys; signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, '-m', 'spinf', *sys.argv[1:]])"
)


def interrupt(argv: list[str], tmp_path: Path, ready) -> subprocess.CompletedProcess:
    """Run ``spinf-serve`` (as ``python -m spinf``) with ``argv`` until ``ready()``, then send it SIGINT."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPINF_") and "proxy" not in k.lower()}
    env["HF_HOME"] = str(tmp_path / "hf-home")
    # the command starts as from a shell: SIGINT unblocked and at its default, whatever an earlier test in this
    # worker process left in the signal mask or dispositions a child inherits (the whole default run, never a file
    # alone, once left the command deaf to Ctrl-C)
    proc = subprocess.Popen(
        [sys.executable, "-c", AS_FROM_A_SHELL, *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120  # a guard against a hang, not a measure
        while not ready():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the command never got ready to be interrupted"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        # Ctrl-C must not wait for the call the server holds (until released: never); 30 s for a loaded machine
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())


def test_ctrl_c_in_bulk_mode_is_one_line_saying_what_is_done_and_how_to_resume(tmp_path):
    inputs = make_inputs(100)
    src, out = write_jsonl(tmp_path / "in.jsonl", inputs), tmp_path / "out.jsonl"
    req = write_jsonl(tmp_path / "req.json", [REQUEST])
    stalling = Stalling(answered=3)
    with FakeServer(stalling) as server:
        argv = ["score", str(req), "--inputs", str(src), "--output", str(out), "--url", server.url]
        argv += ["--batch-size", "10", "--concurrency", "1"]

        def ready() -> bool:  # the fourth call is held and the three before it are written, whatever the timing
            return len(server.seen) == 4 and out.is_file() and out.read_bytes().count(b"\n") == 30

        try:
            done = interrupt(argv, tmp_path, ready)
        finally:
            stalling.release.set()
    assert (done.returncode, done.stdout) == (130, "")
    assert done.stderr == (
        f"spinf-serve score: interrupted: 30 of 100 inputs have their results in {out} (30 written by this run); "
        "run the same command with --resume to score the rest\n"
    )
    assert [line["input_id"] for line in read_jsonl(out)] == [item["id"] for item in inputs[:30]]


def test_ctrl_c_on_a_single_body_is_one_line(tmp_path):
    req = write_jsonl(tmp_path / "req.json", [{**REQUEST, "inputs": [{"id": "a", "messages": [{"content": "hi"}]}]}])
    stalling = Stalling(answered=0)
    with FakeServer(stalling) as server:
        try:
            done = interrupt(["score", str(req), "--url", server.url], tmp_path, lambda: len(server.seen) == 1)
        finally:
            stalling.release.set()
    assert (done.returncode, done.stdout) == (130, "")
    assert done.stderr == f"spinf-serve score: interrupted: the request file '{req}' was not scored\n"


def test_ctrl_c_while_the_inputs_are_checked_says_nothing_was_written(run, tmp_path, capsys, monkeypatch):
    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr("spinf.bulk.run.scan_inputs", interrupted)
    src, out = write_jsonl(tmp_path / "in.jsonl", make_inputs(3)), tmp_path / "out.jsonl"
    assert run(request=write_jsonl(tmp_path / "req.json", [REQUEST]), inputs=src, output=out) == 130
    assert (
        capsys.readouterr().err
        == f"spinf-serve score: interrupted before scoring began: nothing was written to {out}\n"
    )
