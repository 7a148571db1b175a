"""The README and docs/ point at things that exist: every relative link resolves (file and
heading), and every flag of our own commands that they name is in that command's --help.

Our commands are `relif SUBCOMMAND`, `sweeps/*.py` and `python -m benchmarks.X` (with
`benchmarks/gpu_check.sh`, which passes its flags to gpu_check.py). A flag is checked against
the command it is written with, in a shell block or an inline code span that starts with the
command; a flag named alone in the prose must be a flag of one of our commands, or one of
another tool's that `OTHER_TOOLS_FLAGS` lists.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from relif_ray.cli.console import main as relif_main
from relif_ray.problems import benchmarks
from tests import pinned
from tests.conftest import HANG_GUARD_S
from tests.recipes import REPO, documents, shell_commands

OTHER_TOOLS_FLAGS = {
    "--head": "ray start",
    "--block": "ray start",
    "--port": "ray start",
    "--dashboard-host": "ray start",
    "--working-dir": "ray job submit",
    "--follow": "ray job logs",
    "--generate": "ray get-auth-token",
    "--exclude": "srun",
    "--gres": "srun",
    "--gpus-per-node": "srun",
    "--signal": "sbatch",
    "--requeue": "sbatch",
    "--mem": "sbatch",
    "--cpus-per-task": "srun",
    "--ntasks-per-node": "srun",
    "--node-manager-port": "ray start",
    "--object-manager-port": "ray start",
    "--runtime-env-agent-port": "ray start",
    "--dashboard-agent-grpc-port": "ray start",
    "--metrics-export-port": "ray start",
    "--min-worker-port": "ray start",
    "--max-worker-port": "ray start",
    "--strict": "mkdocs build",
    "--logdir": "tensorboard",
    "--optim": "LibMTL's examples/nyu/train_nyu.py",
    "--aug": "LibMTL's examples/nyu/train_nyu.py",
    "--arch": "LibMTL's LibMTL/config.py",
    "--index-url": "pip install",
    "--no-deps": "pip install",
}
"""Flags of other tools that the docs name in prose, with the tool."""

FLAG = re.compile(r"(?<![\w/.-])(--[a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def heading_anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {heading_anchor(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def relative_links() -> list[tuple[str, str]]:
    """(document, link target) of every link that is not a URL or a same-page anchor."""
    links = []
    for name, text in documents().items():
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in LINK.findall(prose):
            if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
                links.append((name, target))
    return links


def test_every_relative_link_resolves_to_a_file_and_heading():
    links = relative_links()
    assert len(links) > 20  # the check sees the docs' links
    broken = []
    for name, target in links:
        path, _, anchor = target.partition("#")
        resolved = (REPO / name).parent / path
        if not resolved.exists() or (anchor and anchor not in anchors(resolved)):
            broken.append(f"{name}: {target}")
    assert broken == []


def help_text(argv: list[str], script: Path | None = None) -> str:
    """What `--help` prints: of `relif ARGV` in process, or of the script run as __main__."""
    out = io.StringIO()
    saved = list(sys.argv), list(sys.path)
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            if script is None:
                relif_main([*argv, "--help"])
            else:
                sys.argv = [str(script), *argv, "--help"]
                if script.parent.name == "benchmarks":  # a module of the benchmarks package
                    runpy.run_module(f"benchmarks.{script.stem}", run_name="__main__")
                else:
                    runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved
    return out.getvalue()


@functools.cache
def command_flags(command: str) -> frozenset[str]:
    """The flags --help lists for `command` ("relif report", "sweeps/nyuv2.py", ...): for
    sweeps also those of the controller checks, for make-data those of every data set."""
    if command.startswith("relif "):
        sub = command.split()[1]
        variants = {
            "sweep": [["sweep"], ["sweep", "--controller-checks"]],
            "make-data": [["make-data", name] for name in benchmarks()],
        }.get(sub, [[sub]])
        texts = [help_text(argv) for argv in variants]
        if sub == "make-data":
            texts.append(plugin_make_data_help())
    else:
        texts = [help_text([], REPO / command)]
    return frozenset(flag for text in texts for flag in FLAG.findall(text))


def plugin_make_data_help() -> str:
    """`relif make-data toy --help` of the plug-in benchmark docs/examples/my_benchmark.py, in
    a process of its own (a plug-in directory, once searched, stays registered in a process)."""
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(REPO / "docs" / "examples" / "my_benchmark.py", folder)
        env = {**os.environ, "PYTHONPATH": str(REPO), "RELIF_PROBLEMS_PATH": folder}
        done = subprocess.run(
            [sys.executable, "-m", "relif_ray.cli", "make-data", "toy", "--help"],
            env=env, capture_output=True, text=True, timeout=HANG_GUARD_S, check=True,
        )  # fmt: skip
    return done.stdout


def our_scripts() -> list[str]:
    """The sweep entry points, and the benchmarks with a command line."""
    scripts = sorted((REPO / "sweeps").glob("*.py"))
    benchmark_scripts = sorted((REPO / "benchmarks").glob("*.py"))
    scripts += [path for path in benchmark_scripts if "argparse" in path.read_text()]
    return [str(path.relative_to(REPO)) for path in scripts if "__main__" in path.read_text()]


def command_of(words: list[str]) -> str | None:
    """Which of our commands `words` (one shell command) runs, if any."""
    while words and re.match(r"^[A-Z_]+=", words[0]):  # VARIABLE=value prefixes
        words = words[1:]
    if len(words) >= 2 and Path(words[0]).name in ("python", "python3"):
        words = words[1:]
    if len(words) >= 2 and words[0] == "-m" and words[1].startswith("benchmarks."):
        words = [f"benchmarks/{words[1].removeprefix('benchmarks.')}.py", *words[2:]]
    if len(words) >= 2 and words[0] == "bash" and words[1] == "benchmarks/gpu_check.sh":
        return "benchmarks/gpu_check.py"
    if len(words) >= 2 and Path(words[0]).name == "relif":
        return f"relif {words[1]}"
    if words and words[0] in our_scripts():
        return words[0]
    return None


def commands_named() -> list[tuple[str, str, str]]:
    """(document, command, the text written with it) of every use of our commands in shell
    blocks and in inline code spans that start with one."""
    uses = []
    for name, text in documents().items():
        written = shell_commands(text)
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        written += re.findall(r"`([^`\n]+)`", prose)
        for line in written:
            for part in re.split(r"&&|\|\||;|\|| -- ", line):
                try:
                    words = shlex.split(part.replace("[", " ").replace("]", " "))
                except ValueError:
                    continue
                command = command_of(words)
                if command is not None:
                    uses.append((name, command, part))
    return uses


@pytest.mark.slow
def test_every_flag_written_with_one_of_our_commands_is_in_its_help():
    uses = commands_named()
    assert {"relif report", "sweeps/nyuv2.py", "benchmarks/run.py"} <= {c for _, c, _ in uses}
    unknown = [
        f"{name}: {command} {flag}"
        for name, command, text in uses
        for flag in FLAG.findall(text)
        if flag not in command_flags(command)
    ]
    assert unknown == []


def test_every_flag_named_in_the_prose_is_one_of_ours_or_a_listed_tools():
    ours = set().union(*(command_flags(f"relif {sub}") for sub in ("sweep", "make-data")))
    for sub in ("audit", "report", "export"):
        ours |= command_flags(f"relif {sub}")
    for script in our_scripts():
        ours |= command_flags(script)
    ours |= set(FLAG.findall(pinned.USAGE))  # the pins' maintenance command
    unknown = []
    for name, text in documents().items():
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for span in re.findall(r"`([^`\n]+)`", prose):
            for flag in FLAG.findall(span):
                if flag not in ours and flag not in OTHER_TOOLS_FLAGS:
                    unknown.append(f"{name}: {flag} in `{span}`")
    assert unknown == []
