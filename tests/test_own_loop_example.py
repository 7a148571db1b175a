"""docs/examples/own_loop.py and own_loop_pcgrad.py: ReLiF in a plain PyTorch loop, alone and
with PCGrad, audited under the sweep's protocol against the same loop without it; and the
README's own loop, which runs as pasted."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "docs" / "examples"
EXAMPLE = EXAMPLES / "own_loop.py"
PCGRAD_EXAMPLE = EXAMPLES / "own_loop_pcgrad.py"
README_SECTION = "## ReLiF in your own loop"
R_STAR = 0.16
"""The examples' target violation rate (the paper's eICU r*)."""


def run_example(path: Path, monkeypatch, capsys) -> list[str]:
    """The lines `path` prints, run as a script in this process (one torch thread, as the
    suite's tests run); own_loop_pcgrad.py imports own_loop.py from its folder."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.delitem(sys.modules, "own_loop", raising=False)
    runpy.run_path(str(path), run_name="__main__")
    monkeypatch.delitem(sys.modules, "own_loop", raising=False)
    return capsys.readouterr().out.strip().splitlines()


def numbers(line: str) -> dict[str, float]:
    return {key: float(value) for key, value in re.findall(r"(\w+)=([-\d.e]+)", line)}


def check_relif_acting(lines: list[str], plain: str, relif: str) -> None:
    """The report of a plain run and a ReLiF run of the same loop from the same seed: one
    delta_ref held fixed for both; ReLiF's lambda moved off lambda0 and off its bounds, up,
    because the plain loop violates more often than r*; ReLiF's fixed-delta Bias is lower."""
    assert lines[0].startswith("delta_ref=") and "plain loop's validation distances" in lines[0]
    delta = numbers(lines[0])["delta_ref"]
    # cosine distances of ReLU representations (non-negative: cos >= 0) lie in [0, 0.5]
    assert 0.0 < delta <= 0.5
    runs = {line.split(":", 1)[0]: numbers(line) for line in lines[1:]}
    assert list(runs) == [plain, relif]
    reference, regularized = runs[plain], runs[relif]
    assert reference["lambda"] == 0.0  # lipschitz_branch=False: no ReLiF loss
    assert reference["r_ema"] > R_STAR  # the plain loop violates more often than r*
    assert 0.1 < regularized["lambda"] < 1.0  # raised from lambda0, below lambda_max
    assert regularized["r_ema"] < reference["r_ema"]
    assert regularized["bias"] < reference["bias"]
    for run in runs.values():
        # gaps lie in [0, 1], so (gap - delta)+ <= (1 - delta) 1[gap > delta]
        assert 0.0 < run["bias"] <= (1 - delta) * run["vr"] <= 1.0
        assert run["mortality_auroc"] > 0.65 and run["stay_kappa"] > 0.0  # both tasks learnt


def test_relif_cuts_the_fixed_delta_bias_of_the_same_loop(monkeypatch, capsys):
    lines = run_example(EXAMPLE, monkeypatch, capsys)
    assert len(lines) == 3
    check_relif_acting(lines, "plain", "relif")


def test_relif_with_pcgrad_cuts_the_fixed_delta_bias_of_plain_pcgrad(monkeypatch, capsys):
    """PCGrad projects conflicting task gradients in both runs; ReLiF's gradient is added after
    the projection."""
    lines = run_example(PCGRAD_EXAMPLE, monkeypatch, capsys)
    projected, report = lines[:2], lines[2:]
    assert all(0 < numbers(line)["projected"] < 150 for line in projected)
    check_relif_acting(report, "pcgrad", "pcgrad+relif")


def readme_own_loop_code() -> str:
    section = (REPO / "README.md").read_text().split(README_SECTION, 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_the_readme_loop_runs_as_pasted_and_relif_acts(tmp_path):
    """The README's block, imports included, run as a script of its own in a new process
    (nothing of this process's state): it trains, audits and prints lambda, r and Bias, and
    lambda rose above lambda0 = 0.1 because the loop violates more often than r* = 0.16."""
    script = tmp_path / "readme_loop.py"
    script.write_text(readme_own_loop_code())
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    printed = numbers(done.stdout.strip().splitlines()[-1])
    assert 0.1 < printed["lambda"] < 1.0
    assert 0.0 < printed["Bias"] < 1.0 and printed["r"] > 0.0


@pytest.mark.parametrize("path", [EXAMPLE, PCGRAD_EXAMPLE])
def test_the_examples_stay_short(path):
    assert len(path.read_text().splitlines()) <= 110
