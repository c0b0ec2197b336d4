"""The repository's Containerfile read as its instructions, per build stage (tests.service.containerfile, imported by
the tests of the image and of docs/deploy/). Just the syntax the file uses: comments, backslash continuations,
exec-form (JSON) and shell-form arguments, KEY=VALUE lists (ENV, ARG)."""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

PATH = Path(__file__).resolve().parents[2] / "Containerfile"


@dataclass
class Instruction:
    keyword: str        # FROM, RUN, ENV, ... (upper case)
    args: str           # the rest, continuations joined

    def exec_form(self) -> list[str]:
        """The JSON array of an exec-form instruction (ENTRYPOINT ["a", "b"]); a ValueError if it is shell form."""
        value = json.loads(self.args)
        if not isinstance(value, list):
            raise ValueError(f"{self.keyword} {self.args}: not an exec-form array")
        return value


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        assert found, f"the stage FROM {self.base} has no {keyword}"
        return found[-1]

    def env(self) -> dict[str, str]:
        """ENV KEY=VALUE ... of this stage, later ones winning (values unquoted as the shell would)."""
        out = {}
        for i in self.all("ENV"):
            for word in shlex.split(i.args):
                key, sep, value = word.partition("=")
                assert sep, f"ENV {i.args}: use KEY=VALUE (the legacy `ENV KEY VALUE` form is not read here)"
                out[key] = value
        return out


def instructions(text: str) -> list[Instruction]:
    out, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):       # a comment line inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical = pending + stripped
        pending = ""
        keyword, _, args = logical.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip()))
    assert not pending, "the Containerfile ends inside a continued line"
    return out


def stages(text: str | None = None) -> list[Stage]:
    """The build stages in order (the last one is the image)."""
    out: list[Stage] = []
    for i in instructions(PATH.read_text() if text is None else text):
        if i.keyword == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", i.args, re.IGNORECASE)
            assert m, f"FROM {i.args}: expected IMAGE [AS NAME]"
            out.append(Stage(m.group(1), m.group(2)))
        else:
            assert out or i.keyword == "ARG", f"{i.keyword} before the first FROM"
            if out:
                out[-1].instructions.append(i)
    return out


def global_args(text: str | None = None) -> dict[str, str]:
    """ARG NAME[=DEFAULT] lines before the first FROM (their defaults, '' for none)."""
    out = {}
    for i in instructions(PATH.read_text() if text is None else text):
        if i.keyword == "FROM":
            break
        name, _, default = i.args.partition("=")
        out[name] = default.strip('"')
    return out


def image() -> Stage:
    """The image's stage (the last)."""
    return stages()[-1]


def healthcheck_argv(stage: Stage) -> list[str]:
    """HEALTHCHECK [OPTIONS] CMD [...]: the exec-form command."""
    args = stage.last("HEALTHCHECK").args
    options, sep, command = args.partition("CMD ")
    assert sep, f"HEALTHCHECK {args}: expected [OPTIONS] CMD [...]"
    return json.loads(command)


def health_path(stage: Stage) -> str:
    """The URL path the HEALTHCHECK asks ('/health')."""
    m = re.search(r"""['"](/[\w/-]*)['"]""", " ".join(healthcheck_argv(stage)))
    assert m, f"no quoted URL path in the HEALTHCHECK: {healthcheck_argv(stage)}"
    return m.group(1)


def user_ids(stage: Stage) -> tuple[int, int]:
    """(uid, gid) the stage's `useradd ... --uid N --gid G ... NAME` gives its USER."""
    user = stage.last("USER").args.split(":")[0]
    for run in stage.all("RUN"):
        m = re.search(rf"useradd\b[^&;]*--uid (\d+) --gid (\d+)[^&;]*\b{re.escape(user)}\b", run.args)
        if m:
            return int(m.group(1)), int(m.group(2))
    raise AssertionError(f"no RUN creates the USER {user} with useradd --uid N --gid G")
