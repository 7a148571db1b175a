"""The Ray Tune layer: a Trainable around the engine, Optuna studies, resource checks, launch.

This is the only module of the library that imports Ray. One trial = one `TrainingRun`; one
Tune iteration = one epoch followed by a validation pass and a live fixed-delta audit.
Checkpoints hold the engine state (model, optimiser, method, ReLiF controller, step, RNG), one
per epoch, the last `keep_checkpoints` kept; the final checkpoint also holds the trial's
outputs for val and test (see `relif_ray.outputs`), so the experiment directory in storage is
all that analysis needs. A trial's Tune config is described in `relif_ray.variants`.

Live validation Bias (`val_bias`, the progress table and the Optuna objective): the audit of
`relif_ray.audit.fixed_delta_audit` at the sweep's `delta` on the trial's own validation
scores. Scores that are not probabilities (NYUv2 depth/normal feature norms) are squashed with
clip((s - q10) / (q90 - q10 + 1e-6), 0, 1), q10/q90 taken from the SAME trial's validation
scores, because the paper's reference (the same-seed ERM validation run) may not exist yet.
It is a progress and search signal only: the official fixed-delta numbers are computed at
analysis time with same-seed ERM quantiles and the reference delta (analysis, issue 6).
"""

from __future__ import annotations

import math
import os
import pickle
import socket
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import ray
import torch
from ray import tune
from ray.tune.search import Searcher
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from relif_ray.audit import SQUASH_QUANTILES, AuditResult, fixed_delta_audit, squash
from relif_ray.engine import TrainingRun
from relif_ray.errors import UserError
from relif_ray.outputs import write_trial_outputs
from relif_ray.problems import worker_env
from relif_ray.variants import describe, experiment_config, variant

STATE_FILE = "state.pt"
EVAL_SPLITS = ("val", "test")
OBJECTIVES = {"val_bias": "min", "worst": "max"}
"""Optuna's objectives: live validation Bias (minimized) and validation Worst (maximized)."""

PROGRESS_PARAMETERS = {"seed": "seed"}
PROGRESS_METRICS = {
    "label": "method",
    "r_star": "r*",
    "eta": "eta",
    "train_step": "step",
    "worst": "Worst",
    "macro": "Macro",
    "val_bias": "val Bias",
}


class InjectedFault(RuntimeError):
    """Raised by the test-only `fault_injection_step` of a trial config."""


def live_validation_audit(
    scores: pd.DataFrame, probability_tasks: set[str], delta: float
) -> AuditResult | None:
    """Fixed-delta audit of one split's raw scores, self-squashed (see the module docstring).

    Rows that are invalid or not finite are dropped; None when fewer than two tasks remain.
    """
    frame = scores[scores["valid"].astype(bool)].copy()
    frame["score"] = frame["score"].astype(np.float64)
    frame = frame[np.isfinite(frame["score"])]
    for task, rows in frame.groupby("task"):
        values = rows["score"].to_numpy()
        if task not in probability_tasks:
            low, high = np.quantile(values, SQUASH_QUANTILES)
            values = squash(values, low, high)
        frame.loc[rows.index, "score"] = np.clip(values, 0.0, 1.0)
    if frame["task"].nunique() < 2:
        return None
    return fixed_delta_audit(frame, delta)


