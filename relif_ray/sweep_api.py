"""Sweeps from Python: `run_sweep(SweepSpec(...))` launches (or resumes) a sweep and returns its
experiment directory and its trials, for a notebook or a script of one's own.

    from relif_ray.sweep_api import SweepSpec, run_sweep
    spec = SweepSpec(dataset="tabular", demo=True, methods=["erm", "relif"], seeds=2)
    result = run_sweep(spec)                                  # the sweep `relif sweep` runs
    result.experiment_dir, result.trials                      # its folder, one row per trial
    run_sweep(dataclasses.replace(spec, resume=True))         # continue it after a stop

Why the flags: a sweep's settings are checked, defaulted (many defaults are the data set's)
and planned by the command line (`relif_ray.cli.sweep`), and there is one such path.
`SweepSpec` is those settings typed: each field is the flag of the same name (`r_star` is
`--r-star`), and `run_sweep` gives the spec to that path as its flags (`SweepSpec.arguments`).
So a spec and the command of the same flags make the same sweep: the same checks before Ray
starts, the same trials, names and configs, the same experiment `<storage>/<name>` on disk,
and the same one-line `UserError` for a mistake (it names the flag: `--seeds: ...`).

Like the command, `run_sweep` raises `relif_ray.sweep.exit_status.TrialsErrored` when trials
errored and `SweepStopped` when a signal or the storage stopped the sweep (each names the
experiment directory, which `resume=True` continues). It prints nothing: the sweep's own
lines (the plan, the controller's budget) are log records of the `relif_ray` logger, which
`relif_ray.messages.show_messages` shows as the commands do; Ray Tune's progress table is
Tune's. Ray is imported only when a sweep runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import pandas as pd

from relif_ray import analysis
from relif_ray.cli import sweep as sweep_command
from relif_ray.cli import tabular as table_command

NEGATABLE = frozenset({"channels_last", "compile", "gpu_fast_path"})
"""Fields whose flag has a `--no-` form: False is given as `--no-<flag>`."""
REPEATED = frozenset({"set", "task", "group", "feature", "drop"})
"""Fields whose flag is given once per item (`--task a=x:binary --task b=y:regression`)."""

Numbers = str | Sequence[float]
"""A list flag's values: numbers, or the flag's own text (`"0.2,0.24"`)."""
Names = str | Sequence[str]
"""A list flag's names: names, or the flag's own text (`"erm,relif"`)."""


@dataclass(frozen=True)
class SweepSpec:
    """One sweep's settings: the flags of `relif sweep` (docs/sweeps.md; `relif sweep --help`
    lists each with its default), each under its flag's name with `_` for `-`.

    None (or False, or empty) leaves a flag out, so it takes its default, which is often the
    data set's (its seeds, epochs, batch size, r* and eta, live delta). A list flag takes a
    sequence (`methods=["erm", "relif"]`, `r_star=[0.2, 0.24]`) or the flag's own text;
    `seeds` is a count (`2`: seeds 0 and 1) or a sequence of seeds; `set` maps dotted config
    fields to values (`{"train.lr": 1e-3}`: `--set train.lr=0.001`; docs/config.md lists the
    fields). `dataset="tabular"` is the sweep of `sweeps/tabular.py`, whose table is named by
    the last group of fields (`data` and `task`, or `spec`, or `preset`; docs/tabular.md).
    """

    dataset: str = "nyuv2"
    # data and budget
    data_dir: str | None = None
    demo: bool = False
    seeds: int | Sequence[int] | None = None
    fused_seeds: int | None = None
    epochs: int | None = None
    steps: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    backbone: str | None = None
    warmup_steps: int | None = None
    delta: float | None = None
    # the grid (or, with controller_checks, the paper's controller checks)
    methods: Names | None = None
    architectures: Names | None = None
    r_star: Numbers | None = None
    eta: Numbers | None = None
    search: Literal["grid", "optuna"] | None = None
    num_samples: int | None = None
    r_star_range: Numbers | None = None
    eta_range: Numbers | None = None
    select_from: str | None = None
    select_worst_tolerance: float | None = None
    controller_checks: bool = False
    etas: Numbers | None = None
    eta_r_star: float | None = None
    r_stars: Numbers | None = None
    r_star_eta: float | None = None
    static_lambdas: Numbers | None = None
    label: str | None = None
    # config fields
    config: str | None = None
    set: Mapping[str, Any] = field(default_factory=dict)
    precision: Literal["fp32", "bf16"] | None = None
    channels_last: bool | None = None
    compile: bool | None = None
    gpu_fast_path: bool | None = None
    pretrained: str | None = None
    # resources, storage, recovery
    num_gpus: float | None = None
    gpus_per_trial: float | None = None
    cpus_per_trial: float | None = None
    num_cpus: int | None = None
    address: str | None = None
    storage: str | None = None
    name: str | None = None
    max_failures: int | None = None
    keep_checkpoints: int | None = None
    checkpoint_interval: float | None = None
    resume: bool = False
    resume_if_present: bool = False
    reference: str | None = None
    # Tune scheduling and logging
    scheduler: Literal["fifo", "asha"] | None = None
    scheduler_metric: str | None = None
    max_concurrent_trials: int | None = None
    callbacks: Names | None = None
    # the table (dataset "tabular")
    data: str | None = None
    task: Sequence[str] | None = None
    group: Sequence[str] | None = None
    feature: Sequence[str] | None = None
    drop: Sequence[str] | None = None
    fractions: Numbers | None = None
    data_seed: int | None = None
    spec: str | None = None
    preset: str | None = None

    def arguments(self) -> list[str]:
        """The command line's flags of this spec (the dataset's own flag only where the sweep
        offers a choice of data sets: a table sweep has one)."""
        words: list[str] = []
        for spec_field in fields(self):
            name, value = spec_field.name, getattr(self, spec_field.name)
            if name == "dataset" and (value,) == table_command.DATASETS:
                continue
            words += flag_words(name, value)
        return words


def flag_words(name: str, value: Any) -> list[str]:
    """The words that give the field `name` the value `value` on the command line; none for a
    value that leaves the flag out."""
    flag = f"--{name.replace('_', '-')}"
    if value is None or (value is False and name not in NEGATABLE):
        return []
    if isinstance(value, bool):
        return [flag if value else f"--no-{flag[2:]}"]
    if name == "set":
        return [word for key, item in value.items() for word in (flag, f"{key}={json.dumps(item)}")]
    if name in REPEATED:
        return [word for item in value for word in (flag, str(item))]
    if name == "seeds" and not isinstance(value, int | str):
        seeds = [str(seed) for seed in value]
        # a list of one seed keeps its comma: `--seeds 3` is a count, `--seeds 3,` seed 3
        return [flag, ",".join(seeds) + ("," if len(seeds) == 1 else "")]
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [flag, ",".join(map(flag_text, value))]
    return [flag, flag_text(value)]


def flag_text(value: Any) -> str:
    """A value as a flag takes it; a float keeps every digit (`repr`)."""
    return repr(value) if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class SweepResult:
    """A finished sweep: its experiment directory (a path or a URI) and the experiment read
    from it (`relif_ray.analysis.Experiment`: trials, epochs, traces)."""

    experiment_dir: str
    experiment: analysis.Experiment

    @property
    def trials(self) -> pd.DataFrame:
        """One row per finished trial (`relif_ray.analysis.Experiment.trials`)."""
        return self.experiment.trials


def run_sweep(spec: SweepSpec) -> SweepResult:
    """Launch the sweep of `spec` (or, with `resume` or `resume_if_present`, continue it) as
    the command of the same flags would, wait for it to end, and read its experiment
    (module docstring: what it raises and logs)."""
    table = (spec.dataset,) == table_command.DATASETS  # the sweep of `sweeps/tabular.py`
    experiment_dir = sweep_command.run(
        spec.arguments(),
        prog="run_sweep",
        datasets=table_command.DATASETS if table else None,
        controller_checks=None,
        source=table_command.SOURCE if table else None,
    )
    return SweepResult(experiment_dir, analysis.load(experiment_dir))


__all__ = ["SweepResult", "SweepSpec", "run_sweep"]
