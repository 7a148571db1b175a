"""The README Quickstart is exactly two commands, and CI runs the second one verbatim."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def quickstart_commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1]
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_quickstart_has_two_commands_using_the_repo_venv():
    commands = quickstart_commands()
    assert len(commands) == 2
    for command in commands:
        assert "python3 -m venv .venv" in command and ".venv/bin/pip install" in command
    assert "sweeps/nyuv2.py --demo" in commands[0] and "relif report" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert quickstart_commands()[1] in ci
