"""Fidelity: does ReLiF cut the fixed-delta Bias of a multi-task model at equal utility, and
does the cut survive wider audit interfaces? A science experiment beside the sweeps
(`sweeps/fidelity.py`), with targets and the report's verdicts over seeds.

    python sweeps/fidelity.py              # the decisive table (erm and `DECISIVE`)
    python sweeps/fidelity.py --more       # + a second table of the other ReLiF labels
    python sweeps/fidelity.py --json       # the same rows as JSON, with the machine
    python sweeps/fidelity.py --out DIR    # keep the data, experiment, report and rows in DIR
    python sweeps/fidelity.py --quick      # a smoke run: tiny data, 1 seed, 2 steps

Everything goes through the real code:
synthetic NYUv2 at the NYUv2 demo's image size from `relif make-data`'s writer, one
`sweeps/nyuv2.py` sweep (ERM; `relif`, the paper's squash with its clip gradient; `relif-st`,
the straight-through squash gradient; our variants `relif-logistic` and `relif-clipshare`;
resnet18, batch 8, Adam 1e-3 as the demo; 400 steps per trial, the controller scaled to them
by `scale_to_budget`), then `relif report`, whose `per_trial.csv` and `interface_per_trial.csv`
give every figure. Each ReLiF label is compared with the same-seed ERM trial, per seed and as
the mean over seeds:

- Bias@delta_p75 ratio (label / ERM) under the audit interfaces (a) q10-q90 (the paper's
  squash), (b) q1-q99 and (c) ecdf, the same-seed ERM empirical CDF
  (`relif_ray.squash.AUDIT_INTERFACES`; the report's Audit-interface sensitivity table);
- clipped shares: the label's share of depth and normal audit scores clipped at 0 and at 1
  by (a), each against ERM's (about 0.1 by construction); the row's value is the largest of
  the four mean shares minus ERM's mean share (per seed: the largest difference that seed);
- VR@delta_p75 ratio; Worst and Macro differences (label - ERM);
- the share of the label's training steps with lambda at one of its bounds (lambda_min,
  lambda_max; from the trials' traces): a controller pinned at a bound for most of a run is
  not controlling.

Each row's detail ends with the report's verdict over seeds (`relif_ray.analysis.paired`: the
Student-t interval over seeds of the paired log ratio, or of the difference with the equivalence
test of Worst and Macro within ±0.02): the targets judge the mean, the verdict what the seeds show.

Targets on the mean over seeds (`TARGETS`; never loosened): relif-st <= 0.35x ERM's Bias
under (a) and under (c), clipped shares <= ERM's + 0.05, Worst >= ERM's - 0.02; relif <= 0.5x
under (a), Worst and Macro >= ERM's - 0.02. Every other row is information, and so is every
row of a run at another size than the targets were set for (`--no-targets`: the GPU check runs
the same experiment at the paper's NYUv2 size with `--data-dir`, `--backbone resnet50` and the
sweep's GPU flags after `--`).
Our variants are judged over seeds by `relif_ray.cli.fidelity_goal` (a row "goal LABEL" each).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from relif_ray.analysis.interfaces import interface_name
from relif_ray.cli import fidelity_goal
from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2
from relif_ray.problems.nyuv2 import DEFAULTS as NYUV2
from relif_ray.relif.controller import scale_to_budget
from relif_ray.squash import AUDIT_INTERFACES

REFERENCE = "erm"
STRAIGHT_THROUGH = "relif-st"
"""ReLiF with the straight-through squash gradient (`relif_ray.sweep.labels.RELIF_LABELS`)."""
DECISIVE = ("relif", STRAIGHT_THROUGH, *fidelity_goal.GOAL_LABELS)
"""The decisive table: the paper's ReLiF, the straight-through squash gradient, our variants."""
MORE = ("relif-running", "relif-noalign", "relif-static", "relif-nolip", "pcgrad+relif",
        f"pcgrad+{STRAIGHT_THROUGH}")  # fmt: skip