class ReLiFTrainable(tune.Trainable):
    """One trial: `step()` trains one epoch, validates and audits; checkpoints carry the engine
    state, and the final one the trial's outputs."""

    def setup(self, config: dict[str, Any]) -> None:
        cpus = self.trial_resources.required_resources.get("CPU", 1)
        torch.set_num_threads(max(1, int(cpus)))
        self.label = config["variant"]["label"]
        self.delta = float(config["delta"])
        self.fault_step = config.get("fault_injection_step")
        self.restored = False
        self.run = TrainingRun(experiment_config(config))
        self.probability_tasks = {task.name for task in self.run.tasks if task.score_is_probability}
        self.last_eval = None

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self.setup(new_config)
        return True

    def step(self) -> dict[str, Any]:
        self._inject_fault()
        self.run.train_epoch()
        self.last_eval = self.run.evaluate("val")
        audit = live_validation_audit(self.last_eval.scores, self.probability_tasks, self.delta)
        relif = self.run.config.relif
        controlled = relif.enabled and relif.controller == "adaptive"
        metrics = {f"val_{key}": value for key, value in self.last_eval.metrics.items()}
        return {
            **metrics,
            "label": self.label,
            "seed": self.run.config.seed,
            "r_star": relif.r_star if controlled else math.nan,
            "eta": relif.eta if controlled else math.nan,
            "worst": self.last_eval.metrics["worst"],
            "macro": self.last_eval.metrics["macro"],
            "val_bias": audit.bias if audit else math.nan,
            "val_vr": audit.vr if audit else math.nan,
            "epoch": self.run.epoch,
            "train_step": self.run.step,
            "done": self.run.finished,
        }

    def _inject_fault(self) -> None:
        """Train up to `fault_injection_step` and raise, unless this trial was restored from a
        checkpoint: the fault fires once, and the retry continues from the last checkpoint."""
        step = self.fault_step
        if step is None or self.restored:
            return
        end = min((self.run.epoch + 1) * self.run.steps_per_epoch, self.run.total_steps)
        if self.run.step <= step < end:
            self.run.train_steps(step - self.run.step)
            raise InjectedFault(f"fault injected at training step {step}")

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        torch.save(self.run.state_dict(), Path(checkpoint_dir) / STATE_FILE)
        if self.run.finished:
            self._write_outputs(Path(checkpoint_dir))

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        state = torch.load(Path(checkpoint_dir) / STATE_FILE, weights_only=True)
        self.run.load_state_dict(state)
        self.restored = True

    def _write_outputs(self, directory: Path) -> None:
        splits = {
            name: self.last_eval if name == "val" and self.last_eval else self.run.evaluate(name)
            for name in EVAL_SPLITS
            if name in self.run.problem.splits
        }
        config = self.run.config
        info = {
            "trial_id": self.trial_id,
            "label": self.label,
            "method": config.method.name,
            "relif": config.relif.enabled,
            "seed": config.seed,
            "steps": self.run.step,
            "status": "completed",
            "device": str(self.run.device),
            "restored_from_checkpoint": self.restored,
            "config": config.to_dict(),
        }
        write_trial_outputs(directory, info, splits, self.run.trace)


def param_space(
    base: dict[str, Any],
    variants: list[dict],
    seeds: list[int],
    delta: float,
    fault_injection_step: int | None = None,
) -> dict[str, Any]:
    """The grid: every variant crossed with every seed.

    fault_injection_step (tests only): every trial raises `InjectedFault` once when it reaches
    this training step, unless restored from a checkpoint; put it after the first epoch, or
    the retry has no checkpoint to restore and fails again.
    """
    space = {
        "variant": tune.grid_search(variants),
        "seed": tune.grid_search(seeds),
        "base": base,
        "delta": delta,
    }
    if fault_injection_step is not None:
        if not isinstance(fault_injection_step, int) or fault_injection_step < 0:
            raise UserError(
                "fault_injection_step: must be a non-negative integer, "
                f"got {fault_injection_step!r}"
            )
        space["fault_injection_step"] = fault_injection_step
    return space


@dataclass(frozen=True)
class OptunaPlan:
    """Multi-objective Optuna over (r*, eta): one study per ReLiF label and seed, each with
    `num_samples` trials; r* uniform and eta log-uniform in the given closed ranges."""

    labels: list[str]
    seeds: list[int]
    num_samples: int
    r_star_range: tuple[float, float]
    eta_range: tuple[float, float]

    def space(self, base: dict[str, Any], delta: float) -> dict[str, Any]:
        """The constant part of every trial's config; the studies suggest the rest."""
        return {"base": base, "delta": delta}


