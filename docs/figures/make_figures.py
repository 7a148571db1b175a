"""The README's two figures and claim, and the analysis notebook's outputs, made from the demo
and a controller grid. Regenerate them with

    python docs/figures/make_figures.py

It runs, in a temporary folder, the Quickstart's demo (`sweeps/nyuv2.py --demo`: a real Ray
Tune sweep of ERM and ReLiF, 2 seeds of 240 steps, on synthetic NYUv2) and `relif report`, and
the controller grid: the demo's sweep at 48 steps with ReLiF crossed with a 3 x 3 (r*, eta)
grid (`GRID_R_STARS` x `GRID_ETAS`, 2 seeds, the same-seed ERM trials included for delta_ref). It
copies the report's Pareto figure and ReLiF's controller figure here (pareto.png,
controller.png), executes the analysis notebook on the demo's experiment with the grid's for its
controller heatmaps (`RELIF_CONTROLLER_GRID`) and stores it with its outputs (so that it opens
with its figures shown), and writes
- demo.json: the machine, the commit, the date, the seconds the demo and its report took, and
  the numbers the README quotes: per method the mean over seeds of Bias@delta_p75 and Worst,
  and per compared method the report's verdicts over seeds against same-seed ERM of
  Bias@delta_p75 and Worst (its tables/paired.csv rows, with the per-seed values);
- controller_grid.json: the machine, the commit, the date, the grid's command, seconds and the
  load average before and after it, its delta_ref, and per trial its seed, r*, eta,
  Bias@delta_p75 and Worst (`analysis.audit`, the notebook's settings), from which the
  notebook's heatmap cells are the means over seeds (tests/test_analysis_notebook.py).
tests/test_readme.py holds the README's caption and its sentence on the demo to demo.json. The
demo takes minutes on 2 cores (docs/benchmarks.md), the grid a few more; another CPU gives
other numbers, as another seed would.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from relif_ray.problems.nyuv2 import DEFAULTS as NYUV2
from relif_ray.relif.controller import scale_to_budget
from relif_ray.sweep.plan import CONTROLLER_ETAS
from relif_ray.testing.synthetic_experiment import DEMO_EXPERIMENT

REPO = Path(__file__).resolve().parents[2]
FIGURES = Path(__file__).resolve().parent
NOTEBOOK = REPO / "analysis" / "notebooks" / "explore_experiment.ipynb"
SHOWN = {"pareto.png": "pareto.png", "controller.png": "controller_relif.png"}
"""README figure -> the report's figure it copies."""

GRID_EXPERIMENT = DEMO_EXPERIMENT.parent / "nyuv2-controller-grid"
"""Where the grid's command (`grid_command`) writes its experiment when run in the repository."""
GRID_R_STARS = (0.20, 0.24, 0.28)
"""r* of the grid: NYUv2's r* = 0.24 (paper Table 5) and 0.04 either side, inside the range of
the paper's r* check (0.16 to 0.28)."""
GRID_STEPS = NYUV2.demo_train["steps"] // 5
"""Steps per grid trial: a fifth of the demo's 240, so that its 20 trials take minutes on 2
cores (at the paper's controller speed, `GRID_ETAS`)."""
GRID_ETAS = tuple(
    float(f"{scale_to_budget(GRID_STEPS, float(eta))[0]:g}") for eta in CONTROLLER_ETAS.split(",")
)
"""eta of the grid: the paper's eta check (1e-4, 1e-3, 1e-2) scaled to `GRID_STEPS` as the demo
scales NYUv2's eta = 1e-3 to its own steps (`scale_to_budget`: 0.04125, 0.4125, 4.125), as the
command writes them (6 significant digits)."""
GRID_SEEDS = 2
"""Seeds per grid setting: the demo's."""


def machine() -> str:
    """'2 cores of an Intel Xeon Processor': this process's CPUs and the processor's model
    name (without trademark signs)."""
    names = [
        line.split(":", 1)[1].strip()
        for line in Path("/proc/cpuinfo").read_text().splitlines()
        if line.startswith("model name")
    ]
    model = names[0] if names else platform.processor() or platform.machine()
    model = " ".join(model.replace("(R)", "").replace("(TM)", "").split())
    return f"{len(os.sched_getaffinity(0))} cores of an {model}"


