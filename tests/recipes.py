"""The commands the README and docs/ show, read from their ```bash blocks, so that the tests
run the recipes as they are written (tests/test_recipes.py, tests/test_cluster_e2e.py)."""

from __future__ import annotations

import re
import shlex
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

ONE_MACHINE_8_GPUS = "python sweeps/nyuv2.py --data-dir /data/nyuv2 --num-gpus 8"
"""The start of the one-machine 8-GPU sweep command of the README and docs/cluster.md."""
CLUSTER_SWEEP = "python sweeps/nyuv2.py --address auto"
"""The start of the cluster sweep command of the README and docs/cluster.md."""
TABLE_1_SWEEP = "python sweeps/nyuv2.py --data-dir /data/nyuv2 --pretrained imagenet"
"""The paper's Table 1 grid (its six methods x 7 seeds, ResNet-50 from ImageNet weights): what
every Table 1 command of the docs and the cluster recipes runs, less the flags that say where
and on what (`PLACE_FLAGS`)."""
PLACE_FLAGS = {
    "--address": True, "--num-gpus": True, "--gpus-per-trial": True, "--cpus-per-trial": True,
    "--storage": True, "--name": True, "--resume-if-present": False,
}  # fmt: skip
"""The flags of where a sweep runs and is stored, not of what it trains (flag -> takes a
value)."""


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


def what_it_trains(command: str) -> tuple[str, Counter]:
    """A sweep command as what it trains: its program (`python SCRIPT` or `relif sweep`, a
    launcher before it such as `ray job submit ... --` dropped) and the multiset of its other
    flags with their values, `PLACE_FLAGS` and shell variables (`$GPUS`) left out."""
    words = shlex.split(command)
    start = next(i for i, w in enumerate(words) if w == "python" or w == "relif")
    program, words = " ".join(words[start : start + 2]), words[start + 2 :]
    kept, i = [], 0
    while i < len(words):
        flag = words[i].split("=", 1)[0]
        if flag in PLACE_FLAGS:
            i += 2 if PLACE_FLAGS[flag] and "=" not in words[i] else 1
        elif words[i].startswith("$"):
            i += 1
        elif words[i].startswith("--") and i + 1 < len(words) and not words[i + 1].startswith("-"):
            kept.append(f"{words[i]} {words[i + 1]}")
            i += 2
        else:
            kept.append(words[i])
            i += 1
    return program, Counter(kept)
