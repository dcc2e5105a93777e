"""schemathesis against the real server process, driven by the document it serves (api spec D7, §2.5).

`python -m spinf serve spinf/tiny-gemma4` runs on a free loopback port (the load tests' `ServerProcess`) with an
access and a trusted token, and ``schemathesis run`` reads its ``/openapi.json``. For every operation but drain
(which would change what the others answer) it sends the document's boundary cases (the coverage phase), then
random positive and negative requests (fuzzing), as the trusted caller, whose ``limits`` and ``features`` the
document describes. Every answer must pass every built-in check but one:

- no 5xx; a documented status, content type and headers; a body valid against the documented schema;
- a request the document refuses is refused with a 4xx; one without a token gets a 401 on the routes that need
  one; a method the path does not serve gets a 405 with ``Allow``;
- every error is the §2.5 envelope with a code of its status (`schemathesis_hooks.error_envelope`, written from
  the spec, not from the document).

``positive_data_acceptance`` is off: a body the document accepts may still be refused for a rule that a schema
cannot state (options on an extraction slot, an option repeated after casefolding). The hooks'
``bodies_as_documented`` takes its place on the scoring routes (issue 33 item 9): there a body the served schema
accepts is never refused for its shape unless for a rule the document states in words, and a body it refuses gets
a 4xx. It runs within ``all`` above, and alone on random bodies of those routes below. Generation is
deterministic and the budgets fixed, so CI runs the same cases every time, in about 25 s and 15 s on 2 idle cores;
``pytest -m slow`` runs longer budgets (contrib/loadtest/README.md, "Fuzzing").
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from contrib.loadtest.harness import ROOT, ServerProcess, tiny_cache

TRUSTED = "Bearer boss"


ALL_CHECKS = ("--checks", "all", "--exclude-checks", "positive_data_acceptance", "--exclude-path", "/v0/drain")
# The scoring routes alone, against their request schemas in both directions (issue 33 item 9): the hooks' own check
# takes the place of the built-in pair, which ask less (any 4xx but 400 passes as acceptance) and more (no
# refusal for a rule the document states in words).
BODIES = ("--checks", "bodies_as_documented,not_a_server_error", "--include-path-regex", "^/v1/(score|chat|decisions)")


def schemathesis_run(
    url: str,
    max_examples: int,
    cwd: Path,
    timeout: float,
    checks: tuple[str, ...] = ALL_CHECKS,
    phases: str = "coverage,fuzzing",
) -> subprocess.CompletedProcess:
    """``schemathesis run`` with ``checks`` (this module's hooks loaded) in ``phases``, with ``max_examples``
    fuzzed cases per operation."""
    command = [str(Path(sys.executable).parent / "schemathesis"), "run", f"{url}/openapi.json"]
    command += ["--phases", phases, "--generation-deterministic", "--max-examples", str(max_examples)]
    command += [*checks, "--header", f"Authorization: {TRUSTED}", "--workers", "1", "--no-color"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), SCHEMATHESIS_HOOKS="tests.server.schemathesis_hooks")
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tiny_cache(tmp_path_factory.mktemp("hf-home"))
    folder = tmp_path_factory.mktemp("schemathesis")
    server = ServerProcess(folder, "--token", "tok", "--trusted-token", TRUSTED.split()[1], hf_home=home)
    yield server
    assert server.stop() == 0, server.output()


def check_run(done: subprocess.CompletedProcess, at_least: int, operations: int = 13) -> None:
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-8000:]
    counts = re.search(r"Test cases:\s+(\d+) generated, (\d+) passed", output)
    assert counts, output[-4000:]
    assert int(counts[1]) == int(counts[2]) >= at_least, output[-4000:]  # so a run that tested nothing fails
    assert f"Tested: {operations}" in output, output[-4000:]
    print(f"schemathesis: {counts[1]} test cases generated, {counts[2]} passed")  # shown with -s or -rP


def test_schemathesis_finds_nothing(server, tmp_path):
    check_run(schemathesis_run(server.url, 20, tmp_path, timeout=120), at_least=1000)


@pytest.mark.slow
def test_schemathesis_finds_nothing_at_length(server, tmp_path):
    check_run(schemathesis_run(server.url, 500, tmp_path, timeout=3600), at_least=3000)


@pytest.mark.slow  # over 15 s: the default run keeps to 10 minutes on 2 cores
def test_scoring_bodies_are_as_documented(server, tmp_path):
    """Random bodies only: the run of all checks above sends these routes' boundary cases already."""
    done = schemathesis_run(server.url, 15, tmp_path, timeout=120, checks=BODIES, phases="fuzzing")
    check_run(done, at_least=45, operations=3)


@pytest.mark.slow
def test_scoring_bodies_are_as_documented_at_length(server, tmp_path):
    check_run(schemathesis_run(server.url, 500, tmp_path, timeout=3600, checks=BODIES), at_least=1500, operations=3)


def test_a_trusted_caller_gets_rejected_with_invalid_json_too(server):
    """§2.4: a trusted caller gets ``rejected`` on 400 and 413 errors; these two run before authorisation (§2.6)."""
    headers = {"Authorization": TRUSTED}
    for body in (b"", b"{"):
        answer = httpx.post(f"{server.url}/v1/score", content=body, headers=headers, timeout=10)
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_json"
        assert answer.json()["rejected"]["code"] == "invalid_json"
