"""Command-line options declared from the config they set: one source of truth for flags, types, choices and
defaults (as vLLM builds its CLI from `EngineArgs`' fields).

An `Option` names the dataclass field or function parameter that holds its default (`owner`, imported lazily);
its help text ends with that default, and its type follows the field's annotation, so `--help` states what the
code applies by construction (tests/cli/test_options.py compares them for every flag). Booleans have one style,
`--x` / `--no-x`. Every option parses to "not given" (argparse.SUPPRESS); `fill_defaults` then sets the ones not
given, so a verb can layer other sources in between: `ortllm serve` takes flag > ORTLLM_<DEST> env var > --config
TOML file > default (`layer`).
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ortllm.runtime.errors import ConfigError

FIELD = object()           # Option.default: the owner's field default

# The verb the command line is being parsed for (set by cli/__init__.py's make_parser): only its options are
# declared (their defaults import the config they come from, e.g. ortllm.pipeline.build for build and pull);
# None: every verb's (tests, --help of the whole command).
PARSING: list[str | None] = [None]


def declares(*verbs: str) -> bool:
    """Whether the parser being made declares the options of these verbs."""
    return PARSING[0] is None or PARSING[0] in verbs
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class Option:
    flag: str                                   # "--ctx-size"
    help: str
    owner: Callable[[], object] | None = None   # -> the dataclass or function whose `field` holds the default
    field: str | None = None                    # default: dest
    dest: str | None = None                     # default: the flag's name, "-" -> "_"
    aliases: tuple[str, ...] = ()
    choices: Callable[[], tuple] | tuple | None = None
    type: Callable[[str], object] | None = None  # str -> value; default: the field's annotated type
    metavar: str | None = None
    default: object = FIELD                     # the CLI's own default when there is no owner
    default_text: str | Callable[[], str] | None = None   # a default the code derives, in words ("the model's
                                                # context length"), or a function that says it
    takes_value: bool = False                   # a boolean that also takes 0|1 (`--kv-rotate 0`, kept for scripts)
    repeat: bool = False                        # repeatable (a list)

    @property
    def key(self) -> str:
        return self.dest or self.flag.lstrip("-").replace("-", "_")

    def _owner_field(self) -> tuple[object, str] | None:
        return None if self.owner is None else (self.owner(), self.field or self.key)

    def default_value(self) -> object:
        """The value the code applies when nothing sets this option (in the CLI's units)."""
        if self.owner is None:
            return None if self.default is FIELD else self.default
        owner, name = self._owner_field()
        if dataclasses.is_dataclass(owner):
            f = {f.name: f for f in dataclasses.fields(owner)}[name]
            value = f.default_factory() if f.default is dataclasses.MISSING else f.default
        else:
            value = inspect.signature(owner).parameters[name].default
        return value

    def value_type(self) -> type:
        if self.type is not None:
            return self.type
        if self.owner is None:
            d = self.default_value()
            return type(d) if d is not None else str
        owner, name = self._owner_field()
        hint = typing.get_type_hints(owner)[name]
        args = [a for a in typing.get_args(hint) if a is not type(None)] if _is_union(hint) else [hint]
        return args[0] if args and isinstance(args[0], type) else str

    @property
    def is_bool(self) -> bool:
        return self.value_type() is bool

    def choice_values(self) -> tuple | None:
        return self.choices() if callable(self.choices) else self.choices

    def help_text(self) -> str:
        if self.default_text is not None:
            text = self.default_text() if callable(self.default_text) else self.default_text
        else:
            text = format_value(self.default_value())
        return f"{self.help} (default: {text})" if text is not None else self.help

    def add_to(self, parser) -> None:
        kw: dict = {"dest": self.key, "default": argparse.SUPPRESS, "help": self.help_text().replace("%", "%%")}
        if self.is_bool:
            if self.takes_value:
                kw["metavar"] = "0|1"
            parser.add_argument(self.flag, *self.aliases, action=Bool, takes_value=self.takes_value, **kw)
            return
        kw.update(type=self.value_type(), metavar=self.metavar)
        if (choices := self.choice_values()) is not None:
            kw["choices"] = choices
        if self.repeat:
            kw["action"] = "append"
        parser.add_argument(self.flag, *self.aliases, **kw)

    def parse(self, text: object, where: str) -> object:
        """A value from an env var (text) or a TOML file (typed) -> the option's value; ConfigError naming where."""
        if self.repeat:
            return [self._parse_one(t, where) for t in (text if isinstance(text, list) else [text])]
        return self._parse_one(text, where)

    def _parse_one(self, text: object, where: str) -> object:
        if self.is_bool:
            if isinstance(text, bool):
                return text
            if str(text).lower() in TRUE + FALSE:
                return str(text).lower() in TRUE
            raise ConfigError(f"{where}: expected true or false; got {text!r}")
        t = self.value_type()
        if isinstance(text, float) and t is int:
            raise ConfigError(f"{where}: expected an integer; got {text!r}")
        try:
            value = t(text) if isinstance(text, (int, float)) and t in (int, float) else t(str(text))
        except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
            raise ConfigError(f"{where}: invalid value {text!r} ({e})") from None
        if (choices := self.choice_values()) is not None and value not in choices:
            raise ConfigError(f"{where}: must be one of {', '.join(map(str, choices))}; got {text!r}")
        return value


class Parser(argparse.ArgumentParser):
    """argparse in the CLI's error shape: one `ortllm: error: ...` line, exit 1; a bad choice names the choices."""

    def _check_value(self, action, value):
        if action.choices is not None and value not in action.choices:
            raise argparse.ArgumentError(action, f"must be one of {', '.join(map(str, action.choices))}; "
                                                 f"got {value!r}")

    def error(self, message: str):
        if m := re.match(r"argument ([^:]+): (.*)", message, re.S):
            message = f"{m.group(1).split('/')[0]} {m.group(2)}"
        self.exit(1, f"ortllm: error: {message} (see {self.prog} --help)\n")


class Bool(argparse.Action):
    """`--x` sets True, `--no-x` False; with takes_value, `--x 0|1|true|false` too."""

    def __init__(self, option_strings, dest, takes_value: bool = False, **kw):
        strings = [s for o in option_strings for s in (o, "--no-" + o[2:])]
        super().__init__(strings, dest, nargs="?" if takes_value else 0, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string.startswith("--no-"):
            value = False
        elif values is None or values == []:
            value = True
        elif str(values).lower() in TRUE + FALSE:
            value = str(values).lower() in TRUE
        else:
            raise argparse.ArgumentError(self, f"expected 0 or 1; got {values!r}")
        setattr(namespace, self.dest, value)

    def format_usage(self) -> str:
        return " | ".join(self.option_strings)


def format_value(v: object) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v)) or "none"
    return str(v)


