"""The ``spinf-serve`` command: ``config`` with origins and ``--toml`` round trips, one-line errors with exit status 2,
``serve``, and the hand-off to the catalog (``download``, ``models``), the bulk scorer (``score``) and the parity run
(``parity``)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import spinf.bulk
import spinf.catalog
import spinf.cli
import spinf.server.logs
import spinf.server.supervisor
from spinf._version import __version__
from spinf.cli import main
from spinf.errors import ConfigError, ModelError
from spinf.settings import SETTING, SETTINGS, ServerSettings, load_settings
from tests.settings_samples import SAMPLES, flag_argv

ROOT = Path(__file__).resolve().parent.parent
REAL_MANIFEST_DEFAULTS = spinf.cli._manifest_defaults
BIND_SOCKETS = spinf.server.supervisor.bind_sockets  # the real one; the fixture below replaces it
MANIFEST = {
    "served_model": "acme/served",
    "model_id": "acme/repo",
    "revision": "c" * 40,
    "quant": "",
    "media": ["image", "video"],
    "token_budget": 8192,
    "max_tokens": 32768,
}


@pytest.fixture(autouse=True)
def hermetic(monkeypatch):
    """No SPINF_* variable of the calling shell, and a fake catalog manifest for every model."""
    for name in [name for name in os.environ if name.startswith("SPINF_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(spinf.cli, "_manifest_defaults", lambda model: MANIFEST)
    # `serve` with notes: pytest's handlers stay
    monkeypatch.setattr(spinf.server.logs, "configure", lambda log_format: None)
    # `serve` in-process binds no port (the default 8000 may be anyone's); the subprocess tests bind for real
    monkeypatch.setattr(spinf.server.supervisor, "bind_sockets", lambda options: None)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def lines_of(listing: str) -> dict[str, str]:
    """``spinf-serve config`` output as dotted key -> origin."""
    rows = {}
    for line in listing.splitlines():
        origin, _, assignment = line.rpartition("  ")
        rows[assignment.split(" = ")[0]] = origin.strip()
    return rows


def test_config_shows_every_setting_with_its_origin(capsys, monkeypatch, tmp_path):
    config = tmp_path / "spinf.toml"
    config.write_text('[server]\nhost = "10.1.1.1"\n\n[limits]\nmax_options = 16\n')
    monkeypatch.setenv("SPINF_QUEUE", "9")
    monkeypatch.setenv("SPINF_ENGINE_TOKEN", "secret-value")
    code, out, err = run(capsys, "config", "spinf-12b", "--config", str(config), "--port", "9001", "--no-media")
    assert (code, err) == (0, "")
    origins = lines_of(out)
    assert origins["config file"] == "flag --config"
    assert set(origins) == {"config file"} | {s.key for s in SETTINGS}
    assert origins["engine.model"] == "argument MODEL"
    assert origins["server.port"] == "flag --port"
    assert origins["features.media"] == "flag --no-media"
    assert origins["server.queue"] == "env SPINF_QUEUE"
    assert origins["server.trusted_token"] == "env SPINF_ENGINE_TOKEN"
    assert origins["server.host"] == f"config {config}:2"
    assert origins["limits.max_options"] == f"config {config}:5"
    assert origins["engine.revision"] == "manifest acme/served"
    assert origins["engine.device"] == "default"
    assert 'engine.model = "spinf-12b"' in out and "server.port = 9001" in out and 'features.media = "none"' in out
    assert "secret-value" not in out and 'server.trusted_token = "<hidden>"' in out


def toml_round_trip(capsys, tmp_path, argv: list[str]) -> None:
    """``config --toml`` with ``argv`` and the current environment, read back alone, gives the same settings."""
    code, written, err = run(capsys, "config", "--toml", *argv)
    settings = spinf.cli._settings(spinf.cli._parser().parse_args(["config", *argv]))
    assert (code, err) == (0, "".join(f"spinf-serve: warning: {note}\n" for note in settings.notes))
    path = tmp_path / "written.toml"
    path.write_text(written)
    original = spinf.cli._settings(spinf.cli._parser().parse_args(["config", *argv]))
    again = load_settings({"config": str(path)}, {}, manifest_defaults=lambda model: MANIFEST)
    assert again == original
    for setting in SETTINGS:
        moved = original.origin(setting.name).split(" ")[0] in ("flag", "argument", "env", "config")
        assert again.origin(setting.name).startswith("config ") == moved, setting.name


def test_toml_round_trip_from_flags_variables_and_a_file(capsys, monkeypatch, tmp_path):
    config = tmp_path / "in.toml"
    config.write_text("[packs]\nofficial_packs = false\n[limits]\nmax_options = 16\n")
    monkeypatch.setenv("SPINF_CACHE_DIRS", "/a:/b")
    monkeypatch.setenv("SPINF_LAYERS", "2")
    monkeypatch.setenv("SPINF_ENGINE_TOKEN", 'we"ird')
    argv = ["acme/model", "--config", str(config), "--token-budget", "1000", "--no-media", "--no-extraction"]
    toml_round_trip(capsys, tmp_path, argv)
    written = (tmp_path / "written.toml").read_text()
    assert "token_budget = 1024" in written  # the rounded value, so reading it back changes nothing
    assert '# device = "cuda:0"' in written and "# max_tokens = 32768" in written  # defaults and manifest: comments


def test_toml_round_trip_with_every_setting_given(capsys, monkeypatch, tmp_path):
    given = [setting for setting in SETTINGS if setting.flags and not setting.not_built]  # the others: defaults
    argv = [word for setting in given for word in flag_argv(setting.name, SAMPLES[setting.name][0])]
    env = {SETTING[name].env[0]: str(SAMPLES[name][0]) for name in ("served_model", "model_id", "layers")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    toml_round_trip(capsys, tmp_path, ["acme/high", *argv])


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"spinf-serve {__version__}\n"


@pytest.mark.parametrize(
    ("argv", "env", "file", "expected"),
    [
        (
            ["--queue", "-1"],
            {},
            None,
            "server.queue (flag --queue): -1 is out of range; allowed: an integer of at least 0",
        ),
        (
            [],
            {"SPINF_MAX_FRAMES": "many"},
            None,
            "limits.max_frames (env SPINF_MAX_FRAMES): 'many' is not an integer; allowed: an integer of at least 1",
        ),
        (
            [],
            {},
            "[server]\nport = 1\nqueue = 'x'\n",
            "server.queue (config {path}:3): 'x' is not an integer; allowed: an integer of at least 0",
        ),
        (
            [],
            {},
            "[server]\nprefetch = 'six'\n",
            "engine.prefetch (config {path}:2): 'six' is not an integer; allowed: an integer",
        ),
        (
            [],
            {},
            "[engine]\ndevise = 'cpu'\n",
            "engine.devise (config {path}:2): unknown key; did you mean engine.device? [engine] takes ",
        ),
        ([], {}, "[engine]\ndevice = 'cpu\n", "config {path}:2 (flag --config): not valid TOML: "),
    ],
)
@pytest.mark.parametrize("command", ["serve", "config", "score"])
def test_a_bad_setting_is_one_line_and_status_2(capsys, monkeypatch, tmp_path, command, argv, env, file, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "bad.toml"
    if file is not None:
        path.write_text(file)
        argv = [*argv, "--config", str(path)]
    request = ["request.json"] if command == "score" else []
    code, out, err = run(capsys, command, *request, *argv)
    assert (code, out) == (2, "")
    assert err.startswith("spinf-serve: " + expected.format(path=path)) and err.count("\n") == 1


def test_config_shows_the_reference_settings_with_no_effect_and_warns_of_those_given(capsys, monkeypatch, tmp_path):
    config = tmp_path / "server.toml"
    config.write_text("port = 9100\n[engine]\nprefetch = 6\n")
    monkeypatch.setenv("SPINF_ALIGN_JOBS", "true")
    code, out, err = run(capsys, "config", "--config", str(config), "--stack-options", "")
    assert code == 0
    rows = {line.split(" = ")[0].split()[-1]: line for line in out.splitlines()}
    inert = [s for s in SETTINGS if s.no_effect]
    for setting in inert:  # each listed, said to do nothing here, with the reason
        assert rows[setting.key].endswith(f" # no effect on this engine: {setting.no_effect}"), setting.name
    assert rows["engine.prefetch"].startswith(f"config {config}:3 ") and "engine.prefetch = 6 #" in out
    assert rows["engine.align_jobs"].startswith("env SPINF_ALIGN_JOBS ")
    assert "# no effect" not in rows["engine.x_cuda_graphs"]  # honoured: the decode's CUDA graphs
    prefetch, align, stack = (SETTING[name].no_effect for name in ("prefetch", "align_jobs", "stack_options"))
    assert err.splitlines() == [
        f"spinf-serve: warning: port (config {config}:1): read as server.port, but it belongs in [server], not "
        "outside any section",
        f'spinf-serve: warning: engine.stack_options = "" (flag --stack-options): no effect on this engine: {stack}',
        f"spinf-serve: warning: engine.prefetch = 6 (config {config}:3): no effect on this engine: {prefetch}",
        f"spinf-serve: warning: engine.align_jobs = true (env SPINF_ALIGN_JOBS): no effect on this engine: {align}",
    ]
    assert "--stack-options" in run_help(capsys, "serve")


def test_serve_logs_the_notes_once_before_the_server_starts(capsys, monkeypatch, caplog):
    import spinf.server.supervisor

    formats, started = [], []
    monkeypatch.setattr(spinf.server.logs, "configure", formats.append)  # the log set-up the server would make
    monkeypatch.setattr(
        spinf.server.supervisor, "run", lambda settings, **_: started.append(list(caplog.messages)) or 0
    )
    monkeypatch.setenv("SPINF_PREFETCH", "6")
    monkeypatch.setenv("SPINF_X_BEAM", "6")
    with caplog.at_level(logging.WARNING, logger="spinf.settings"):
        assert run(capsys, "serve", "tiny", "--device", "cpu", "--log-format", "json")[0] == 0
    prefetch, beam = SETTING["prefetch"].no_effect, SETTING["x_beam"].no_effect
    assert started == [
        [
            f"engine.prefetch = 6 (env SPINF_PREFETCH): no effect on this engine: {prefetch}",
            f"engine.x_beam = 6 (env SPINF_X_BEAM): no effect on this engine: {beam}",
        ]
    ]
    assert formats == ["json"]


def run_help(capsys, *command: str) -> str:
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    return capsys.readouterr().out


def test_a_usage_error_is_one_line_and_status_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["serve", "--bogus"])
    assert info.value.code == 2
    assert capsys.readouterr().err == "spinf-serve: unrecognized arguments: --bogus (see spinf-serve --help)\n"


def test_a_model_error_is_one_line_and_status_2(capsys, monkeypatch):
    def unknown(model):
        raise ModelError(f"unknown model {model!r}")

    monkeypatch.setattr(spinf.cli, "_manifest_defaults", unknown)
    assert run(capsys, "serve", "nonesuch") == (2, "", "spinf-serve: unknown model 'nonesuch'\n")


def test_serve_hands_the_layered_settings_to_the_server(capsys, monkeypatch):
    import spinf.server.supervisor

    calls = []

    def recorded(settings, resolved, reload_settings, sockets):
        calls.append((settings, reload_settings))
        return 0

    monkeypatch.setattr(spinf.server.supervisor, "run", recorded)
    code, out, err = run(capsys, "serve", "tiny", "--device", "cpu", "--port", "9001", "--debug")
    assert (code, out, err) == (0, "", "")
    ((settings, reload_settings),) = calls
    assert (settings.engine.model, settings.server.port, settings.server.debug) == ("tiny", 9001, True)
    assert settings.origin("port") == "flag --port"
    monkeypatch.setenv("SPINF_PACKS", "/srv/packs")  # a reload reads the layers again (the pack settings from them)
    assert reload_settings().features.packs == ("/srv/packs",) and reload_settings().server.port == 9001


def test_serve_refuses_what_the_device_decides_before_starting(capsys, monkeypatch):
    """The default device is cuda:0: without a GPU the start is refused at once, not by a server whose load fails."""
    import torch

    import spinf.server.supervisor

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(spinf.server.supervisor, "run", lambda settings, **_: pytest.fail("the server must not start"))
    code, out, err = run(capsys, "serve", "tiny", "--port", "9001")
    assert (code, out) == (2, "")
    assert err == (
        "spinf-serve: device cuda:0: no CUDA GPU is visible. To try the API without a GPU: spinf-serve serve "
        "spinf/tiny-gemma4 --device cpu\n"
    )


def test_serve_refuses_bad_settings_before_starting(capsys, monkeypatch):
    import spinf.server.supervisor

    monkeypatch.setattr(spinf.server.supervisor, "run", lambda settings, **_: pytest.fail("the server must not start"))
    code, out, err = run(capsys, "serve", "--port", "http")
    assert (code, out) == (2, "")
    assert err.startswith("spinf-serve: server.port (flag --port): ") and err.count("\n") == 1


def test_score_hands_its_arguments_and_the_settings_to_the_bulk_scorer(capsys, monkeypatch):
    calls = []
    monkeypatch.setattr(spinf.bulk, "main", lambda args, settings: calls.append((args, settings)) or 7)
    monkeypatch.setenv("SPINF_MAX_OPTIONS", "12")
    argv = [
        "score",
        "body.json",
        "tiny",
        "--inputs",
        "in.jsonl",
        "--output",
        "out.jsonl",
        "--url",
        "http://a",
        "--url",
        "http://b",
        "--batch-size",
        "16",
        "--resume",
        "--no-progress",
        "--device",
        "cpu",
    ]
    assert run(capsys, *argv) == (7, "", "")
    ((args, settings),) = calls
    assert (args.request, args.model, args.inputs, args.output) == ("body.json", "tiny", "in.jsonl", "out.jsonl")
    assert (args.url, args.batch_size, args.concurrency, args.resume, args.no_progress) == (
        ["http://a", "http://b"],
        16,
        4,
        True,
        True,
    )
    assert (settings.engine.model, settings.engine.device, settings.limits.max_options) == ("tiny", "cpu", 12)


def test_score_without_a_model_leaves_args_model_none(capsys, monkeypatch):
    calls = []
    monkeypatch.setattr(spinf.bulk, "main", lambda args, settings: calls.append((args, settings)) or 0)
    assert run(capsys, "score", "body.json") == (0, "", "")
    assert calls[0][0].model is None and calls[0][1].engine.model == "spinf/gemma-4-12b-fp8"
    assert (calls[0][0].batch_size, calls[0][0].concurrency, calls[0][0].url) == (64, 4, None)


@pytest.mark.parametrize("size", ["0", "x"])
def test_score_refuses_a_bad_batch_size_in_one_line(capsys, size):
    with pytest.raises(SystemExit) as info:
        main(["score", "body.json", "--batch-size", size])
    err = capsys.readouterr().err
    assert (
        info.value.code == 2 and err.startswith("spinf-serve score: argument --batch-size: ") and err.count("\n") == 1
    )


def test_parity_takes_the_engine_from_the_environment_and_the_device_from_its_flag(capsys, monkeypatch):
    import spinf.engine.engine
    import spinf.engine.parity

    calls = []
    monkeypatch.setenv("SPINF_MODEL", "tiny")
    monkeypatch.setenv("SPINF_QUANT", "bf16")
    monkeypatch.setattr(spinf.engine.engine.Engine, "from_settings", lambda settings: calls.append(settings) or "E")
    monkeypatch.setattr(
        spinf.engine.parity,
        "run_engine",
        lambda engine, files, **kw: calls.append((engine, files, kw)) or ({"ok": 1}, None),
    )
    assert run(capsys, "parity", "--device", "cuda:3", "--passes", "3", "--record", "out.json") == (
        0,
        '{\n "ok": 1\n}\n',
        "",
    )
    settings, (engine, files, kw) = calls
    assert (settings.engine.model, settings.engine.quant, settings.engine.device) == ("tiny", "bf16", "cuda:3")
    assert (engine, files.fixture_path, files.reference, kw["passes"], kw["record"]) == (
        "E",
        "built-in",
        None,
        3,
        "out.json",
    )
    assert kw["load_s"] >= 0


@pytest.mark.parametrize("passes", ["0", "x"])
def test_parity_refuses_a_bad_pass_count_in_one_line(capsys, passes):
    with pytest.raises(SystemExit) as info:
        main(["parity", "--passes", passes])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith("spinf-serve parity: argument --passes: ") and err.count("\n") == 1


def test_download_prints_the_folder_the_catalog_gives(capsys, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(spinf.catalog, "download_model", lambda name, dir: calls.append((name, dir)) or tmp_path)
    assert run(capsys, "download", "tiny", "--dir", "/cache") == (0, f"{tmp_path}\n", "")
    assert calls == [("tiny", "/cache")]


def test_download_of_the_tiny_model_generates_it_where_the_catalog_says(capsys, tmp_path):
    from spinf.engine.gemma4.tiny import TINY_REVISION

    folder = tmp_path / "models--spinf--tiny-gemma4" / "snapshots" / TINY_REVISION
    assert run(capsys, "download", "tiny", "--dir", str(tmp_path)) == (0, f"{folder}\n", "")
    assert (folder / "model.safetensors").is_file()


def test_models_prints_the_catalog_as_a_table(capsys, monkeypatch):
    rows = [
        {
            "id": "spinf/a",
            "name": "A",
            "aliases": ["a", "aa"],
            "family": "gemma4",
            "status": "available",
            "present": True,
            "path": "/hub/a",
        },
        {
            "id": "spinf/bee",
            "name": "Bee",
            "aliases": [],
            "family": "qwen35",
            "status": "planned",
            "present": False,
            "path": None,
        },
    ]
    monkeypatch.setattr(spinf.catalog, "describe_catalog", lambda: rows)
    code, out, err = run(capsys, "models")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "ID         NAME  FAMILY  STATUS     LOCAL   ALIASES",
        "spinf/a    A     gemma4  available  /hub/a  a, aa",
        "spinf/bee  Bee   qwen35  planned    -       -",
    ]


def test_config_with_the_real_catalog_names_the_default_model_s_manifest(capsys, monkeypatch):
    monkeypatch.setattr(spinf.cli, "_manifest_defaults", REAL_MANIFEST_DEFAULTS)
    code, out, _ = run(capsys, "config")
    origins = lines_of(out)
    assert code == 0
    assert origins["engine.served_model"] == "manifest spinf/gemma-4-12b-fp8"
    assert 'engine.revision = "a689df2c5f611e3bfaa4569b8190f97db5018569"' in out


def python_m_spinf(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPINF_")} | (env or {})
    return subprocess.run([sys.executable, "-m", "spinf", *argv], cwd=ROOT, env=clean, capture_output=True, text=True)


def test_python_m_spinf_exits_with_status_2_and_one_line_on_a_bad_setting(tmp_path):
    bad = python_m_spinf("config", "--port", "abc")
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr == (
        "spinf-serve: server.port (flag --port): 'abc' is not an integer; allowed: an integer from 0 to 65535\n"
    )
    config = tmp_path / "c.toml"
    config.write_text("[server]\n\nprot = 1\n")
    unknown = python_m_spinf("config", env={"SPINF_CONFIG": str(config)})
    assert unknown.returncode == 2
    assert unknown.stderr.startswith(f"spinf-serve: server.prot (config {config}:3): unknown key; did you mean ")
    good = python_m_spinf("config", "--toml", env={"SPINF_PORT": "9001"})
    assert good.returncode == 0 and "\nport = 9001\n" in good.stdout


def test_ctrl_c_before_a_command_handles_it_is_one_line_and_status_130(capsys, monkeypatch):
    import spinf.server.supervisor

    def interrupted(settings, **_):
        raise KeyboardInterrupt

    monkeypatch.setattr(spinf.server.supervisor, "run", interrupted)
    assert main(["serve", "tiny", "--device", "cpu"]) == 130
    assert capsys.readouterr().err == "spinf-serve: interrupted\n"


def test_model_id_with_no_model_selects_the_checkpoint_through_the_catalog(capsys, monkeypatch):
    """The reference's SPINF_MODEL_ID names what it serves when no model is named: a catalog alias is its manifest."""
    monkeypatch.setattr(spinf.cli, "_manifest_defaults", REAL_MANIFEST_DEFAULTS)
    monkeypatch.setenv("SPINF_MODEL_ID", "google/gemma-4-12B")
    code, out, err = run(capsys, "config")
    assert (code, err) == (0, "")
    assert "env SPINF_MODEL_ID" in out and 'engine.model = "google/gemma-4-12B"' in out
    origins = lines_of(out)
    assert origins["engine.model"] == "env SPINF_MODEL_ID"
    assert origins["engine.served_model"] == origins["engine.model_id"] == "manifest spinf/gemma-4-12b-fp8"
    assert 'engine.model_id = "spinf/gemma-4-12b-fp8"' in out
    monkeypatch.setenv("SPINF_MODEL", "tiny")  # a model named: model_id is the manifest's repo overridden
    code, out, _ = run(capsys, "config")
    assert 'engine.served_model = "spinf/tiny-gemma4"' in out and 'engine.model_id = "google/gemma-4-12B"' in out


