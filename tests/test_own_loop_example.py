"""docs/examples/own_loop.py: ReLiF and the fixed-delta audit in a plain PyTorch loop."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "own_loop.py"


def _run_example() -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _numbers(text: str) -> dict[str, float]:
    return {key: float(value) for key, value in re.findall(r"(\w+)=([-\d.e]+)", text)}


def test_example_trains_with_the_controller_and_audits():
    output = _run_example()
    assert len(EXAMPLE.read_text().splitlines()) < 60
    controller, accuracy, audit = output.strip().splitlines()
    stats = _numbers(controller)
    # the controller ran past its warmup: lambda left lambda0 = 0.1 and stays in its bounds
    assert 0.01 <= stats["lambda"] <= 1.0 and stats["lambda"] != 0.1
    assert 0.0 <= stats["r_ema"] <= 1.0 and stats["loss_lip"] >= 0.0
    accuracies = ast.literal_eval(accuracy.removeprefix("accuracy "))
    assert all(value > 0.8 for value in accuracies.values())
    result = _numbers(audit)
    # gaps lie in [0, 1], so (gap - delta)+ <= (1 - delta) 1[gap > delta]
    assert 0.0 <= result["bias"] <= 0.9 * result["vr"] <= 0.9
