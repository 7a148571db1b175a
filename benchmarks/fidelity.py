"""Fidelity: does ReLiF cut the fixed-delta Bias of a multi-task model at equal utility, and
does the cut survive wider audit interfaces? A science experiment beside the performance
suites, with targets and the report's verdicts over seeds.

    python -m benchmarks.fidelity              # the decisive table (erm and `DECISIVE`)
    python -m benchmarks.fidelity --more       # + a second table of the other ReLiF labels
    python -m benchmarks.fidelity --json       # the record as JSON: the machine, the rows
    python -m benchmarks.fidelity --out DIR    # keep data, experiment, report and record
    python -m benchmarks.fidelity --quick      # a smoke run: tiny data, 1 seed, 2 steps

Everything goes through the real code: synthetic NYUv2 at the NYUv2 demo's image size from
`relif make-data`'s writer, then the real commands, each in a process of its own: one
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

Targets on the mean over seeds (`benchmarks.targets.FIDELITY_TARGETS`; never loosened):
relif-st <= 0.35x ERM's Bias under (a) and under (c), clipped shares <= ERM's + 0.05, Worst >=
ERM's - 0.02; relif <= 0.5x under (a), Worst and Macro >= ERM's - 0.02. Every other row is
information, and so is every row of a run at another size than the targets were set for
(`--no-targets`: the GPU check's `fidelity` suite, `real_size.py`, runs the same experiment at
the paper's NYUv2 size with `--data-dir`, `--backbone resnet50` and the sweep's GPU flags after
`--`). Our variants are judged over seeds by `benchmarks.fidelity_goal` (a row "goal LABEL"
each). The record is the harness's (`harness.Record`: the command, the machine with the
checkout's commit, the wall time, the rows as `harness.Row`s): printed with `--json`, written
as DIR/fidelity.json and fidelity.md with `--out DIR`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from benchmarks import fidelity_goal
from benchmarks.harness import REPO, Record, Row, caption, verdict
from benchmarks.targets import FIDELITY_TARGETS
from relif_ray.analysis.interfaces import interface_name
from relif_ray.analysis.render import bound_text
from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2
from relif_ray.errors import last_line
from relif_ray.problems.nyuv2 import DEFAULTS as NYUV2
from relif_ray.relif.controller import scale_to_budget
from relif_ray.squash import AUDIT_INTERFACES

PROG = "python -m benchmarks.fidelity"
EXIT_USER_ERROR = 2
"""The exit status of a mistake in the flags, ours (argparse's) or the sweep's."""
TITLE = "ReLiF's labels against same-seed ERM"
REFERENCE = "erm"
STRAIGHT_THROUGH = "relif-st"
"""ReLiF with the straight-through squash gradient (`relif_ray.sweep.labels.RELIF_LABELS`)."""
DECISIVE = ("relif", STRAIGHT_THROUGH, *fidelity_goal.GOAL_LABELS)
"""The decisive table: the paper's ReLiF, the straight-through squash gradient, our variants."""
MORE = ("relif-running", "relif-noalign", "relif-static", "relif-nolip", "pcgrad+relif",
        f"pcgrad+{STRAIGHT_THROUGH}")  # fmt: skip
"""The second table (`--more`): the running squash, the three ablations and two hybrids."""
AUDITED_TASKS = ("depth", "normal")
"""The regression tasks whose scores the squash clips (NYUv2's segmentation score is bounded)."""


@dataclass(frozen=True)
class Size:
    """Data, model, budget and resources of one fidelity run; `judged`: whether its rows are
    judged by `FIDELITY_TARGETS` (the CPU run's), or information only (another size)."""

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
    """Write the data (unless `data` holds it) and run the sweep with `sweeps/nyuv2.py`; the
    experiment directory. On the local Ray the sweep starts and stops (or the cluster that an
    `--address` among the sweep flags names), so that it gets the resources its flags ask for
    and nothing of Ray stays behind to load what runs next."""
    if data is None:
        data = workdir / "data"
        write_synthetic_nyuv2(
            data, train=size.train, val=size.val, height=size.height, width=size.width, seed=0
        )
    eta, warmup = scale_to_budget(size.steps)
    run_command(
        [
            "sweeps/nyuv2.py",
            *("--data-dir", str(data), "--methods", ",".join((REFERENCE, *size.labels))),
            *("--seeds", str(size.seeds), "--steps", str(size.steps)),
            *("--backbone", size.backbone, "--batch-size", str(BATCH_SIZE)),
            *("--lr", f"{size.lr:g}", "--pretrained", "none"),
            *("--eta", f"{eta:g}", "--warmup-steps", str(warmup)),
            *("--storage", str(workdir / "results"), "--name", "fidelity", *size.sweep_flags),
        ],
        workdir / "sweep.log",
    )
    return workdir / "results" / "fidelity"


class CommandFailed(RuntimeError):
    """One of the experiment's commands (the sweep, the report) exited non-zero."""

    def __init__(self, command: list[str], status: int, output: str) -> None:
        shown = " ".join(["python", *command[:3]]) + (" ..." if len(command) > 3 else "")
        super().__init__(f"{shown} exited {status}: {last_line(output)}")
        self.status, self.output = status, output[-3000:]


def run_command(command: list[str], log: Path) -> None:
    """`python COMMAND` in the repository root, its output in `log`; `CommandFailed` with its
    exit status and its output's last line (a one-line error, or an exception) if it fails."""
    with log.open("w") as out:
        status = subprocess.run(
            [sys.executable, *command], cwd=REPO, stdout=out, stderr=subprocess.STDOUT
        ).returncode
    if status != 0:
        raise CommandFailed(command, status, log.read_text())


def run_report(experiment: Path, out: Path, flags: tuple[str, ...]) -> Reports:
    """`relif report EXPERIMENT --out OUT FLAGS`; its per-trial numbers and verdicts."""
    command = ["-m", "relif_ray.cli", "report", str(experiment), "--out", str(out), *flags]
    run_command(command, out.parent / "report.log")
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
            null = 1.0 if scale else 0.0  # the interval is printed on the verdict's side of it
            low, high = (bound_text(float(row[end]), null, 3) for end in ("ci_low", "ci_high"))
            text += f" [{low}, {high}]"
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
    name: str, values: dict[int, float], unit: str, over_seeds: str = "", judge: bool = True
) -> Row:
    """A row of the mean over seeds of `values` (`target_row`); its detail: the per-seed
    values, then `over_seeds` (the verdict over seeds)."""
    mean = statistics.mean(values.values())
    detail = "; ".join(part for part in (seeds_text(values), over_seeds) if part)
    return target_row(name, mean, unit, detail, values, judge)