"""The second table (`--more`): the running squash, the three ablations and two hybrids."""
TARGETS: dict[tuple[str, str], tuple[str, float]] = {
    ("relif", "bias q10-q90"): ("<=", 0.5),
    ("relif", "worst"): (">=", -0.02),
    ("relif", "macro"): (">=", -0.02),
    (STRAIGHT_THROUGH, "bias q10-q90"): ("<=", 0.35),
    (STRAIGHT_THROUGH, "bias ecdf"): ("<=", 0.35),
    (STRAIGHT_THROUGH, "clipped shares"): ("<=", 0.05),
    (STRAIGHT_THROUGH, "worst"): (">=", -0.02),
}
"""(label, measure) -> (comparison, bound) on the mean over seeds."""
AUDITED_TASKS = ("depth", "normal")
"""The regression tasks whose scores the squash clips (NYUv2's segmentation score is bounded)."""


@dataclass
class Row:
    """One row of the fidelity table: a mean over seeds with its target and result (pass /
    FAIL / info) and the per-seed values; the benchmark harness's rows have the same fields."""

    group: str
    name: str
    value: float | None
    unit: str
    target: str
    result: str
    detail: str = ""
    per_seed: dict[int, float] | None = None


@dataclass(frozen=True)
class Size:
    """Data, model, budget and resources of one fidelity run; `judged`: whether its rows are
    judged by `TARGETS` (the CPU run's), or information only (another size)."""

    train: int
    val: int
    height: int
    width: int
    seeds: int
    steps: int
    labels: tuple[str, ...]
    report_flags: tuple[str, ...] = ("--no-figures",)
    backbone: str = "resnet18"
    lr: float = 1e-3
    sweep_flags: tuple[str, ...] = ("--num-cpus", "2")
    judged: bool = True


DEMO_IMAGE = (NYUV2.demo_data["height"], NYUV2.demo_data["width"])
FULL = Size(320, 128, *DEMO_IMAGE, seeds=5, steps=400, labels=DECISIVE)
"""5 seeds x 400 steps of erm and the decisive labels: 25 trials, two at a time on 2 cores, the
ReLiF trials after their seed's ERM trial. 320 training images make 10 epochs (a validation
audit and a checkpoint each); 128 validation images are the audit's pools. Wall time: see
docs/relif.md."""
QUICK = Size(16, 8, *DEMO_IMAGE, seeds=1, steps=2, labels=DECISIVE,
             report_flags=("--no-figures", "--n-boot", "0"),
             sweep_flags=("--num-cpus", "2", "--max-concurrent-trials", "1"))  # fmt: skip
"""The smoke run: one epoch of 2 steps per trial, no bootstrap intervals, one trial at a time
(Tune reuses one trial worker; a second would take longer to start, about 4.5 s of CPU for
Python, torch and Ray Tune, than the two-step trials it could take over)."""
BATCH_SIZE = 8
"""Batch 8 (resnet18, Adam lr 1e-3 by default: the NYUv2 demo's training settings)."""


def run_sweep(size: Size, workdir: Path, data: Path | None = None) -> Path:
    """Write the data (unless `data` holds it), run the sweep of `sweeps/nyuv2.py` in this
    process (`run_nyuv2_sweep`); the experiment directory."""
    if data is None:
        data = workdir / "data"
        write_synthetic_nyuv2(
            data, train=size.train, val=size.val, height=size.height, width=size.width, seed=0
        )
    eta, warmup = scale_to_budget(size.steps)
    run_nyuv2_sweep(
        [
            *("--data-dir", str(data), "--methods", ",".join((REFERENCE, *size.labels))),
            *("--seeds", str(size.seeds), "--steps", str(size.steps)),
            *("--backbone", size.backbone, "--batch-size", str(BATCH_SIZE)),
            *("--lr", f"{size.lr:g}", "--pretrained", "none"),
            *("--eta", f"{eta:g}", "--warmup-steps", str(warmup)),
            *("--storage", str(workdir / "results"), "--name", "fidelity", *size.sweep_flags),
        ]
    )
    return workdir / "results" / "fidelity"


