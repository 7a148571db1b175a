"""The real cohorts' results pages (docs/<preset>.md, made by `python -m benchmarks.cohorts`)
against their records: the command, commit and wall times the page states are its record's,
the grid is 3 r* x 3 eta over at least 5 seeds around the defaults of the controller-budget
rule, the methods ran 10 seeds, and the controller flag beside a verdict is there exactly where
the trials' lambda stayed within 10% of lambda0 on every seed. The page helpers are tested on
a small report."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.cohort_page import COHORTS, minutes, relinked, section
from benchmarks.cohorts import ETA_FACTORS, R_STAR_OFFSETS, grid_flags, methods

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("preset", sorted(COHORTS))
def test_a_cohort_page_states_what_its_record_holds(preset: str) -> None:
    page = (DOCS / f"{preset}.md").read_text()
    record = json.loads((DOCS / preset / "record.json").read_text())
    assert record["preset"] == preset
    assert f"Commit {record['machine']['commit']}" in page
    seconds = record["seconds"]
    assert f"the sweep {minutes(seconds['sweep'])}, its report {minutes(seconds['report'])}" in page
    for command in record["commands"]:
        assert command in page
    trials = pd.read_csv(DOCS / preset / "per_trial.csv")
    counts = trials.groupby("label")["seed"].nunique()
    assert set(counts.index) == set(methods(preset).split(",")) and (counts >= 10).all()
    assert record["methods"] == methods(preset).split(",")
    controller = record["controller"]
    grid = pd.read_csv(DOCS / preset / "grid_per_trial.csv")
    relif = grid[grid["label"] == "relif"]
    found = relif["variant"].str.extract(r"r\*=([0-9.e-]+), eta=([0-9.e-]+)").astype(float)
    settings = relif.groupby([found[0], found[1]])["seed"].nunique()
    r_stars = sorted(settings.index.get_level_values(0).unique())
    etas = sorted(settings.index.get_level_values(1).unique())
    assert r_stars == pytest.approx([controller["r_star"] + o for o in R_STAR_OFFSETS])
    assert etas == pytest.approx([controller["eta"] * f for f in ETA_FACTORS], rel=1e-3)
    assert len(settings) == 9 and (settings >= 5).all()


@pytest.mark.parametrize("preset", sorted(COHORTS))
def test_a_cohort_page_flags_the_controller_where_lambda_did_not_move(preset: str) -> None:
    """The flag beside a variant's verdicts is there exactly where its trials' lambda stayed
    within 10% of lambda0 throughout (controller_activity.csv)."""
    page = (DOCS / f"{preset}.md").read_text()
    summary = section(page.replace("\n### ", "\n## "), "Summary: verdicts over seeds")
    activity = pd.read_csv(DOCS / preset / "controller_activity.csv")
    for variant, rows in activity.groupby("variant"):
        line = next(ln for ln in summary.splitlines() if ln.startswith("- **") and
                    ln.split("**")[1].lower() == variant.lower())  # fmt: skip
        flagged = "controller inert: λ stayed within 10% of λ0 on every seed" in line
        assert flagged == bool(rows["inert"].all()), variant
        moved = (rows["lambda_low"] < 0.09) | (rows["lambda_high"] > 0.11)
        assert (moved == ~rows["inert"]).all()


def test_the_page_helpers_cut_sections_and_keep_links_to_kept_files() -> None:
    report = "## A\nline [x](tables/a.csv) [y](per_trial.csv)\n## B\nb\n"
    assert section(report, "A").startswith("## A\n") and "## B" not in section(report, "A")
    assert section(report, "A", level=3).startswith("### A\n")
    assert section(report, "C") == ""
    kept = relinked(section(report, "A"), {"per_trial.csv": "per_trial.csv"}, "actg175")
    assert "[y](actg175/per_trial.csv)" in kept and "[x]" not in kept and " x " in kept
    assert minutes(59.4) == "59 s" and minutes(125) == "2 min 5 s" and minutes(1200) == "20 min"
    figure = relinked("a\n\n![f](figures/x.png)\n\nb", {}, "actg175")
    assert figure == "a\n\nb"  # a figure the page does not keep is left out
    flags = grid_flags(0.16, 0.018, 5)
    assert flags[flags.index("--r-star") + 1] == "0.12,0.16,0.2"
    assert flags[flags.index("--eta") + 1] == "0.0018,0.018,0.18"


@pytest.mark.parametrize("preset", sorted(COHORTS))
def test_the_speed_page_quotes_each_cohorts_record(preset: str) -> None:
    """docs/benchmarks.md's row of each cohort: its sweep's and report's seconds, and the
    verdict of each target, as its record holds them."""
    record = json.loads((DOCS / preset / "record.json").read_text())
    text = (DOCS / "benchmarks.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith(f"| [{COHORTS[preset][0]}]"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    seconds, targets = record["seconds"], record["targets"]
    assert cells[2:4] == [f"{seconds['sweep']:.0f}", f"{seconds['report']:.1f}"]
    together = seconds["sweep"] + seconds["report"] <= targets["sweep_and_report_s"]
    report = seconds["report"] <= targets["report_s"]
    assert cells[5:7] == ["pass" if together else "FAIL", "pass" if report else "FAIL"]