def commit() -> str:
    """The short commit of the code, marked when a file other than Markdown, a notebook or this
    folder's differs from it (text and the notebook's outputs do not change the demo's
    numbers)."""
    git = ["git", "-C", str(REPO)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    changed = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    paths = [line[3:] for line in changed.stdout.splitlines()]
    dirty = [
        path for path in paths if not (path.endswith((".md", ".ipynb")) or "docs/figures/" in path)
    ]
    return head.stdout.strip() + (" with uncommitted changes" if dirty else "")


def demo_numbers(report: Path) -> dict[str, dict[str, float]]:
    """Per method label: the mean over seeds of Bias@delta_p75 and Worst, from per_trial.csv."""
    trials = pd.read_csv(report / "per_trial.csv")
    means = trials.groupby("label")[["bias_p75", "worst"]].mean()
    return {
        str(label): {"bias_p75": float(row.bias_p75), "worst": float(row.worst)}
        for label, row in means.iterrows()
    }


def demo_verdicts(report: Path) -> dict[str, dict[str, dict[str, object]]]:
    """Per compared label, the report's paired.csv rows of Bias@delta_p75 and Worst: n_seeds,
    estimate, ci_low, ci_high, verdict, seeds_needed (None where empty) and the per-seed
    values {seed: value}."""
    paired = pd.read_csv(report / "tables" / "paired.csv", dtype={"delta": str})
    paired["delta"] = paired["delta"].fillna("")
    chosen = paired[
        ((paired["metric"] == "bias") & (paired["delta"] == "p75")) | (paired["metric"] == "worst")
    ]
    verdicts: dict[str, dict[str, dict[str, object]]] = {}
    for row in chosen.itertuples():
        per_seed = dict(part.split(": ") for part in row.per_seed.split("; "))
        verdicts.setdefault(str(row.label), {})[str(row.metric)] = {
            "n_seeds": int(row.n_seeds),
            "estimate": float(row.estimate),
            "ci_low": float(row.ci_low),
            "ci_high": float(row.ci_high),
            "verdict": str(row.verdict),
            "seeds_needed": None if pd.isna(row.seeds_needed) else int(row.seeds_needed),
            "per_seed": {seed: float(value) for seed, value in per_seed.items()},
        }
    return verdicts


def provenance() -> dict[str, str]:
    """The commit, machine, date and software a record was made with."""
    return {
        "commit": commit(),
        "machine": machine(),
        "date": datetime.date.today().isoformat(),
        "software": f"Python {platform.python_version()}, torch {version('torch')}, "
        f"Ray {version('ray')}",
    }


def grid_command(storage: Path | str) -> list[str]:
    """The controller grid's sweep (run from the repository): the demo's ERM and ReLiF at
    `GRID_STEPS` steps, ReLiF crossed with `GRID_R_STARS` x `GRID_ETAS`, `GRID_SEEDS` seeds,
    into `storage`."""
    return [
        "sweeps/nyuv2.py", "--demo", "--steps", str(GRID_STEPS), "--seeds", str(GRID_SEEDS),
        "--r-star", ",".join(f"{r_star:g}" for r_star in GRID_R_STARS),
        "--eta", ",".join(f"{eta:g}" for eta in GRID_ETAS),
        "--name", GRID_EXPERIMENT.name, "--storage", str(storage),
    ]  # fmt: skip


def grid_trials(experiment: Path) -> tuple[dict[str, object], list[dict[str, object]]]:
    """The grid's delta_ref (symbol, value, split) and per trial its Tune id, label, seed, r* and
    eta (None for ERM) and its Bias at delta_ref and Worst: `analysis.audit` with the
    notebook's settings (the defaults of `AuditSettings`) on the split the notebook audits."""
    from relif_ray import analysis

    loaded = analysis.load(str(experiment))
    results = analysis.audit(loaded)
    trials = loaded.trials.set_index("trial")
    rows = []
    for row in results.per_trial.itertuples():
        trial = trials.loc[row.trial]
        rows.append({
            "trial": row.trial, "label": row.label, "seed": int(row.seed),
            "r_star": None if pd.isna(trial["r_star"]) else float(trial["r_star"]),
            "eta": None if pd.isna(trial["eta"]) else float(trial["eta"]),
            "bias": float(getattr(row, f"bias_{results.primary.key}")),
            "worst": float(row.worst),
        })  # fmt: skip
    delta = results.primary
    return {"symbol": delta.symbol, "value": delta.value, "split": results.split}, rows


def run_grid(storage: Path) -> dict[str, object]:
    """Run the controller grid into `storage` and return controller_grid.json's record."""
    load_start = round(os.getloadavg()[0], 1)
    start = time.perf_counter()
    subprocess.run([sys.executable, *grid_command(storage)], cwd=REPO, check=True)
    seconds = round(time.perf_counter() - start)
    delta, trials = grid_trials(storage / GRID_EXPERIMENT.name)
    return {
        **provenance(),
        "command": "python " + " ".join(grid_command("relif-results")),
        "grid": {
            "r_star": list(GRID_R_STARS),
            "eta": list(GRID_ETAS),
            "seeds": GRID_SEEDS,
            "steps": GRID_STEPS,
        },  # fmt: skip
        "sweep_s": seconds,
        "load_average_start": load_start,
        "load_average_end": round(os.getloadavg()[0], 1),
        "delta_ref": delta,
        "trials": trials,
    }


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="relif-figures-") as folder:
        storage, report = Path(folder) / "results", Path(folder) / "report"
        python = [sys.executable]
        start = time.perf_counter()
        subprocess.run([*python, "sweeps/nyuv2.py", "--demo", "--storage", str(storage)],
                       cwd=REPO, check=True)  # fmt: skip
        subprocess.run([*python, "-m", "relif_ray.cli", "report", str(storage / "nyuv2-demo"),
                        "--out", str(report)], cwd=REPO, check=True)  # fmt: skip
        seconds = round(time.perf_counter() - start)
        for shown, made in SHOWN.items():
            shutil.copyfile(report / "figures" / made, FIGURES / shown)
        record = {
            **provenance(),
            "demo_and_report_s": seconds,
            "load_average_end": round(os.getloadavg()[0], 1),
            "methods": demo_numbers(report),
            "verdicts": demo_verdicts(report),
        }
        grid = run_grid(storage)
        execute_notebook(storage / DEMO_EXPERIMENT.name, storage / GRID_EXPERIMENT.name)
    (FIGURES / "demo.json").write_text(json.dumps(record, indent=2) + "\n")
    (FIGURES / "controller_grid.json").write_text(json.dumps(grid, indent=2) + "\n")
    print(json.dumps({**record, "controller_grid_s": grid["sweep_s"]}, indent=2))