class StudyGroups(Searcher):
    """One OptunaSearch (one study) per (ReLiF label, seed), interleaved in one Tune run.

    Each study samples (r*, eta) with its own TPE sampler (seeded from the study name, so a
    sweep is reproducible) and learns only from its own trials. Suggestions go round-robin over
    the studies that still have budget, so all of them progress at the same pace.
    """

    def __init__(self, plan: OptunaPlan) -> None:
        from optuna.distributions import FloatDistribution
        from optuna.samplers import TPESampler
        from ray.tune.search.optuna import OptunaSearch

        metrics, modes = list(OBJECTIVES), list(OBJECTIVES.values())
        super().__init__(metric=metrics, mode=modes)
        space = {
            "r_star": FloatDistribution(*plan.r_star_range),
            "eta": FloatDistribution(*plan.eta_range, log=True),
        }
        self._studies = []
        for label in plan.labels:
            for seed in plan.seeds:
                name = f"{label}/seed{seed}"
                searcher = OptunaSearch(
                    space=dict(space),
                    metric=metrics,
                    mode=modes,
                    sampler=TPESampler(seed=zlib.crc32(name.encode())),
                    study_name=name,
                )
                self._studies.append(
                    {"name": name, "label": label, "seed": seed, "searcher": searcher}
                )
        self._remaining = {study["name"]: plan.num_samples for study in self._studies}
        self._trial_study: dict[str, dict] = {}
        self._turn = 0

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True

    def suggest(self, trial_id: str) -> dict | str | None:
        for offset in range(len(self._studies)):
            study = self._studies[(self._turn + offset) % len(self._studies)]
            if self._remaining[study["name"]] > 0:
                self._turn = (self._turn + offset + 1) % len(self._studies)
                self._remaining[study["name"]] -= 1
                self._trial_study[trial_id] = study
                params = study["searcher"].suggest(trial_id)
                return {
                    "study": study["name"],
                    "seed": study["seed"],
                    "variant": variant(study["label"], params["r_star"], params["eta"]),
                }
        return Searcher.FINISHED

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        study = self._trial_study.get(trial_id)
        if study is not None:
            study["searcher"].on_trial_complete(trial_id, result, error)

    def save(self, checkpoint_path: str) -> None:
        """Tune's experiment-state snapshot of the studies (written and read by this sweep)."""
        with open(checkpoint_path, "wb") as file:
            pickle.dump(self.__dict__, file)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as file:
            self.__dict__.update(pickle.load(file))