def run_nyuv2_sweep(argv: list[str]) -> None:
    """`python sweeps/nyuv2.py ARGV`, in this process (the script's `main`: no second start of
    Python, torch and torchvision). On the Ray this process is connected to, if any; otherwise
    on a local Ray that it starts and stops again, so that every sweep gets the resources its
    flags ask for and nothing of Ray stays behind to load what runs next."""
    from relif_ray.cli.sweep import main as sweep
    from relif_ray.tuning import local_ray_for_this_block

    with (
        local_ray_for_this_block(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()) as err,
    ):
        status = sweep(argv, datasets=("nyuv2",))
    if status != 0:
        raise RuntimeError(f"sweeps/nyuv2.py {' '.join(argv)} failed: {err.getvalue()[-3000:]}")


def run_report(experiment: Path, out: Path, flags: tuple[str, ...]) -> Reports:
    """`relif report EXPERIMENT --out OUT`, in this process (the `relif` console script's
    `main`: no second start of Python, torch and torchvision); its per-trial numbers."""
    from relif_ray.cli.console import main as relif

    command = ["report", str(experiment), "--out", str(out), *flags]
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()) as err,
    ):
        status = relif(command)
    if status != 0:
        raise RuntimeError(f"relif {' '.join(command)} failed: {err.getvalue()[-3000:]}")
    tables = out / "tables"
    return Reports(
        pd.read_csv(out / "per_trial.csv"),
        pd.read_csv(out / "interface_per_trial.csv"),
        pd.read_csv(tables / "paired.csv", dtype={"delta": str}, keep_default_na=False),
        pd.read_csv(tables / "interfaces.csv"),
    )


@dataclass(frozen=True)
class Reports:
    """The report's per_trial.csv (paper's interface), interface_per_trial.csv, and its
    verdicts over seeds: tables/paired.csv and the cut over seeds of tables/interfaces.csv."""

    trials: pd.DataFrame
    interfaces: pd.DataFrame
    paired: pd.DataFrame
    cuts: pd.DataFrame

    def verdict(self, label: str, metric: str, delta: str = "") -> str:
        """paired.csv's verdict of one comparison, with its estimate and interval."""
        row = self.row(label, metric, delta)
        scale = "x" if metric in ("bias", "vr") else ""
        text = f"over seeds: {row['verdict']}, {float(row['estimate']):.3f}{scale}"
        if row["ci_low"]:  # empty with one seed
            text += f" [{float(row['ci_low']):.3f}, {float(row['ci_high']):.3f}]"
        return text

    def row(self, label: str, metric: str, delta: str = "") -> pd.Series:
        """paired.csv's row of one comparison (`delta` empty for utility metrics)."""
        paired = self.paired
        chosen = (paired["label"] == label) & (paired["metric"] == metric)
        return paired[chosen & (paired["delta"] == delta)].iloc[0]

    def cut(self, label: str, interface: str) -> str:
        """interfaces.csv's cut over seeds of one label under one interface."""
        cuts = self.cuts
        chosen = cuts[(cuts["method"] == label) & (cuts["interface"] == interface_name(interface))]
        return f"over seeds: {chosen['cut'].iloc[0]}"


def per_seed(trials: pd.DataFrame, label: str, column: str) -> dict[int, float]:
    """Seed -> the `column` value of that seed's `label` trial."""
    rows = trials[trials["label"] == label].set_index("seed")[column]
    if not rows.index.is_unique:
        raise ValueError(f"per_trial.csv: more than one '{label}' trial for a seed")
    return {int(seed): float(value) for seed, value in rows.items()}


