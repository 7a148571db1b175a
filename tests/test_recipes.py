"""The recipes of the README and docs/ run as written, each as far as this machine allows:

- one machine with 8 GPUs (docs/cluster.md): the exact command, with only its data folder, its
  storage and the ImageNet weights (random ones: tests download nothing) replaced, parses,
  prints its plan and stops with the one-line refusal of a machine without GPUs (on a GPU
  machine, benchmarks/gpu_check.py runs the same sweep for real);
- a Ray cluster (docs/cluster.md): tests/test_cluster_e2e.py runs the documented sweep command
  on a head and worker nodes bound to 127.0.0.1; Slurm and KubeRay: tests/test_slurm_recipe.py
  and tests/test_kuberay_recipe.py;
- the controller checks (docs/reproducing.md): the command's plan has the trial count the doc
  states, and its default experiment name is the one --help names.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from relif_ray.cli.sweep import DATASETS, experiment_name, sweep_request
from relif_ray.cli.sweep_flags import CHECKS_SUFFIX, build_parser
from relif_ray.sweep.plan import plan_summary
from tests.conftest import HANG_GUARD_S
from tests.recipes import (
    CLUSTER_SWEEP,
    ONE_MACHINE_8_GPUS,
    REPO,
    TABLE_1_SWEEP,
    documented_command,
    script_argv,
    shell_commands,
    what_it_trains,
    with_flags,
)

CONTROLLER_CHECKS = "python sweeps/controller_sensitivity.py --dataset mimic3"


def shown_output(document: str, prefix: str) -> str:
    """The line of `document`'s plain code blocks (its shown output) starting with `prefix`."""
    lines = [line for line in (REPO / document).read_text().splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, (document, prefix, lines)
    return lines[0]


def test_the_readme_shows_the_tested_command():
    """The README's 8-GPU sweep is docs/cluster.md's (the cluster recipes are only there)."""
    recipe = ONE_MACHINE_8_GPUS
    assert documented_command("README.md", recipe) == documented_command("docs/cluster.md", recipe)
    documented_command("docs/cluster.md", CLUSTER_SWEEP)  # exactly one


TABLE_1_DOCUMENTS = ("README.md", "docs/cluster.md", "docs/index.md", "docs/reproducing.md")
"""The pages that give the paper's Table 1 sweep as a command."""


def table_1_commands() -> dict[str, str]:
    """Where -> the command, for every full-data NYUv2 sweep of `TABLE_1_DOCUMENTS`, the Slurm
    script's default command and the KubeRay job's entrypoint."""
    found = {}
    for document in TABLE_1_DOCUMENTS:
        for command in shell_commands((REPO / document).read_text()):
            if "sweeps/nyuv2.py" in command and "--data-dir /data/nyuv2" in command:
                found[f"{document}: {command}"] = command
    slurm = (REPO / "docs" / "examples" / "slurm_sweep.sh").read_text()
    (default,) = re.findall(r"^    set -- (.*?)\n(?=fi)", slurm, re.M | re.S)
    found["slurm_sweep.sh"] = re.sub(r"\\\n\s*", " ", default)
    manifest = yaml.safe_load_all((REPO / "docs" / "examples" / "kuberay_rayjob.yaml").read_text())
    (job,) = [document for document in manifest if document["kind"] == "RayJob"]
    found["kuberay_rayjob.yaml"] = job["spec"]["entrypoint"]
    return found


def test_the_table_1_command_reads_the_same_everywhere():
    """Every Table 1 command trains what `TABLE_1_SWEEP` trains: the same program, flags and
    values, only where it runs and is stored differing (`tests.recipes.PLACE_FLAGS`)."""
    commands = table_1_commands()
    assert len(commands) >= 8, commands
    expected = what_it_trains(TABLE_1_SWEEP)
    differing = {where: c for where, c in commands.items() if what_it_trains(c) != expected}
    assert not differing


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="with GPUs the sweep would run")
def test_the_one_machine_8_gpu_recipe_runs_until_it_needs_a_gpu(nyuv2_dir, tmp_path):
    command = documented_command("docs/cluster.md", ONE_MACHINE_8_GPUS)
    assert "--pretrained imagenet" in command  # the paper's Table 1 grid, from ImageNet weights
    argv = with_flags(script_argv(command), {"--data-dir": str(nyuv2_dir), "--pretrained": "none"})
    result = subprocess.run(
        [sys.executable, "sweeps/nyuv2.py", *argv, "--storage", str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"},
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    plan = [line for line in result.stdout.splitlines() if line.startswith("plan: ")]
    assert plan == [shown_output("docs/cluster.md", "plan: ")]
    refusal = result.stderr.strip().splitlines()[-1]
    assert refusal == shown_output("docs/cluster.md", "nyuv2.py: error: --num-gpus 8")
    assert not any(tmp_path.iterdir())  # nothing left behind


def controller_checks_request(tmp_path: Path, *extra: str):
    """The documented controller-checks command, on an empty data folder (the plan and every
    trial config are checked without reading data) and without its resource flags."""
    command = documented_command("docs/reproducing.md", CONTROLLER_CHECKS)
    words = [word for word in script_argv(command) if not word.startswith("$GPUS")]
    argv = with_flags(words, {"--data-dir": str(tmp_path), "--storage": str(tmp_path)})
    return sweep_request([*argv, *extra], None, tuple(DATASETS), controller_checks=True)


def test_the_controller_checks_recipe_has_the_trial_count_it_states(tmp_path):
    request = controller_checks_request(tmp_path)
    plan = plan_summary(request.space, request.search, request.resources)
    assert plan.startswith("plan: 105 trials (15 settings x 7 seeds); labels erm, relif, ")
    reproducing = (REPO / "docs" / "reproducing.md").read_text()
    assert "105 trials (15 settings x 7 seeds)" in reproducing
    assert "that is 15 settings per seed, 1 + 3 + 6 + 5: 105 trials" in (
        (REPO / "docs" / "sweeps.md").read_text().replace("\n", " ")
    )
    single = controller_checks_request(tmp_path, "--seeds", "1")
    assert len(single.space.trials) == 15 and request.name == "mimic3-controller"


@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_the_controller_checks_help_names_their_default_experiment(dataset):
    defaults = DATASETS[dataset]
    parser = build_parser(defaults, tuple(DATASETS), checks=True)
    args = parser.parse_args(["--dataset", dataset])
    name = experiment_name(args, defaults, CHECKS_SUFFIX)
    assert name == f"{dataset}-controller"
    shown = "".join(parser.format_help().split())  # help wraps lines, also at hyphens
    assert f"(default:{name};demo:{name}-demo)" in shown