def pareto_front(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of each study that no other row of that study dominates (lower or equal
    val_bias and higher or equal val_worst, one of them strictly)."""
    keep = []
    for _, group in rows.groupby("study", sort=True):
        bias, worst = group["val_bias"].to_numpy(), group["val_worst"].to_numpy()
        for i, index in enumerate(group.index):
            no_worse = (bias <= bias[i]) & (worst >= worst[i])
            better = (bias < bias[i]) | (worst > worst[i])
            if not (no_worse & better).any():
                keep.append(index)
    return rows.loc[keep].sort_values(["study", "val_bias"]).reset_index(drop=True)


def write_pareto(experiment_dir: str, results: tune.ResultGrid) -> str | None:
    """`<experiment>/pareto.csv`: the Pareto set of every Optuna study of the sweep."""
    rows = []
    for result in results:
        study = (result.config or {}).get("study")
        metrics = result.metrics or {}
        if study is None or result.error is not None or "val_bias" not in metrics:
            continue
        rows.append(
            {
                "study": study,
                "label": metrics["label"],
                "seed": metrics["seed"],
                "trial_id": metrics["trial_id"],
                "r_star": metrics["r_star"],
                "eta": metrics["eta"],
                "val_bias": metrics["val_bias"],
                "val_worst": metrics["worst"],
                "val_macro": metrics["macro"],
            }
        )
    if not rows:
        return None
    table = pd.DataFrame(rows).dropna(subset=["val_bias", "val_worst"])
    path = f"{experiment_dir.rstrip('/')}/pareto.csv"
    _write_text(path, pareto_front(table).to_csv(index=False))
    return path


def _write_text(path: str, text: str) -> None:
    """Write a small text file to a local path or a storage URI (s3://, gs://, ...)."""
    if "://" not in path:
        Path(path).write_text(text)
        return
    import pyarrow.fs

    filesystem, inner = pyarrow.fs.FileSystem.from_uri(path)
    with filesystem.open_output_stream(inner) as stream:
        stream.write(text.encode())


@dataclass(frozen=True)
class Resources:
    """What the sweep may use and what each trial asks for.

    num_gpus: GPUs the sweep may use in total; with gpus_per_trial it caps concurrency at
        floor(num_gpus / gpus_per_trial) (8 and 0.5 -> 16 trials at once).
    num_cpus: CPUs of the local Ray instance (None = all); ignored with `address`.
    address: an existing Ray cluster ("auto" or "HEAD_IP:6379"); None starts local Ray, which
        detects the machine's real GPUs.
    """

    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    num_gpus: float = 0.0
    num_cpus: int | None = None
    address: str | None = None

    @property
    def max_concurrent_trials(self) -> int | None:
        if self.gpus_per_trial <= 0:
            return None
        return max(1, math.floor(self.num_gpus / self.gpus_per_trial + 1e-9))


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A `host:port` (or `ray://host:port`) address must accept a TCP connection: Ray itself
    retries an unreachable address for minutes."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and other forms: ray.init reports those itself, and quickly
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UserError(f"--address {address}: no Ray cluster answers there ({reason})") from None


def connect(resources: Resources) -> None:
    """Start local Ray or join the cluster at `resources.address` (unless already connected);
    its workers get the driver's benchmark plug-in path (`relif_ray.problems.worker_env`)."""
    if ray.is_initialized():
        return
    runtime_env = {"env_vars": env} if (env := worker_env()) else None
    if resources.address:
        check_reachable(resources.address)
        try:
            ray.init(address=resources.address, runtime_env=runtime_env)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"--address {resources.address}: cannot connect ({message})") from None
    else:
        ray.init(num_cpus=resources.num_cpus, include_dashboard=False, runtime_env=runtime_env)


def check_cluster(resources: Resources) -> None:
    """Fail before any trial starts when no trial could ever be scheduled (Ray would wait
    forever): too few GPUs in the cluster, or a trial larger than every node."""
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    total = ray.cluster_resources()
    gpus = total.get("GPU", 0.0)
    where = "local Ray" if not resources.address else f"the Ray cluster at {resources.address}"
    if resources.num_gpus > gpus + 1e-9:
        raise UserError(
            f"--num-gpus {resources.num_gpus:g}: {where} has {gpus:g} GPU(s); "
            "no GPU trial could start (use --num-gpus 0 for CPU trials)"
        )
    for kind, asked, flag in (
        ("CPU", resources.cpus_per_trial, "--cpus-per-trial"),
        ("GPU", resources.gpus_per_trial, "--gpus-per-trial"),
    ):
        largest = max((node["Resources"].get(kind, 0.0) for node in nodes), default=0.0)
        if asked > largest + 1e-9:
            raise UserError(
                f"{flag} {asked:g}: the largest node of {where} has {largest:g} {kind}(s); "
                "no trial could start"
            )


def storage_problem(probe: str, token: str) -> str | None:
    """Why the probe file written by the driver is not usable here (None if it is)."""
    path = Path(probe)
    if not path.exists():
        return "the directory is not visible there"
    if path.read_text() != token:
        return "a different directory of the same name is there"
    try:
        check = path.with_name(path.name + f".{uuid.uuid4().hex}")
        check.write_text(token)
        check.unlink()
    except OSError as exc:
        return f"not writable there ({exc.strerror})"
    return None


def check_storage_visible(storage_path: str) -> None:
    """On a multi-node cluster, a local `--storage` path must be one shared directory (NFS):
    the driver writes a probe file with a random token and a task pinned to each node reads it
    back and writes next to it. URIs (s3://, gs://) are left to Ray's storage layer."""
    if "://" in storage_path:
        return
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    if len(nodes) <= 1:
        return
    root = Path(storage_path)
    root.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    probe = root / f".relif-storage-probe-{token}"
    probe.write_text(token)
    remote_check = ray.remote(num_cpus=0)(storage_problem)
    try:
        pending = {
            node["NodeManagerAddress"]: remote_check.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ).remote(str(probe), token)
            for node in nodes
        }
        for address, reference in pending.items():
            problem = ray.get(reference, timeout=120)
            if problem:
                raise UserError(
                    f"--storage {storage_path}: {problem} on node {address}; a multi-node sweep "
                    "needs shared storage (an NFS path mounted on every node, or s3://...)"
                )
    finally:
        probe.unlink(missing_ok=True)