def test_serve_serves_the_model_id_when_no_model_is_named(capsys, monkeypatch):
    import spinf.server.supervisor

    monkeypatch.setattr(spinf.cli, "_manifest_defaults", REAL_MANIFEST_DEFAULTS)
    calls = []
    monkeypatch.setattr(spinf.server.supervisor, "run", lambda settings, **_: calls.append(settings) or 0)
    monkeypatch.setenv("SPINF_MODEL_ID", "tiny")
    assert run(capsys, "serve", "--device", "cpu") == (0, "", "")
    ((settings,),) = [calls]
    assert (settings.engine.model, settings.engine.served_model) == ("tiny", "spinf/tiny-gemma4")


def test_score_warns_of_the_notes_before_scoring(capsys, monkeypatch, caplog):
    warned = []
    monkeypatch.setattr(spinf.bulk, "main", lambda args, settings: warned.append(list(caplog.messages)) or 0)
    monkeypatch.setenv("SPINF_LM_ROWS", "2048")
    with caplog.at_level(logging.WARNING, logger="spinf.settings"):
        assert run(capsys, "score", "body.json", "tiny", "--device", "cpu")[0] == 0
    reason = SETTING["lm_rows"].no_effect
    assert warned == [[f"engine.lm_rows = 2048 (env SPINF_LM_ROWS): no effect on this engine: {reason}"]]