def execute_notebook(experiment: Path, grid: Path) -> None:
    """Run analysis/notebooks/explore_experiment.ipynb top to bottom on the demo's experiment,
    with the controller grid's for its heatmaps (from its own folder, as Jupyter starts it),
    and store it with its outputs, so that it opens with its tables and figures shown."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    os.environ["RELIF_EXPERIMENT"] = str(experiment)
    os.environ["RELIF_CONTROLLER_GRID"] = str(grid)
    for name in ("RELIF_DELTA", "RELIF_SPLIT", "RELIF_ATTRIBUTES"):
        os.environ.pop(name, None)
    client = NotebookClient(
        notebook, kernel_name="python3", timeout=600,
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )  # fmt: skip
    client.execute()
    shown = {experiment: DEMO_EXPERIMENT, grid: GRID_EXPERIMENT}
    nbformat.write(shown_as_in_the_repository(notebook, shown), NOTEBOOK)


def shown_as_in_the_repository(notebook, shown: dict[Path, Path]):
    """`notebook` with each experiment (a key of `shown`) shown where its sweep writes it when
    run in the repository (its value: `relif-results/nyuv2-demo`, ...), not at this run's
    temporary folder: the stored outputs name no folder that is gone once they are written."""
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            texts = {"text": output} if "text" in output else {}
            texts.update({key: output["data"] for key in output.get("data", {})
                          if key.startswith("text/")})  # fmt: skip
            for key, holder in texts.items():
                value = holder[key]
                joined = "".join(value) if isinstance(value, list) else value
                for experiment, where in shown.items():
                    joined = joined.replace(str(experiment), str(where))
                holder[key] = joined
    return notebook


def version(package: str) -> str:
    from importlib.metadata import version as installed

    return installed(package)


if __name__ == "__main__":
    main()
