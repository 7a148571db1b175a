"""The commands the README and docs/ show, read from their ```bash blocks, so that the tests
run the recipes as they are written (tests/test_recipes.py, tests/test_cluster_e2e.py)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

ONE_MACHINE_8_GPUS = "python sweeps/nyuv2.py --data-dir /data/nyuv2 --num-gpus 8"
"""The start of the one-machine 8-GPU sweep command of the README and docs/cluster.md."""
CLUSTER_SWEEP = "python sweeps/nyuv2.py --address auto"
"""The start of the cluster sweep command of the README and docs/cluster.md."""


def documents() -> dict[str, str]:
    """Path relative to the repository -> text, for README.md and every docs/**/*.md."""
    paths = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return {str(path.relative_to(REPO)): path.read_text() for path in paths}


def shell_commands(markdown: str) -> list[str]:
    """The commands of the ```bash and ```sh blocks: backslash continuations joined, comments
    and a leading `$ ` prompt dropped."""
    commands = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", markdown, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            command = line.split(" #", 1)[0].strip().removeprefix("$ ")
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def documented_command(document: str, prefix: str) -> str:
    """The one command of `document` (a path relative to the repository) that starts with
    `prefix`."""
    found = [c for c in shell_commands((REPO / document).read_text()) if c.startswith(prefix)]
    assert len(found) == 1, f"{document}: expected one command starting with {prefix!r}: {found}"
    return found[0]


def script_argv(command: str) -> list[str]:
    """The arguments after `python SCRIPT` of a documented command."""
    words = shlex.split(command)
    assert words[0] == "python" and words[1].endswith(".py"), command
    return words[2:]


def with_flags(argv: list[str], values: dict[str, str], drop: tuple[str, ...] = ()) -> list[str]:
    """`argv` with the values of the flags in `values` replaced (added if absent) and the
    flags in `drop` removed, each with its value."""
    values, out, rest = dict(values), [], list(argv)
    while rest:
        word = rest.pop(0)
        takes_value = rest and not rest[0].startswith("--")
        value = rest.pop(0) if takes_value else None
        if word in drop:
            continue
        out += [word, values.pop(word)] if word in values else [word] + ([value] if value else [])
    for flag, value in values.items():
        out += [flag, value]
    return out