def target_row(
    name: str, value: float, unit: str, detail: str, values: dict[int, float], judge: bool
) -> Row:
    """A row judged (`judge`) by its target in `FIDELITY_TARGETS` (pass or FAIL), where it has
    one; else information."""
    target = FIDELITY_TARGETS.get(name) if judge else None
    if target is None:
        return Row(name, value, unit, detail=detail, per_seed=values)
    return Row(name, value, unit, target.text, target.judge(value), detail, per_seed=values)


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
    rows.append(target_row(name, excess, "", shares, by_seed, judge))
    vr = compare(trials, label, "vr_p75", ratio=True)
    over_seeds = reports.verdict(label, "vr", "p75")
    rows.append(seed_row(f"VR@delta_p75 {label} / ERM", vr, "x", over_seeds, judge))
    for metric in ("worst", "macro"):
        difference = compare(trials, label, metric, ratio=False)
        name = f"{metric.capitalize()} {label} - ERM"
        rows.append(seed_row(name, difference, "", reports.verdict(label, metric), judge))
    shares = lambda_at_bounds(experiment, label)
    rows.append(seed_row(f"share of {label} steps with lambda at a bound", shares, "", "", judge))
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
    goal = fidelity_goal.GOAL.text()
    return Row(f"goal {label}", judged.largest_upper, "x", goal, verdict(judged.met), judged.detail)


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
    rows = [Row("setting", None, detail=setting, group="fidelity")]
    loaded = analysis.load(experiment)
    for label in size.labels:
        rows += label_rows(reports, label, loaded, size.judged)
    return rows