def _trial_dirname(trial: Any) -> str:
    return f"{describe(trial.config)}_{trial.trial_id}"


def run_sweep(
    space: dict[str, Any],
    *,
    name: str,
    storage: str,
    resources: Resources = Resources(),
    max_failures: int = 2,
    keep_checkpoints: int = 2,
    resume: bool = False,
    search: OptunaPlan | None = None,
    callbacks: list[tune.Callback] | None = None,
    verbose: int = 1,
    trainable: type[ReLiFTrainable] = ReLiFTrainable,
) -> str:
    """Run (or resume) one sweep; return the experiment directory (a path or a URI).

    Checks that fail fast, before any trial starts: resources (`check_cluster`) and, on a
    multi-node cluster, shared storage (`check_storage_visible`). `resume` continues a killed
    sweep from its experiment state: finished trials are kept, unfinished and errored ones
    continue from their last checkpoint. `trainable` may be an instrumented subclass (the
    efficiency benchmark times its trials that way).
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # Tune's CLIReporter shows our progress columns
    storage_path = storage if "://" in storage else str(Path(storage).resolve())
    experiment_dir = f"{storage_path.rstrip('/')}/{name}"
    connect(resources)
    check_cluster(resources)
    check_storage_visible(storage_path)
    with_resources = tune.with_resources(
        trainable, {"cpu": resources.cpus_per_trial, "gpu": resources.gpus_per_trial}
    )
    exists = tune.Tuner.can_restore(experiment_dir)
    if resume and not exists:
        raise UserError(f"--resume: no sweep to resume at {experiment_dir}")
    if not resume and exists:
        raise UserError(
            f"--name: a sweep already exists at {experiment_dir} (use --resume to continue it, "
            "or another --name)"
        )
    if resume:
        tuner = tune.Tuner.restore(experiment_dir, with_resources, resume_errored=True)
    else:
        tuner = tune.Tuner(
            with_resources,
            param_space=space,
            tune_config=tune.TuneConfig(
                reuse_actors=True,
                search_alg=StudyGroups(search) if search else None,
                num_samples=search.num_samples * len(search.labels) * len(search.seeds)
                if search
                else 1,
                max_concurrent_trials=resources.max_concurrent_trials,
                trial_dirname_creator=_trial_dirname,
            ),
            run_config=tune.RunConfig(
                name=name,
                storage_path=storage_path,
                checkpoint_config=tune.CheckpointConfig(
                    checkpoint_frequency=1, checkpoint_at_end=True, num_to_keep=keep_checkpoints
                ),
                failure_config=tune.FailureConfig(max_failures=max_failures),
                progress_reporter=tune.CLIReporter(
                    metric_columns=PROGRESS_METRICS,
                    parameter_columns=PROGRESS_PARAMETERS,
                    max_report_frequency=30,
                ),
                callbacks=callbacks,
                verbose=verbose,
            ),
        )
    results = tuner.fit()
    write_pareto(experiment_dir, results)
    return experiment_dir
