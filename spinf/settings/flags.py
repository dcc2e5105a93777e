"""How the command line meets the settings: the flags of every setting, the listing of the effective settings
with their origins (``spinf-serve config``) and the commented TOML file that reproduces them (``config --toml``).

All three are generated from ``spinf.settings.SETTINGS``, so a new setting gets its flags, its line in the listing
and its key in the file without being named here.
"""

from __future__ import annotations

import argparse

from spinf.settings import SECTIONS, SETTING, SETTINGS, Setting, Settings
from spinf.settings.file import write_config
from spinf.settings.kinds import Integer, Number, Switch, Words


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add the optional positional ``MODEL``, ``--config`` and every setting's flags to ``parser``, grouped by
    section. No flag stores anything when left out, so ``flags_from_args`` sees only what was given."""
    # MODEL defaults to None rather than being left out, because commands read ``args.model``; None means not given.
    parser.add_argument("model", nargs="?", metavar="MODEL", default=None, help=_help(SETTING["model"]))
    parser.add_argument(
        "--config", metavar="FILE", default=argparse.SUPPRESS, help="a TOML settings file; SPINF_CONFIG"
    )
    groups = {section: parser.add_argument_group(f"{section.rstrip('s')} settings") for section in SECTIONS}
    for setting in SETTINGS:
        for flag in setting.flags:
            groups[setting.section].add_argument(
                flag, dest=setting.name, default=argparse.SUPPRESS, **_flag_action(setting, flag)
            )


def _flag_action(setting: Setting, flag: str) -> dict:
    if flag != setting.flags[0]:
        const, help = (
            ((), "the same as --media none")
            if flag == "--no-media"
            else (False, f"the opposite of {setting.flags[0]}")
        )
        return {"action": "store_const", "const": const, "help": help}
    if isinstance(setting.kind, Switch):
        turn_off = flag.startswith("--no-")
        return {"action": "store_const", "const": not turn_off, "help": _help(setting, turn_off=turn_off)}
    choices = [choice for choice in getattr(setting.kind, "choices", ()) if choice]
    metavar = "{" + ",".join(choices) + "}" if choices else _METAVARS.get(setting.name, "TEXT")
    action = "append" if isinstance(setting.kind, Words) else "store"
    return {"action": action, "metavar": metavar, "help": _help(setting)}


_METAVARS = {
    **{s.name: "N" for s in SETTINGS if isinstance(s.kind, Integer | Number)},
    "device": "DEVICE",
    "model_dir": "DIR",
    "host": "HOST",
    "token": "TOKEN",
    "trusted_token": "TOKEN",
    "media": "KINDS",
    "packs": "SOURCE",
    "packs_allow_namespace": "NS",
}


def _help(setting: Setting, *, turn_off: bool = False) -> str:
    default = "" if setting.secret else f", default {setting.literal(setting.default)}"
    what = f"{setting.help}: this flag turns it off" if turn_off else setting.help
    return f"{what}; {' or '.join(setting.env)}{default}".replace("%", "%%")


def flags_from_args(args: argparse.Namespace) -> dict[str, object]:
    """What the user gave on the command line, by setting name (and ``config``), for ``load_settings``."""
    given = vars(args).items()
    return {
        name: v for name, v in given if (name in SETTING or name == "config") and not (name == "model" and v is None)
    }


def describe(settings: Settings) -> str:
    """The effective settings, one per line, each after its origin (like ``git config --show-origin``); a setting of
    the reference that changes nothing here says so after its value."""
    rows = []
    if settings.config is not None:
        rows.append((settings.origin("config"), f"config file = {settings.config}"))
    for setting in SETTINGS:
        value = settings.value(setting.name)
        shown = '"<hidden>"' if setting.secret and value else setting.literal(value)
        inert = f" # no effect on this engine: {setting.no_effect}" if setting.no_effect else ""
        rows.append((settings.origin(setting.name), f"{setting.key} = {shown}{inert}"))
    width = max(len(origin) for origin, _ in rows)
    return "\n".join(f"{origin:<{width}}  {text}" for origin, text in rows)


def to_toml(settings: Settings) -> str:
    """A commented config file that reproduces ``settings`` when read back with ``--config``. What came from a
    flag, a variable or a file is written as a key; what came from a manifest or a default is written commented out,
    so the file does not pin a manifest's values (change the model and its manifest applies)."""

    def rows(section: str):
        for setting in (s for s in SETTINGS if s.section == section):
            origin = settings.origin(setting.name)
            live = origin != "default" and not origin.startswith("manifest ")
            value = setting.kind.to_toml(settings.value(setting.name))
            yield setting.name, value, f"{setting.help} [{origin}]", live

    header = (
        "spinf-serve settings, written by `spinf-serve config --toml`; read it with --config FILE or SPINF_CONFIG.\n"
        "Each key shows where its value came from; commented-out keys are defaults or the model's manifest."
    )
    return write_config(((section, rows(section)) for section in SECTIONS), header)