def compare(trials: pd.DataFrame, label: str, column: str, ratio: bool) -> dict[int, float]:
    """Seed -> label / ERM (`ratio`) or label - ERM of `column`, over seeds both ran."""
    variant, reference = per_seed(trials, label, column), per_seed(trials, REFERENCE, column)
    seeds = sorted(set(variant) & set(reference))
    if ratio:
        return {s: variant[s] / reference[s] for s in seeds}
    return {s: variant[s] - reference[s] for s in seeds}


def interface_ratios(interfaces: pd.DataFrame, label: str, interface: str) -> dict[int, float]:
    """Seed -> Bias / same-seed ERM Bias under `interface` (interface_per_trial.csv)."""
    return per_seed(interfaces[interfaces["interface"] == interface], label, "ratio")


def clip_columns() -> list[str]:
    return [f"clip{side}_{task}" for side in (0, 1) for task in AUDITED_TASKS]


def clipped_excess(trials: pd.DataFrame, label: str) -> tuple[float, dict[int, float], str]:
    """The largest mean share minus ERM's mean share (over seeds, of the four clip shares),
    the per-seed largest difference, and every mean share beside ERM's."""
    differences = {key: compare(trials, label, key, ratio=False) for key in clip_columns()}
    seeds = sorted(next(iter(differences.values())))
    by_seed = {s: max(values[s] for values in differences.values()) for s in seeds}
    excess = max(statistics.mean(values.values()) for values in differences.values())
    shares = "; ".join(
        f"{key} {statistics.mean(per_seed(trials, label, key).values()):.2f} "
        f"(ERM {statistics.mean(per_seed(trials, REFERENCE, key).values()):.2f})"
        for key in clip_columns()
    )
    return excess, by_seed, shares


def seeds_text(values: dict[int, float]) -> str:
    return ", ".join(f"seed {seed} {value:.3f}" for seed, value in values.items())


def seed_row(
    label: str,
    measure: str,
    name: str,
    values: dict[int, float],
    unit: str,
    over_seeds: str = "",
    judge: bool = True,
) -> Row:
    """A row of the mean over seeds of `values`, judged (`judge`) where `TARGETS` has (label,
    measure); its detail: the per-seed values, then `over_seeds` (the verdict over seeds)."""
    mean = statistics.mean(values.values())
    detail = "; ".join(part for part in (seeds_text(values), over_seeds) if part)
    return target_row(label, measure, name, mean, unit, detail, values, judge)


def target_row(
    label: str,
    measure: str,
    name: str,
    value: float,
    unit: str,
    detail: str,
    values: dict[int, float],
    judge: bool,
) -> Row:
    target = TARGETS.get((label, measure)) if judge else None
    if target is None:
        return Row("", name, value, unit, "-", "info", detail, values)
    comparison, bound = target
    passed = value <= bound if comparison == "<=" else value >= bound
    result = "pass" if passed else "FAIL"
    return Row("", name, value, unit, f"{comparison} {bound:g}", result, detail, values)


def lambda_at_bounds(experiment: object, label: str) -> dict[int, float]:
    """Seed -> the share of the `label` trial's training steps with lambda at lambda_min or
    lambda_max of its ReLiF config (`analysis.Experiment` `experiment`)."""
    trials = experiment.trials[experiment.trials["label"] == label]
    shares = {}
    for trial in trials.itertuples():
        relif = trial.config["relif"]
        lam = experiment.trace(trial.trial)["lambda"]
        bound = (lam <= relif["lambda_min"] * (1 + 1e-6)) | (
            lam >= relif["lambda_max"] * (1 - 1e-6)
        )
        shares[int(trial.seed)] = float(bound.mean())
    return shares