def add_options(parser, options) -> None:
    for opt in options:
        opt.add_to(parser)


def fill_defaults(args: argparse.Namespace, options) -> argparse.Namespace:
    """Options not given get their default (what `--help` states)."""
    for opt in options:
        if not hasattr(args, opt.key):
            setattr(args, opt.key, opt.default_value() if not opt.repeat else list(opt.default_value() or ()))
    return args


def env_name(opt: Option) -> str:
    return "ORTLLM_" + opt.key.upper()


def layer(options, args: argparse.Namespace, env: dict, file_values: dict, file_name: str = "") -> dict:
    """Each option's value and where it came from: flag > env var (ORTLLM_<DEST>) > file > default.
    Sets them on args too. Returns {dest: (value, source)}."""
    by_key = {o.key: o for o in options}
    unknown = [k for k in file_values if k.replace("-", "_") not in by_key]
    if unknown:
        close = difflib.get_close_matches(unknown[0].replace("-", "_"), list(by_key), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{file_name}: unknown key {unknown[0]!r}{hint}; keys: {', '.join(sorted(by_key))}")
    file_values = {k.replace("-", "_"): v for k, v in file_values.items()}
    out = {}
    for key, opt in by_key.items():
        if hasattr(args, key):
            out[key] = (getattr(args, key), "flag")
        elif env.get(env_name(opt), "") != "":
            out[key] = (opt.parse(env[env_name(opt)], env_name(opt)), "env " + env_name(opt))
        elif key in file_values:
            out[key] = (opt.parse(file_values[key], f"{file_name}: {key}"), "file " + file_name)
        else:
            out[key] = (opt.default_value(), "default")
        setattr(args, key, out[key][0])
    return out


def read_toml(path: Path) -> dict:
    import tomllib
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"config file {path} cannot be read: {e}") from None


def flag_names(options) -> dict[str, str]:
    """{config key: --flag}: for messages that name config keys, to name the flag a user sets instead."""
    return {opt.field or opt.key: opt.flag for opt in options if opt.owner is not None}


def _is_union(hint) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)
