"""The README's two figures and claim, and the analysis notebook's outputs, made from the demo.
Regenerate them with

    python docs/figures/make_figures.py

It runs the Quickstart's demo (`sweeps/nyuv2.py --demo`: a real Ray Tune sweep of ERM and ReLiF,
2 seeds of 240 steps, on synthetic NYUv2) and `relif report` in a temporary folder, copies the
report's Pareto figure and ReLiF's controller figure here (pareto.png, controller.png),
executes the analysis notebook on the demo's experiment and stores it with its outputs (so that
it opens with its figures shown), and writes demo.json: the machine, the commit, the date, the
seconds the demo and its report took, and the numbers the README quotes: per method the mean
over seeds of Bias@delta_p75 and Worst, and per compared method the report's verdicts over
seeds against same-seed ERM of Bias@delta_p75 and Worst (its tables/paired.csv rows, with the
per-seed values).
tests/test_readme.py holds the README's caption and its sentence on the demo to demo.json. The
demo takes minutes on 2 cores (docs/benchmarks.md); another CPU gives other numbers, as another
seed would.
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

REPO = Path(__file__).resolve().parents[2]
FIGURES = Path(__file__).resolve().parent
NOTEBOOK = REPO / "analysis" / "notebooks" / "explore_experiment.ipynb"
SHOWN = {"pareto.png": "pareto.png", "controller.png": "controller_relif.png"}
"""README figure -> the report's figure it copies."""


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
            "commit": commit(),
            "machine": machine(),
            "date": datetime.date.today().isoformat(),
            "software": f"Python {platform.python_version()}, torch {version('torch')}, "
            f"Ray {version('ray')}",
            "demo_and_report_s": seconds,
            "load_average_end": round(os.getloadavg()[0], 1),
            "methods": demo_numbers(report),
            "verdicts": demo_verdicts(report),
        }
        execute_notebook(storage / "nyuv2-demo")
    (FIGURES / "demo.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


def execute_notebook(experiment: Path) -> None:
    """Run analysis/notebooks/explore_experiment.ipynb top to bottom on the demo's experiment
    (from its own folder, as Jupyter starts it) and store it with its outputs, so that it
    opens with its tables and figures shown."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    os.environ["RELIF_EXPERIMENT"] = str(experiment)
    for name in ("RELIF_DELTA", "RELIF_SPLIT", "RELIF_ATTRIBUTES"):
        os.environ.pop(name, None)
    client = NotebookClient(
        notebook, kernel_name="python3", timeout=600,
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )  # fmt: skip
    client.execute()
    nbformat.write(shown_as_in_the_repository(notebook, experiment), NOTEBOOK)


def shown_as_in_the_repository(notebook, experiment: Path):
    """`notebook` with the demo's experiment shown where the demo writes it when run in the
    repository (`relif-results/nyuv2-demo`), not at this run's temporary folder: the stored
    outputs name no folder that is gone once they are written."""
    from relif_ray.testing.synthetic_experiment import DEMO_EXPERIMENT

    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            texts = {"text": output} if "text" in output else {}
            texts.update({key: output["data"] for key in output.get("data", {})
                          if key.startswith("text/")})  # fmt: skip
            for key, holder in texts.items():
                value = holder[key]
                joined = "".join(value) if isinstance(value, list) else value
                holder[key] = joined.replace(str(experiment), str(DEMO_EXPERIMENT))
    return notebook


def version(package: str) -> str:
    from importlib.metadata import version as installed

    return installed(package)


if __name__ == "__main__":
    main()