def label_rows(reports: Reports, label: str, experiment: object, judge: bool) -> list[Row]:
    """The Bias (three interfaces), clipping, VR, Worst and Macro rows of one label and the
    share of its steps with lambda at a bound (`experiment`: the loaded `analysis.Experiment`);
    group "fidelity" (the decisive labels) or "fidelity-more"."""
    trials = reports.trials
    rows = [
        seed_row(
            label,
            f"bias {interface}",
            f"Bias@delta_p75 {label} / ERM {interface_name(interface)}",
            interface_ratios(reports.interfaces, label, interface),
            "x",
            reports.cut(label, interface),
            judge,
        )
        for interface in AUDIT_INTERFACES
    ]
    excess, by_seed, shares = clipped_excess(trials, label)
    name = f"clipped shares {label} - ERM (largest)"
    rows.append(target_row(label, "clipped shares", name, excess, "", shares, by_seed, judge))
    vr, verdict = compare(trials, label, "vr_p75", ratio=True), reports.verdict(label, "vr", "p75")
    rows.append(seed_row(label, "vr", f"VR@delta_p75 {label} / ERM", vr, "x", verdict, judge))
    for metric in ("worst", "macro"):
        difference = compare(trials, label, metric, ratio=False)
        name = f"{metric.capitalize()} {label} - ERM"
        rows.append(
            seed_row(label, metric, name, difference, "", reports.verdict(label, metric), judge)
        )
    shares = lambda_at_bounds(experiment, label)
    name = f"share of {label} steps with lambda at a bound"
    rows.append(seed_row(label, "lambda at a bound", name, shares, "", "", judge))
    if judge and label in fidelity_goal.GOAL_LABELS:
        rows.append(goal_row(reports, label, excess))
    for row in rows:
        row.group = "fidelity" if label in DECISIVE else "fidelity-more"
    return rows


def goal_row(reports: Reports, label: str, clipped: float) -> Row:
    """The goal of `fidelity_goal` on one of our variants over seeds; its value: the largest
    upper bound of its Bias intervals over the three interfaces (x ERM's)."""
    ratios = {interface_name(name): interface_ratios(reports.interfaces, label, name)
              for name in AUDIT_INTERFACES}  # fmt: skip
    verdicts = {metric: str(reports.row(label, metric)["verdict"]) for metric in ("worst", "macro")}
    judged = fidelity_goal.judge(ratios, verdicts, clipped)
    result, goal = ("pass" if judged.met else "FAIL"), fidelity_goal.GOAL.text()
    return Row("", f"goal {label}", judged.largest_upper, "x", goal, result, judged.detail)


def fidelity_rows(size: Size, workdir: Path, data: Path | None = None) -> list[Row]:
    """Sweep, report, and every label's rows against the same-seed ERM trial."""
    from relif_ray import analysis

    experiment = run_sweep(size, workdir, data)
    reports = run_report(experiment, workdir / "report", size.report_flags)
    eta, warmup = scale_to_budget(size.steps)
    setting = (
        f"synthetic NYUv2 {size.train} train / {size.val} val at {size.height}x{size.width}, "
        f"{size.backbone}, batch {BATCH_SIZE}, Adam {size.lr:g}, {size.steps} steps, eta "
        f"{eta:g}, warmup {warmup}, {size.seeds} seed(s)"
    )
    rows = [Row("fidelity", "setting", None, "", "-", "info", setting)]
    loaded = analysis.load(experiment)
    for label in size.labels:
        rows += label_rows(reports, label, loaded, size.judged)
    return rows


def build_parser() -> argparse.ArgumentParser:
    description = "ReLiF's fixed-delta Bias against same-seed ERM, through the sweep and report."
    parser = argparse.ArgumentParser(prog="sweeps/fidelity.py", description=description)
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny data, 1 seed")
    parser.add_argument("--more", action="store_true", help="also the other ReLiF labels")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--out", type=Path, help="keep data, report and fidelity.json here")
    parser.add_argument("--steps", type=int, help=f"steps per trial (default: {FULL.steps})")
    parser.add_argument("--seeds", type=int, help=f"seeds (default: {FULL.seeds}; --quick: 1)")
    parser.add_argument("--data-dir", type=Path, help="NYUv2 data to use (default: written anew)")
    parser.add_argument("--backbone", help=f"default {FULL.backbone}")
    parser.add_argument("--lr", type=float, help=f"default {FULL.lr:g}")
    parser.add_argument("--n-boot", type=int, help="bootstrap resamples of the report (0: none)")
    parser.add_argument("--no-targets", action="store_true", help="rows without targets")
    flags = "after --: flags of sweeps/nyuv2.py instead of --num-cpus 2"
    parser.add_argument("sweep_flags", nargs=argparse.REMAINDER, help=flags)
    return parser


