"""The real cohorts' results pages, and what they cost: per preset of the tabular benchmark
(ACTG 175, SUPPORT2, COMPAS) a sweep of the methods at the defaults over 10 seeds, the
controller grid (3 r* x 3 eta around the defaults, 5 seeds), `relif report` of each, timed,
and where the report's time goes; written as docs/<preset>.md with its records in
docs/<preset>/.

    python -m benchmarks.cohorts actg175 [--storage DIR] [--seeds 10] [--grid-seeds 5]
    python -m benchmarks.cohorts actg175 --page-only    # remake the page from DIR's runs

Every setting is the benchmark's default (the controller's eta and warmup by the
controller-budget rule, `relif_ray.sweep.compose.controller_budget`); nothing is tuned on these
data. The grid's r* are the default -0.04, +0 and +0.04, its eta the default x 0.1, 1 and 10
(the paper's controller checks span a factor 100 in eta, 1e-4 to 1e-2). The sweep and the
report are timed as one command each, as a user runs them (`SWEEP_TARGET_S`,
`REPORT_TARGET_S`); a second, profiled run of the main report says where its time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import machine

REPO = Path(__file__).resolve().parents[1]
METHODS = "erm,relif,relif-st,pcgrad,fairgrad,uncertainty,gradnorm"
"""The page's methods: ERM, the paper's ReLiF and our straight-through variant, and the
paper's baselines (CATS is not implemented: the paper does not define it). A preset whose
audit scores are all probabilities runs without `relif-st`, whose squash gradient changes
nothing there (the sweep refuses it): `methods`."""
R_STAR_OFFSETS = (-0.04, 0.0, 0.04)
ETA_FACTORS = (0.1, 1.0, 10.0)
SWEEP_TARGET_S = 20 * 60
"""A cohort's 10-seed sweep plus its report, on 2 cores."""
REPORT_TARGET_S = 60.0
"""`relif report` of a 70-trial tabular experiment."""
PHASES = {
    "load the experiment": "analysis/experiment.py:load",
    "audit set-up (the audits run lazily, in the phases below)": "analysis/results.py:audit",
    "paired verdicts over seeds (their pair bootstrap)": "analysis/paired.py:paired_summary",
    "tables (the Bias intervals' pair bootstrap)": "analysis/report.py:_tables",
    "of which the Bias intervals": "relif_ray/audit_bootstrap.py:bootstrap_bias_cis_batch",
    "group audit": "analysis/groups.py:group_audit",
    "figures": "analysis/report.py:_write_figures",
    "data files": "analysis/report.py:_write_data",
}
"""The report's phases (`relif_ray.analysis.report`) whose cumulative time the profile gives."""
PAGE_SECTIONS = (
    "## Summary: verdicts over seeds",
    "## Controller activity",
    "## Utility and fixed-δ Bias",
    "## Audit-interface sensitivity",
)
"""The sections of the main report the page shows as they are (the rest: its records)."""


def methods(preset: str) -> str:
    """`METHODS` for `preset`: without `relif-st` where no task's audit score is squashed."""
    import importlib

    from relif_ray.data.table_spec import TableSpec
    from relif_ray.problems.tabular import spec_tasks

    spec = TableSpec.from_dict(importlib.import_module(f"relif_ray.data.{preset}").SPEC)
    if any(not task.score_is_probability for task in spec_tasks(spec)):
        return METHODS
    return ",".join(label for label in METHODS.split(",") if label != "relif-st")


def run(command: list[str], log: Path) -> float:
    """Run `command` (python arguments) from the repository; its wall seconds. A failure
    stops the benchmark with the log's tail."""
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run([sys.executable, *command], cwd=REPO, stdout=out, stderr=out)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {done.returncode}: {log.read_text()[-2000:]}")
    return time.perf_counter() - start


def sweep_command(preset: str, name: str, storage: Path, extra: list[str]) -> list[str]:
    return [
        "sweeps/tabular.py", "--preset", preset, "--name", name, "--num-cpus", "2",
        "--storage", str(storage), *extra,
    ]  # fmt: skip


def report_command(experiment: Path, out: Path) -> list[str]:
    return ["-m", "relif_ray.cli", "report", str(experiment), "--out", str(out)]


def default_controller(experiment: Path) -> tuple[float, float, int]:
    """(r*, eta, warmup) of the main sweep's ReLiF trials: the defaults the grid centres on."""
    from relif_ray import analysis

    trials = analysis.load(str(experiment)).trials
    relif = trials[trials["label"] == "relif"]["config"].iloc[0]["relif"]
    return float(relif["r_star"]), float(relif["eta"]), int(relif["warmup_steps"])


