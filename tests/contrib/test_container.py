"""contrib/docker/Dockerfile, checked without Docker (no image can be built or pulled here).

The fast tests read the file: the base image, the entrypoint, the probe, the volume, and that every file it copies
is in the build context that .dockerignore leaves. The slow one runs the file's own install step in a fresh virtual
environment (CPU torch and the other dependencies come from the test run's environment, through a ``.pth`` line;
the project itself is built and installed by the Dockerfile's command line), then starts its entrypoint on the tiny
model from a folder, as ``--model-dir /model`` would in the container, with ``--port`` after the image name, and
checks ``/readyz``, the HEALTHCHECK's probe (which must find that port) and the preStop drain script the image
carries. The probe's reading of a server's address is checked on fake ``/proc`` entries.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import httpx
import pytest

from contrib.docker import healthcheck as healthcheck_probe
from contrib.loadtest.harness import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "contrib" / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


def instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comment lines dropped, continued lines joined."""
    found, current = [], ""
    for line in path.read_text().splitlines():
        if line.strip().startswith("#") or not line.strip():
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        keyword, _, rest = current.strip().partition(" ")
        found.append((keyword.upper(), " ".join(rest.split())))
        current = ""
    return found


def arguments(keyword: str) -> list[str]:
    return [rest for name, rest in instructions() if name == keyword]


def environment() -> dict[str, str]:
    """The image's ENV, with each ``${ARG}`` replaced by the ARG's default."""
    defaults = dict(arg.split("=", 1) for arg in arguments("ARG") if "=" in arg)
    env = {}
    for line in arguments("ENV"):
        for pair in shlex.split(line):
            name, value = pair.split("=", 1)
            env[name] = re.sub(r"\$\{(\w+)\}", lambda m: defaults.get(m[1], ""), value)
    return env


def copies() -> list[tuple[list[str], str]]:
    """Each COPY as (sources, destination), its ``--flags`` left out."""
    found = []
    for line in arguments("COPY"):
        words = [word for word in shlex.split(line) if not word.startswith("--")]
        found.append((words[:-1], words[-1]))
    return found


def healthcheck() -> list[str]:
    (line,) = arguments("HEALTHCHECK")
    return json.loads(line.split(" CMD ", 1)[1])


def install_command() -> str:
    (command,) = [line for line in arguments("RUN") if "pip install" in line]
    return command


def test_the_image_is_python_3_12_slim_and_starts_the_server():
    assert arguments("FROM") == ["python:3.12-slim"]
    (entrypoint,) = arguments("ENTRYPOINT")
    assert json.loads(entrypoint) == ["spinf-serve", "serve"]
    assert arguments("CMD") == []  # the model and flags come after the image name
    assert arguments("VOLUME") == ["/root/.cache"]
    env = environment()
    assert env["HF_HOME"].startswith("/root/.cache/") and env["TRITON_CACHE_DIR"].startswith("/root/.cache/")
    assert re.search(r"\bpip install (--\S+ )*torch==[\d.]+ \.$", install_command())


def test_the_healthcheck_runs_the_probe_the_image_carries():
    (line,) = arguments("HEALTHCHECK")
    assert re.search(r"--start-period=\d+m", line)
    (command,) = healthcheck()
    assert (["contrib/docker/healthcheck.py"], f"/usr/local/bin/{command}") in copies()


def _process(proc: Path, pid: int, cmdline: list[str], environ: dict[str, str], cwd: Path) -> None:
    """A fake ``/proc/PID`` with the three entries the probe reads."""
    folder = proc / str(pid)
    folder.mkdir(parents=True)
    (folder / "cmdline").write_bytes(b"".join(word.encode() + b"\0" for word in cmdline))
    (folder / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items()))
    (folder / "cwd").symlink_to(cwd)


ENTRYPOINT = ["/usr/local/bin/python3.12", "/usr/local/bin/spinf-serve", "serve"]


@pytest.mark.parametrize(
    ("words", "environ", "config", "url"),
    [
        pytest.param([], {}, None, "http://127.0.0.1:8000/readyz", id="default"),
        pytest.param(["tiny", "--port", "9001"], {"SPINF_PORT": "9"}, None, "http://127.0.0.1:9001/readyz", id="flag"),
        pytest.param(["tiny"], {"SPINF_PORT": "9002"}, None, "http://127.0.0.1:9002/readyz", id="env"),
        pytest.param(
            ["tiny", "--config", "spinf.toml"],
            {},
            '[server]\nhost = "::"\nport = 9003\n',
            "http://[::1]:9003/readyz",
            id="relative-config-file",
        ),
        pytest.param(
            ["--host", "10.1.2.3"], {"SPINF_CONFIG": "spinf.toml"}, "port = 9004\n", "http://10.1.2.3:9004/readyz"
        ),
    ],
)
def test_the_probe_asks_the_address_the_server_reads(tmp_path, monkeypatch, words, environ, config, url):
    """The port after the image name (PID 1's argv), in SPINF_PORT or in the config file (relative to the server's
    working folder) is the one asked; a wildcard host is asked on loopback."""
    monkeypatch.chdir(tmp_path)  # the probe moves to the server's working folder
    served = tmp_path / "served"
    served.mkdir()
    if config is not None:
        (served / "spinf.toml").write_text(config)
    _process(tmp_path / "proc", 1, [*ENTRYPOINT, *words], environ, served)
    assert healthcheck_probe.readyz_url(*healthcheck_probe.find_server(tmp_path / "proc")) == url