def chosen_size(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Size:
    """The size the flags ask for: --quick's or the full one, with what the flags change."""
    size = QUICK if args.quick else FULL
    for name in ("steps", "seeds"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name} must be positive, got {value}")
    changes = {key: getattr(args, key) for key in ("steps", "seeds", "backbone", "lr")}
    changes = {key: value for key, value in changes.items() if value is not None}
    if args.more:
        changes["labels"] = (*DECISIVE, *MORE)
    if args.data_dir is not None:
        images = {split: sorted((args.data_dir / split / "image").glob("*.npy"))
                  for split in ("train", "val")}  # fmt: skip
        changes.update({split: len(files) for split, files in images.items()})
        shape = np.load(images["train"][0], mmap_mode="r").shape
        changes.update(height=shape[0], width=shape[1])
    if args.n_boot is not None:
        changes["report_flags"] = ("--no-figures", "--n-boot", str(args.n_boot))
    if [flag for flag in args.sweep_flags if flag != "--"]:
        changes["sweep_flags"] = tuple(flag for flag in args.sweep_flags if flag != "--")
    return dataclasses.replace(size, **changes, judged=not args.no_targets)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    size = chosen_size(args, parser)
    if args.out is not None and args.out.exists() and any(args.out.iterdir()):
        parser.error(f"--out {args.out}: must be a new or empty folder")
    info = machine()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rows = fidelity_rows(size, args.out or Path(tmp), args.data_dir)
    info["wall_s"] = round(time.perf_counter() - start)
    info["load_average_end"] = os.getloadavg()[0]
    payload = {"machine": info, "quick": args.quick, "rows": [dataclasses.asdict(r) for r in rows]}
    if args.out is not None:
        (args.out / "fidelity.json").write_text(json.dumps(payload, indent=2) + "\n")
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        print_tables(rows, info)
    return 1 if any(row.result == "FAIL" for row in rows) else 0


def print_tables(rows: list[Row], info: dict[str, object]) -> None:
    """The decisive table, then (with --more) the other labels' table, then the wall time."""
    print(f"{info['cpu']}, {info['cores']} cores, load {info['load_average']:.1f}")
    more = [row for row in rows if row.group == "fidelity-more"]
    for row in [row for row in rows if row.group == "fidelity"] + more:
        if more and row is more[0]:
            print("\nThe other ReLiF labels at the same steps (information):")
        value = "-" if row.value is None else f"{row.value:.3f}{row.unit}"
        print(f"{row.name:<50}  {value:>10}  {row.target:<10}  {row.result:<6}  {row.detail}")
    print(f"\nwall time {info['wall_s']} s; load average at the end {info['load_average_end']:.1f}")


def machine() -> dict[str, object]:
    """Where the rows come from: the machine, the software and the code's commit."""
    import torch

    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return {"cpu": names[0] if names else platform.machine(), "cores": os.cpu_count(),
            "load_average": os.getloadavg()[0], "gpu": None, "torch": torch.__version__,
            "python": platform.python_version(), "torch_threads": torch.get_num_threads(),
            "commit": source_commit()}  # fmt: skip


def source_commit() -> str:
    """The short commit of the checkout this code runs from, with "+" where a tracked file
    differs from it (as benchmarks/harness.py marks its records); "not recorded" outside a git
    checkout (an installed wheel)."""
    git = ["git", "-C", str(Path(__file__).resolve().parent)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return "not recorded"
    changed = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    return head.stdout.strip() + ("+" if changed.stdout.strip() else "")
