"""`relif report`: tables over seeds (mean +- sample std per method label) as Markdown and CSV."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.experiment import Experiment

LEADING_METRICS = ("worst", "macro")


def report_split(trials: pd.DataFrame) -> str:
    """Utility is reported on the test split where trials have one, else on validation."""
    return "test" if "test_worst" in trials.columns else "val"


def utility_table(trials: pd.DataFrame, split: str) -> pd.DataFrame:
    """One row per method label: n seeds, then mean and sample std (ddof=1) of each metric."""
    prefix = f"{split}_"
    metrics = [c[len(prefix) :] for c in trials.columns if c.startswith(prefix)]
    metrics = [m for m in LEADING_METRICS if m in metrics] + [
        m for m in metrics if m not in LEADING_METRICS and not m.endswith("_score")
    ]
    grouped = trials.groupby("label", sort=True)
    table = pd.DataFrame({"n_seeds": grouped["seed"].nunique()})
    for metric in metrics:
        values = grouped[prefix + metric]
        table[f"{metric}_mean"] = values.mean()
        table[f"{metric}_std"] = values.std(ddof=1)
    return table.reset_index()


def mean_std_markdown(table: pd.DataFrame, digits: int = 4) -> str:
    """Render `<metric>_mean`/`<metric>_std` column pairs as `mean ± std` cells."""
    metrics = [c[: -len("_mean")] for c in table.columns if c.endswith("_mean")]
    header = ["Method", "Seeds", *metrics]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, row in table.iterrows():
        cells = [str(row["label"]), str(int(row["n_seeds"]))]
        for metric in metrics:
            mean, std = row[f"{metric}_mean"], row[f"{metric}_std"]
            cells.append(f"{mean:.{digits}f}" + ("" if pd.isna(std) else f" ± {std:.{digits}f}"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_report(experiment: Experiment, out_dir: str | Path) -> Path:
    """Write utility.md, utility.csv and report.md into `out_dir`; return report.md's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sections = ["# relif-ray report\n"]
    trials = experiment.trials
    if not trials.empty:
        split = report_split(trials)
        table = utility_table(trials, split)
        table.to_csv(out / "utility.csv", index=False)
        markdown = mean_std_markdown(table)
        (out / "utility.md").write_text(markdown)
        sections += [
            f"## Utility ({split} split, mean ± sample std over seeds)\n",
            markdown,
            f"{len(trials)} finished trials from: "
            + ", ".join(sorted(set(trials["experiment"])))
            + "\n",
        ]
    if not experiment.problems.empty:
        sections.append("## Trials without outputs (listed, not dropped)\n")
        for _, problem in experiment.problems.iterrows():
            sections.append(f"- {problem['status']}: `{problem['path']}` {problem['error']}")
        sections.append("")
    report = out / "report.md"
    report.write_text("\n".join(sections))
    return report
