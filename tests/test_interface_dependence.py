"""The report's summary flags a method whose Bias cut is shown under one audit interface and not
under another ("the cut depends on the audit interface"), on a constructed experiment.

The construction: in a synthetic NYUv2 experiment, one label's depth and normal validation
scores are replaced by its same-seed ERM trial's, clipped to just outside ERM's q10/q90, which
the paper's squash maps to exactly 0 and 1. Under the paper's
interface (a) its audit scores then equal ERM's exactly (ratio 1 at every seed: no cut shown),
while the wider interfaces see its tails pulled in (a cut). Another label's scores are ERM's
moved halfway to their median (a cut under every interface) and `pcgrad` has ERM's spread (a
cut under none): neither is flagged.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from relif_ray import analysis
from relif_ray.analysis.interfaces import (
    INTERFACE_DEPENDENT,
    interface_dependence,
    interface_table,
)
from relif_ray.analysis.paired import paired_summary
from relif_ray.analysis.render import Column, Table, display_text
from relif_ray.analysis.summary import verdicts_section
from relif_ray.analysis.tables import CISettings, Skipped
from relif_ray.analysis.verdicts import VerdictSettings
from relif_ray.squash import squash_bounds
from relif_ray.testing.synthetic_experiment import rewrite_output, write_synthetic_experiment
from tests.test_analysis import SETTINGS, stored_trials

CLIPPED, HALVED = "relif-st", "relif-noalign"
"""The labels whose scores are rewritten (their names only matter as rows of the tables)."""
INTERFACES = ("(a) q10-q90", "(b) q1-q99", "(c) ecdf")


def halved(scores: pd.Series, task: str) -> pd.Series:
    """Every score moved halfway to the task's median (depth and normal on the log scale):
    every interface sees about half the spread."""
    values = scores.astype(np.float64)
    if task in ("depth", "normal"):
        logs = np.log(values)
        return np.exp(logs.median() + 0.5 * (logs - logs.median()))
    return values.median() + 0.5 * (values - values.median())


@pytest.fixture(scope="module")
def constructed(tmp_path_factory):
    root = write_synthetic_experiment(
        tmp_path_factory.mktemp("dependence") / "exp",
        labels=("erm", "pcgrad", CLIPPED, HALVED),
        seeds=4,
        n_examples=60,
    )
    stored = stored_trials(root)
    erm = {trial.seed: trial for trial in stored.values() if trial.is_erm}
    for trial in stored.values():
        label = trial.info["label"]
        if label not in (CLIPPED, HALVED):
            continue
        reference = erm[trial.seed].scores
        scores = reference.copy()  # ERM's scores, then rewritten
        for task in ("seg", "depth", "normal"):
            rows = (scores["task"] == task) & (scores["split"] == "val")
            if label == HALVED:
                scores.loc[rows, "score"] = halved(scores.loc[rows, "score"], task).astype(
                    np.float32
                )
                continue
            if task == "seg":
                continue
            valid = reference.loc[rows & reference["valid"], "score"].to_numpy(np.float64)
            low, high = squash_bounds(valid)  # just outside them, so that (a) clips to 0 and 1
            margin = 1e-5  # > 1e-6 (the squash's guard) + float32 rounding at these scores
            clipped = scores.loc[rows, "score"].astype(np.float64).clip(low - margin, high + margin)
            scores.loc[rows, "score"] = clipped.astype(np.float32)
        rewrite_output(trial.folder / "scores.parquet", scores)
    results = analysis.audit(analysis.load(root), 0.2, settings=SETTINGS, sensitivity=())
    return results


def test_the_summary_flags_the_cut_that_depends_on_the_interface(constructed) -> None:
    settings = VerdictSettings()
    table = interface_table(constructed, CISettings(n_boot=0), settings)
    cuts = table.rows.set_index(["row", "interface"])["cut"]
    # the construction: no cut under (a) (ERM's own scores there), a cut under (b) and (c)
    assert cuts[(CLIPPED, "(a) q10-q90")] == "no verdict: the 4 seeds did not vary: 1.00x"
    assert cuts[(CLIPPED, "(b) q1-q99")].startswith("lower than ERM (95%, 4 seeds)")
    assert cuts[(CLIPPED, "(c) ecdf")].startswith("lower than ERM (95%, 4 seeds)")
    for interface in INTERFACES:  # a cut shown under every interface, and one under none
        assert cuts[(HALVED, interface)].startswith("lower than ERM (95%, 4 seeds)")
        assert not cuts[("pcgrad", interface)].startswith("lower than ERM")
    expected = f"{INTERFACE_DEPENDENT} (shown under (b) q1-q99, (c) ecdf; not under (a) q10-q90)"
    assert interface_dependence(table) == {CLIPPED: expected}
    summary = verdicts_section(constructed, paired_summary(constructed, settings), settings, table)
    lines = {line.split("**")[1]: line for line in summary.splitlines() if line.startswith("- **")}
    assert lines[display_text(CLIPPED)].endswith(f"; **{expected}**.")
    assert INTERFACE_DEPENDENT not in lines[display_text(HALVED)] + lines[display_text("pcgrad")]
    plain = verdicts_section(constructed, paired_summary(constructed, settings), settings)
    assert INTERFACE_DEPENDENT not in plain  # without the table: nothing to flag


def test_the_flag_reads_only_shown_cuts() -> None:
    """Shown under every interface or under none: no flag; a "higher" verdict is not a cut; a
    skipped table flags nothing."""
    verdicts = {
        "a": ["lower than ERM (95%, 5 seeds): 0.2x", "lower than ERM (95%, 5 seeds): 0.3x"],
        "b": ["not shown with 5 seeds", "higher than ERM (95%, 5 seeds): 2x"],
        "c": ["higher than ERM (95%, 5 seeds): 2x", "lower than ERM (95%, 5 seeds): 0.4x"],
    }
    rows = pd.DataFrame(
        [
            {"row": row, "interface": interface, "cut": cut}
            for row, cuts in verdicts.items()
            for interface, cut in zip(("(a) q10-q90", "(c) ecdf"), cuts, strict=True)
        ]
    )
    columns = [Column("cut", "Cut", "Cut", None, "text")]
    table = Table("interfaces", "t", "Method", columns, rows)
    assert interface_dependence(table) == {
        "c": f"{INTERFACE_DEPENDENT} (shown under (c) ecdf; not under (a) q10-q90)"
    }
    assert interface_dependence(Skipped("interfaces", "t", "no squashed task")) == {}