def test_the_probe_finds_the_server_when_pid_1_is_an_init(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    proc = tmp_path / "proc"
    _process(proc, 1, ["/sbin/docker-init", "--", "bash"], {}, tmp_path)
    _process(proc, 7, [sys.executable, "-m", "spinf", "serve", "--port", "9005"], {}, tmp_path)
    assert healthcheck_probe.readyz_url(*healthcheck_probe.find_server(proc)) == "http://127.0.0.1:9005/readyz"
    with pytest.raises(LookupError):
        healthcheck_probe.find_server(proc, pid=1)


def test_every_copied_file_exists_and_is_left_in_the_build_context():
    kept = [line[1:].rstrip("/") for line in DOCKERIGNORE.read_text().splitlines() if line.startswith("!")]
    sources = [source for found, _ in copies() for source in found]
    assert "spinf" in sources and "pyproject.toml" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert any(source == path or source.startswith(path + "/") for path in kept), source


def _stage(context: Path) -> tuple[Path, Path]:
    """The Dockerfile's COPY steps into ``context``: relative destinations under the WORKDIR, absolute ones under a
    root folder. Returns (workdir, root)."""
    (workdir_arg,) = arguments("WORKDIR")
    root = context / "root"
    workdir = root / workdir_arg.lstrip("/")
    workdir.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for sources, destination in copies():
        target = root / destination.lstrip("/") if destination.startswith("/") else workdir / destination
        for source in sources:
            path = ROOT / source
            into = target / path.name if destination.endswith("/") else target
            into.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir():
                shutil.copytree(path, into, ignore=ignore)
            else:
                shutil.copy2(path, into)
    return workdir, root


def _venv(folder: Path) -> Path:
    """A fresh venv that sees this test run's packages (after its own) but not its editable spinf; its bundled
    setuptools, older than pyproject.toml needs, is removed so the build uses this environment's."""
    subprocess.run([sys.executable, "-m", "venv", folder], check=True, timeout=120)
    python = folder / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "test-run.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", "setuptools"], check=True, timeout=120)
    return folder / "bin"


def _in_container(value: str, tmp: Path) -> str:
    """A path of the image's ENV, moved under ``tmp`` (the test's own /root/.cache and /tmp)."""
    return value.replace("/root/.cache", str(tmp / "cache")).replace("/tmp", str(tmp / "tmp"))


@pytest.mark.slow
def test_the_dockerfile_install_step_and_entrypoint_serve_the_tiny_model(tmp_path):
    from spinf.engine.gemma4.tiny import ensure_tiny_snapshot

    workdir, root = _stage(tmp_path / "context")
    bin_dir = _venv(tmp_path / "venv")
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    # only the packages already here and this environment's setuptools: nothing is fetched
    pip_env = {**os.environ, "PATH": path, "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0"}
    install = subprocess.run(
        ["bash", "-c", install_command()], cwd=workdir, env=pip_env, capture_output=True, text=True, timeout=300
    )
    assert install.returncode == 0, install.stdout + install.stderr
    where = subprocess.run(
        [bin_dir / "python", "-c", "import spinf; print(spinf.__file__)"], cwd=tmp_path, capture_output=True, text=True
    )
    assert where.stdout.startswith(str(tmp_path / "venv")), where.stdout + where.stderr

    model = tmp_path / "model"
    shutil.copytree(ensure_tiny_snapshot(tmp_path / "generated"), model)
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, **{name: _in_container(value, tmp_path) for name, value in environment().items()}}
    env.update(PATH=path, HF_HUB_OFFLINE="1")
    env.pop("SPINF_PORT", None)
    port = free_port()  # a --port after the image name, which the HEALTHCHECK must follow
    url = f"http://127.0.0.1:{port}"
    flags = ["spinf/tiny-gemma4", "--model-dir", str(model), "--device", "cpu", "--host", "127.0.0.1"]
    flags += ["--port", str(port)]
    log = tmp_path / "server.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [*json.loads(arguments("ENTRYPOINT")[0]), *flags, "--warmup", "short"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        ready = _wait_ready(url, server, log)
        assert ready["boot"]["weights"] == "config"  # the folder given with --model-dir, not a cache
        # the probe from the image's /usr/local/bin; the server is not PID 1 here, so it is named
        probe_command = [str(root / "usr/local/bin" / healthcheck()[0]), "--pid", str(server.pid)]
        probe = subprocess.run(probe_command, env=env, capture_output=True, timeout=30)
        assert probe.returncode == 0, probe.stderr
        drain = [str(root / "usr/local/bin/spinf-prestop-drain"), "--url", url, "--settle-s", "0", "--quiet-s", "0.5"]
        drained = subprocess.run(drain, env=env, capture_output=True, text=True, timeout=60)
        assert drained.returncode == 0, drained.stderr
        assert httpx.get(f"{url}/readyz").json() == {"ready": False, "draining": True}
        assert subprocess.run(probe_command, env=env, capture_output=True, timeout=30).returncode == 1
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0, log.read_text()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)


def _wait_ready(url: str, server: subprocess.Popen, log: Path, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError("the server exited while starting:\n" + log.read_text())
        try:
            answer = httpx.get(f"{url}/readyz", timeout=2)
            if answer.status_code == 200:
                return answer.json()
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("the server did not become ready:\n" + log.read_text())
