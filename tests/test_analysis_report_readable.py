"""`relif report` reads well: every link resolves, methods by their display names, decimals per
column, controller settings in numeric order, wide LaTeX tables over both columns, and progress
bars on a terminal only."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pandas as pd
import pytest

from relif_ray import analysis
from relif_ray.analysis.render import display_text
from relif_ray.cli import main as relif_main
from relif_ray.sweep.labels import display_name
from relif_ray.testing.synthetic_experiment import write_synthetic_experiment

LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def experiment_dir(tmp_path_factory) -> Path:
    """Controller settings and seeds written in text order (r* 0.28 before 0.2, seed 10
    before seed 2), as trial folder names sort."""
    return write_synthetic_experiment(
        tmp_path_factory.mktemp("readable") / "exp",
        labels=("erm", "pcgrad", "relif", "pcgrad+relif", "relif-noalign"),
        seeds=[10, 2],
        n_examples=24,
        splits=("val", "test"),
        controller_grid=((0.28, 1e-3), (0.2, 1e-3), (0.24, 1e-2)),
        errored=1,
    )


@pytest.fixture(scope="module")
def report_dir(experiment_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("readable-report") / "report"
    flags = ["--n-boot", "20", "--pool-size", "16", "--pairs", "256"]
    assert relif_main(["report", str(experiment_dir), "--out", str(out), *flags]) == 0
    return out


@pytest.mark.slow
def test_every_link_in_report_md_resolves(report_dir: Path):
    links = LINK.findall((report_dir / "report.md").read_text())
    missing = [link for link in links if not (report_dir / link).is_file()]
    assert missing == []
    written = {
        str(path.relative_to(report_dir))
        for folder in ("tables", "figures")
        for path in (report_dir / folder).iterdir()
    }
    assert "tables/utility.md" in written
    assert written <= set(links)  # every table and figure is linked
    assert {"per_trial.csv", "delta_ref.json", "pareto_points.csv"} <= set(links)


def test_tables_show_display_names_and_csv_files_keep_labels(report_dir: Path):
    markdown = (report_dir / "tables" / "main.md").read_text()
    rows = [line.split(" | ")[0].removeprefix("| ") for line in markdown.splitlines()[2:]]
    assert rows[:2] == ["ERM", "PCGrad"]
    assert "PCGrad+ReLiF (r*=0.2, eta=0.001)" in rows
    assert "ReLiF-no-align (r*=0.24, eta=0.01)" in rows
    assert not any(row.startswith(("erm", "relif", "pcgrad")) for row in rows)
    assert pd.read_csv(report_dir / "tables" / "main.csv")["method"].iloc[0] == "erm"
    report = (report_dir / "report.md").read_text()
    assert "- PCGrad+ReLiF (r*=0.2, eta=0.001): seeds 2, 10" in report
    latex = (report_dir / "tables" / "certificate.tex").read_text()
    assert r"ERM vs PCGrad &" in latex


def test_display_names_of_labels():
    assert display_name("relif") == "ReLiF"
    assert display_name("pcgrad+relif-noalign") == "PCGrad+ReLiF-no-align"
    assert display_name("nosuch") == "nosuch"
    assert display_text("erm vs relif (r*=0.2, eta=0.001)") == "ERM vs ReLiF (r*=0.2, eta=0.001)"


def cells(markdown: str, header: str) -> list[str]:
    lines = markdown.splitlines()
    headers = [h.strip() for h in lines[0].strip("|").split("|")]
    column = headers.index(header)
    return [line.strip("|").split("|")[column].strip() for line in lines[2:]]


def mean_std(digits: int) -> str:
    """A Markdown stat cell: mean ± std with `digits` decimals, maybe bold or underlined."""
    number = rf"\d+\.\d{{{digits}}}"
    return rf"(<u>|\*\*)?{number} ± {number}(</u>|\*\*)?"


def test_decimals_per_column(report_dir: Path):
    main = (report_dir / "tables" / "main.md").read_text()
    assert all(re.fullmatch(mean_std(4), c) for c in cells(main, "Worst ↑"))
    assert all(re.fullmatch(mean_std(2), c) for c in cells(main, "Normal mean ↓"))
    violation = (report_dir / "tables" / "violation.md").read_text()
    header = violation.splitlines()[0].strip("|").split("|")[1].strip()
    assert all(re.fullmatch(mean_std(3), c) for c in cells(violation, header))
    utility = (report_dir / "tables" / "utility.md").read_text()
    assert "Depth RMSE ↓" in utility and "Normal angle mean ↓" in utility
    assert "depth_rmse" not in utility


def test_controller_settings_and_seeds_sort_as_numbers(experiment_dir, report_dir: Path):
    trials = analysis.load(experiment_dir).trials
    relif = trials[trials["label"] == "relif"]
    assert list(zip(relif["r_star"], relif["eta"], relif["seed"], strict=True)) == [
        (0.2, 1e-3, 2),
        (0.2, 1e-3, 10),
        (0.24, 1e-2, 2),
        (0.24, 1e-2, 10),
        (0.28, 1e-3, 2),
        (0.28, 1e-3, 10),
    ]
    controller = pd.read_csv(report_dir / "tables" / "controller.csv")
    assert controller["r_star"].tolist()[:3] == [0.2, 0.24, 0.28]


def test_wide_latex_tables_span_both_columns(report_dir: Path):
    main = (report_dir / "tables" / "main.tex").read_text()
    assert main.startswith("\\begin{table*}[!t]\n\\centering\n\\caption{")
    assert main.rstrip().endswith("\\end{table*}")
    # method + 7 stat columns + the two verdict columns and "Saturated" (NYUv2 scores are
    # squashed)
    assert "\\begin{tabular}{lcccccccccc}" in main and "\\toprule" in main
    violation = (report_dir / "tables" / "violation.tex").read_text()
    assert violation.startswith("\\begin{table}[!t]") and "\\begin{tabular}{lcc}" in violation
    body = main.split("\\midrule\n")[1].split("\\bottomrule")[0].strip().splitlines()
    assert len(body) == 2 + 3 * 3  # ERM, PCGrad, three ReLiF variants x three settings
    assert all(line.count(" & ") == 10 and line.endswith("\\\\") for line in body)


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False])
@pytest.mark.slow
def test_progress_bars_on_a_terminal_only(experiment_dir, tmp_path, monkeypatch, terminal):
    stderr = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    data = ["make-data", "eicu", "--out", str(tmp_path / "eicu"), "--patients", "40"]
    assert relif_main(data) == 0
    report = ["report", str(experiment_dir), "--out", str(tmp_path / "out"), "--n-boot", "0"]
    assert relif_main([*report, "--pool-size", "16", "--pairs", "64", "--no-figures"]) == 0
    written = stderr.getvalue()
    if terminal:
        assert re.search(r"eICU: +\d+%.*/40 ", written)
        assert re.search(r"loading trials: +\d+%.*/23 ", written)  # 22 trials, 1 errored
        assert re.search(r"relif report: tables: +\d+%.*/13 ", written)
    else:
        assert written == ""