def _serve_refused(*argv: str, env: dict[str, str] | None = None) -> str:
    """``python -m spinf serve ARGV``, which must refuse to start: its one line on stderr, after asserting exit
    status 2, nothing on stdout and no traceback. Offline, so a model name is never looked up on the Hub."""
    done = subprocess.run(
        [sys.executable, "-m", "spinf", "serve", *argv],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("SPINF_")}
        | {"HF_HUB_OFFLINE": "1"}
        | (env or {}),
        capture_output=True,
        text=True,
        timeout=60,  # a server that came up would run until killed: the timeout turns that into a failure
    )
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    return done.stderr


def test_serve_refuses_an_address_in_use_in_one_line_before_the_model_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = _serve_refused("tiny", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port))
    assert err == (
        f"spinf-serve: cannot listen on 127.0.0.1:{port}: address already in use (another server runs there; "
        "choose another --port)\n"
    )


def test_serve_refuses_an_unknown_host_name_in_one_line():
    err = _serve_refused("tiny", "--device", "cpu", "--host", "no-such-host.invalid", "--port", "8123")
    assert err == "spinf-serve: cannot listen on no-such-host.invalid:8123: unknown host name (--host)\n"


def test_serve_refuses_an_unknown_model_in_one_line():
    err = _serve_refused("acme-nowhere", "--device", "cpu", "--port", "8123")
    assert err.startswith("spinf-serve: unknown model 'acme-nowhere': it is no catalog id or alias")


