"""docs/examples/own_loop.py and own_loop_pcgrad.py: ReLiF and the fixed-delta audit in a plain
PyTorch loop, alone and with PCGrad; the README shows own_loop.py's code verbatim."""

from __future__ import annotations

import ast
import re
import runpy
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "examples" / "own_loop.py"
PCGRAD_EXAMPLE = REPO / "docs" / "examples" / "own_loop_pcgrad.py"
README_SECTION = "## ReLiF in your own loop"


def _run_example() -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _numbers(text: str) -> dict[str, float]:
    return {key: float(value) for key, value in re.findall(r"(\w+)=([-\d.e]+)", text)}


def _check_training_and_audit(controller: str, accuracy: str, audit: str) -> dict[str, float]:
    stats = _numbers(controller)
    assert 0.0 <= stats["r_ema"] <= 1.0 and stats["loss_lip"] >= 0.0
    accuracies = ast.literal_eval(accuracy.removeprefix("accuracy "))
    assert all(value > 0.8 for value in accuracies.values())
    result = _numbers(audit)
    # gaps lie in [0, 1], so (gap - delta)+ <= (1 - delta) 1[gap > delta]
    assert 0.0 <= result["bias"] <= 0.9 * result["vr"] <= 0.9
    return stats


def test_example_trains_with_the_controller_and_audits():
    output = _run_example()
    assert len(EXAMPLE.read_text().splitlines()) < 60
    controller, accuracy, audit = output.strip().splitlines()
    stats = _check_training_and_audit(controller, accuracy, audit)
    # the controller ran past its warmup: lambda left lambda0 = 0.1 and stays in its bounds
    assert 0.01 <= stats["lambda"] <= 1.0 and stats["lambda"] != 0.1


def test_the_ablation_without_the_lipschitz_branch_runs_the_same_code(monkeypatch, capsys):
    """With `lipschitz_branch=False` the regularizer returns None for the loss; the example's
    loop handles it and trains on the task loss alone (lambda = 0)."""
    import relif_ray.relif

    config = relif_ray.relif.ReLiFConfig
    monkeypatch.setattr(
        relif_ray.relif, "ReLiFConfig", lambda **fields: config(lipschitz_branch=False, **fields)
    )
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    controller, accuracy, audit = capsys.readouterr().out.strip().splitlines()
    stats = _check_training_and_audit(controller, accuracy, audit)
    assert stats["lambda"] == 0.0 and stats["loss_lip"] == 0.0


def readme_own_loop_code() -> str:
    section = (REPO / "README.md").read_text().split(README_SECTION, 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_shows_the_tested_example_verbatim():
    source = EXAMPLE.read_text()
    docstring_end = ast.parse(source).body[0].end_lineno
    code = "\n".join(source.splitlines()[docstring_end:]).strip() + "\n"
    assert readme_own_loop_code() == code


def test_relif_with_a_gradient_method_in_an_own_loop(capsys):
    """PCGrad projects the conflicting gradients of the two tasks (their labels pull the first
    feature in opposite directions) and ReLiF's controller runs beside it."""
    assert len(PCGRAD_EXAMPLE.read_text().splitlines()) < 60
    runpy.run_path(str(PCGRAD_EXAMPLE), run_name="__main__")
    controller, projected, accuracy, audit = capsys.readouterr().out.strip().splitlines()
    stats = _check_training_and_audit(controller, accuracy, audit)
    assert 0.01 <= stats["lambda"] <= 1.0 and stats["lambda"] != 0.1
    assert 0 < _numbers(projected)["projected"] <= 150