def build_parser() -> argparse.ArgumentParser:
    description = "ReLiF's fixed-delta Bias against same-seed ERM, through the sweep and report."
    parser = argparse.ArgumentParser(prog=PROG, description=description)
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny data, 1 seed")
    parser.add_argument("--more", action="store_true", help="also the other ReLiF labels")
    parser.add_argument("--json", action="store_true", help="print the record as JSON")
    parser.add_argument("--out", type=Path, help="keep data, report and fidelity.json/.md here")
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
        if not images["train"]:
            parser.error(f"--data-dir {args.data_dir}: no train/image/*.npy (relif make-data)")
        changes.update({split: len(files) for split, files in images.items()})
        shape = np.load(images["train"][0], mmap_mode="r").shape
        changes.update(height=shape[0], width=shape[1])
    if args.n_boot is not None:
        changes["report_flags"] = ("--no-figures", "--n-boot", str(args.n_boot))
    if [flag for flag in args.sweep_flags if flag != "--"]:
        changes["sweep_flags"] = tuple(flag for flag in args.sweep_flags if flag != "--")
    return dataclasses.replace(size, **changes, judged=not args.no_targets)


def main(argv: list[str] | None = None) -> int:
    """Run the experiment; exit 1 where a target or a goal is missed or a command failed, 2 on
    a flag's mistake (also one the sweep finds in the flags after `--`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    size = chosen_size(args, parser)
    if args.out is not None and args.out.exists() and any(args.out.iterdir()):
        parser.error(f"--out {args.out}: must be a new or empty folder")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    command = f"{PROG} {' '.join(argv)}".strip()
    kind = "quick" if args.quick else "full"
    record = Record(command, kind, device, args.out, name="fidelity")
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows = fidelity_rows(size, args.out or Path(tmp), args.data_dir)
    except CommandFailed as failure:
        record.add("fidelity", TITLE, f"FAIL: {failure}", time.perf_counter() - start, [])
        record.finish()
        user_mistake = failure.status == EXIT_USER_ERROR  # its one line says it all
        shown = "" if user_mistake else failure.output.rstrip("\n") + "\n"  # its output's end
        print(f"{shown}{PROG}: error: {failure}", file=sys.stderr)
        return EXIT_USER_ERROR if user_mistake else 1
    seconds = time.perf_counter() - start
    record.add("fidelity", TITLE, "done", seconds, [dataclasses.asdict(row) for row in rows])
    record.finish()
    if args.json:
        print(json.dumps(record.payload, indent=1))
    else:
        print_tables(rows, record.payload)
    return 1 if any(row.result == "FAIL" for row in rows) else 0


def print_tables(rows: list[Row], payload: dict) -> None:
    """The record's caption, the decisive table, then (with --more) the other labels' table,
    then the wall time."""
    print(caption(payload))
    more = [row for row in rows if row.group == "fidelity-more"]
    for row in [row for row in rows if row.group == "fidelity"] + more:
        if more and row is more[0]:
            print("\nThe other ReLiF labels at the same steps (information):")
        value = "-" if row.value is None else f"{row.value:.3f}{row.unit}"
        print(f"{row.name:<50}  {value:>10}  {row.target:<10}  {row.result:<6}  {row.detail}")
    seconds, end = payload["sections"][0]["seconds"], payload["machine"]["load_average_end"]
    print(f"\nwall time {seconds:.0f} s; load average at the end {end:.1f}")


if __name__ == "__main__":
    sys.exit(main())