def test_serve_refuses_a_bad_config_file_in_one_line(tmp_path):
    config = tmp_path / "spinf.toml"
    config.write_text("[server]\nprot = 8001\n")
    err = _serve_refused("tiny", "--device", "cpu", "--port", "8123", env={"SPINF_CONFIG": str(config)})
    assert err.startswith(f"spinf-serve: server.prot (config {config}:2): unknown key; did you mean ")


def test_packs_list_takes_serve_s_names_of_its_options(capsys):
    """``--no-official-packs``, ``--packs-allow-namespace`` and ``--packs-refresh`` as ``serve`` spells them."""
    parse = spinf.cli._parser().parse_args
    ours = parse(["packs", "list", "--no-official", "--allow-namespace", "spinf", "--refresh"])
    serves = parse(["packs", "list", "--no-official-packs", "--packs-allow-namespace", "spinf", "--packs-refresh"])
    assert vars(ours) == vars(serves) and (ours.no_official, ours.allow_namespace, ours.refresh) == (
        True,
        ["spinf"],
        True,
    )
    code, out, err = run(
        capsys, "packs", "list", "--no-official-packs", "--packs", "fixtures/packs", "--model", "tiny"
    )
    assert (code, err, out.splitlines()[0]) == (0, "", "sources: local:fixtures/packs")  # no official source
    help_text = run_help(capsys, "packs", "list")
    assert "--no-official, --no-official-packs" in help_text and "--refresh, --packs-refresh" in help_text


def test_of_two_starts_bound_to_one_port_the_second_to_listen_is_refused_in_one_line():
    """Sockets that allow address reuse may both bind a port that nobody listens on yet: the second ``listen`` is
    the refusal, and it reads as the bind's would."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = ServerSettings(host="127.0.0.1", port=port)
    first, second = BIND_SOCKETS(options), BIND_SOCKETS(options)
    try:
        spinf.server.supervisor.start_listening(options, first)
        with pytest.raises(ConfigError, match=rf"^cannot listen on 127\.0\.0\.1:{port}: address already in use "):
            spinf.server.supervisor.start_listening(options, second)
    finally:
        for sock in (*first.insecure_sockets, *second.insecure_sockets):
            sock.close()