def grid_flags(r_star: float, eta: float, seeds: int) -> list[str]:
    r_stars = ",".join(f"{r_star + offset:.4g}" for offset in R_STAR_OFFSETS)
    etas = ",".join(f"{eta * factor:.4g}" for factor in ETA_FACTORS)
    return ["--methods", "erm,relif", "--seeds", str(seeds), "--r-star", r_stars, "--eta", etas]


def report_phases(experiment: Path, out: Path) -> dict[str, float]:
    """The cumulative seconds of each of the report's `PHASES`, from a profiled run of the
    report's defaults (`analysis.write_report`, what `relif report` runs)."""
    from relif_ray import analysis

    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.runcall(lambda: analysis.write_report(analysis.load(str(experiment)), out))
    found = {"the profiled report": round(time.perf_counter() - start, 1)}
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    seconds: dict[str, float] = {}
    for (path, _, function), (_, _, _, cumulative, _) in stats.items():
        for phase, where in PHASES.items():
            file, name = where.split(":")
            if path.endswith(file) and function == name:
                seconds[phase] = seconds.get(phase, 0.0) + cumulative
    return found | {phase: round(seconds[phase], 1) for phase in PHASES if phase in seconds}


def measure(preset: str, storage: Path, seeds: int, grid_seeds: int) -> dict[str, object]:
    """Run the main sweep, its report, the grid and its report; the record of the run."""
    storage.mkdir(parents=True, exist_ok=True)
    main, grid = storage / preset, storage / f"{preset}-grid"
    for folder in (main, grid, storage / f"{preset}-report", storage / f"{preset}-grid-report"):
        shutil.rmtree(folder, ignore_errors=True)
    load = [round(os.getloadavg()[0], 2)]
    flags = ["--methods", methods(preset), "--seeds", str(seeds)]
    seconds = {"sweep": run(sweep_command(preset, preset, storage, flags), storage / "sweep.log")}
    seconds["report"] = run(report_command(main, storage / f"{preset}-report"),
                            storage / "report.log")  # fmt: skip
    load.append(round(os.getloadavg()[0], 2))
    r_star, eta, warmup = default_controller(main)
    grid_extra = grid_flags(r_star, eta, grid_seeds)
    seconds["grid sweep"] = run(sweep_command(preset, grid.name, storage, grid_extra),
                                storage / "grid.log")  # fmt: skip
    seconds["grid report"] = run(report_command(grid, storage / f"{grid.name}-report"),
                                 storage / "grid-report.log")  # fmt: skip
    load.append(round(os.getloadavg()[0], 2))
    phases = report_phases(main, storage / "profiled-report")
    results = Path("relif-results")
    shown = [
        "python " + " ".join(sweep_command(preset, preset, results, flags)),
        f"relif report relif-results/{preset} --out reports/{preset}",
        "python " + " ".join(sweep_command(preset, grid.name, results, grid_extra)),
        f"relif report relif-results/{grid.name} --out reports/{grid.name}",
    ]
    return {
        "machine": machine(cuda=False),
        "preset": preset,
        "methods": methods(preset).split(","),
        "commands": shown,
        "seconds": {name: round(value, 1) for name, value in seconds.items()},
        "load_average": load,
        "controller": {"r_star": r_star, "eta": eta, "warmup_steps": warmup},
        "targets": {"sweep_and_report_s": SWEEP_TARGET_S, "report_s": REPORT_TARGET_S},
        "report_phases_s": phases,
    }


def main(argv: list[str] | None = None) -> int:
    from benchmarks.cohort_page import write_page

    parser = argparse.ArgumentParser(prog="python -m benchmarks.cohorts")
    parser.add_argument("preset", choices=("actg175", "support2", "compas"))
    parser.add_argument("--storage", type=Path, default=Path("relif-results") / "cohorts")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--grid-seeds", type=int, default=5)
    parser.add_argument("--page-only", action="store_true", help="remake the page only")
    args = parser.parse_args(argv)
    storage = args.storage.resolve()
    record_file = storage / f"{args.preset}-record.json"
    if not args.page_only:
        record = measure(args.preset, storage, args.seeds, args.grid_seeds)
        record_file.write_text(json.dumps(record, indent=2) + "\n")
    record = json.loads(record_file.read_text())
    print(write_page(record, storage, REPO / "docs"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
