"""The Ray Tune trial: a Trainable around the engine, with a live validation audit.

One trial = one `TrainingRun`; one Tune iteration = one epoch followed, on the epochs of
`evaluates_after` (every `train.eval_every` epochs, the last one and ASHA's rungs), by a
validation pass and a live fixed-delta audit. An epoch without them reports the metrics a
scheduler or searcher reads as NaN and `evaluated: false` (`_skip_validation`), so ASHA and the
Optuna studies only ever decide on a fresh validation. Evaluation changes no training state, so
the validated epochs change no trained number, and a resumed trial validates the same epochs
(they depend on the epoch's number only). Checkpoints hold the engine state (model, optimiser,
method, ReLiF controller, step, RNG), one per epoch; the final checkpoint also holds the
trial's outputs for val and test (see `relif_ray.experiment.outputs`), so the experiment
directory in storage is all that analysis needs. A trial's Tune config is described in
`relif_ray.sweep.trial_config`.

Same-seed ERM squash constants (`relif_ray.reference`): a trial that waits for its seed's
reference reads q10/q90 of its seed from the experiment's `squash_constants.json` at set-up
(the sweep starts it only after its seed's ERM trial has finished, `relif_ray.tuning.order`)
and trains on them; its `trial.json` records them in its config. An ERM reference trial
reports its validation q10/q90 with its last result, from which the driver writes that file.

Live validation Bias (`val_bias`, the progress table and the Optuna objective): the fixed-delta
audit at the sweep's `delta` of the trial's own validation scores (`relif_ray.live_audit`); a
progress and search signal only, the official numbers come from analysis.

Each epoch's result also carries the ReLiF statistics at the epoch's last step
(`relif_ray.relif.STAT_KEYS`: lambda, r_ema, tau, kappa, loss_lip, ...; NaN without ReLiF),
so TensorBoard, W&B, MLflow and the progress table follow the controller live. A trial
stopped early by the scheduler (ASHA) writes its outputs, with status "stopped", at the
checkpoints where it may be stopped (`outputs_at_iterations` of its config).
What an epoch reports and the final record are typed in `relif_ray.experiment.record`
(`EpochResult`, `TrialRecord`), which owns their keys. A trial of fused seeds
(`train.fused_seeds`, `relif_ray.fused`) trains them as one model and reports, validates,
checkpoints and writes outputs for each seed as above (each seed's training seconds: its
share of the fused epoch's).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import pickle
import posixpath
import shutil
import tempfile
import time
from collections.abc import Collection, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow.fs
import torch
from ray import tune

from relif_ray.config import ExperimentConfig
from relif_ray.engine import TrainingRun
from relif_ray.errors import UserError
from relif_ray.evaluation import EvalResult
from relif_ray.experiment import storage
from relif_ray.experiment.layout import SQUASH_CONSTANTS_FILE
from relif_ray.experiment.outputs import SeedOutputs, write_fused_outputs, write_trial_outputs
from relif_ray.experiment.record import (
    COMPLETED,
    MACRO,
    STOPPED,
    TIMED_PARTS,
    WORST,
    EpochResult,
    TrialRecord,
    Validation,
    seed_row_id,
    split_metric,
    tune_result,
)
from relif_ray.fused import FusedTrainingRun
from relif_ray.live_audit import LiveValidationAudit
from relif_ray.messages import show_messages
from relif_ray.reference import (
    config_reference_key,
    is_reference,
    read_squash_constants,
    waits_for_reference,
)
from relif_ray.relif import STAT_KEYS
from relif_ray.sweep.labels import setting_values
from relif_ray.sweep.trial_config import TuneKeys, experiment_config, seed_configs

STATE_FILE = "state.pt"
EVAL_SPLITS = ("val", "test")


class PhaseTimer:
    """Seconds of the parts of one epoch (`relif_ray.experiment.record.TIMED_PARTS`): training
    steps, validation and the live audit. Each part ends by reading its results on the host
    (the trace, the metrics, the Bias), so on a GPU its seconds include the device's work."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, part: str) -> Iterator[None]:
        if part not in TIMED_PARTS:  # a result reports and reads back these parts only
            raise ValueError(f"not a timed part of an epoch: {part}")
        start = time.perf_counter()
        yield
        self.seconds[part] = time.perf_counter() - start


def evaluates_after(
    iteration: int, eval_every: int, last: bool, decision_iterations: Collection[int]
) -> bool:
    """Whether a trial validates after its `iteration`-th epoch (Tune's iteration, 1-based):
    every `eval_every` epochs (`train.eval_every`), after its last epoch, and after every epoch
    at which a scheduler decides (`decision_iterations`: ASHA's rungs, where it ranks and may
    stop the trial and the trial writes its outputs). The Optuna studies read a trial's last
    result only (they prune nothing on the way), which is always validated."""
    return last or iteration % eval_every == 0 or iteration in decision_iterations


class InjectedFault(RuntimeError):
    """Raised by the test-only `fault_injection_step` of a trial config."""


def live_controller_state(trace: list[dict[str, float]]) -> dict[str, float]:
    """The ReLiF statistics (`STAT_KEYS`) of the last trace row: what each epoch's result
    carries (NaN where the trial has none)."""
    last = trace[-1] if trace else {}
    return {key: float(last.get(key, math.nan)) for key in STAT_KEYS}


def with_reference_constants(config: ExperimentConfig, where: str | None) -> ExperimentConfig:
    """`config` with its seed's same-seed ERM squash constants, read from the experiment's
    `squash_constants.json` (in the experiment directory `where`), where it waits for them."""
    if not waits_for_reference(config):
        return config
    key = config_reference_key(config)
    constants = read_squash_constants(where).get(key) if where else None
    if not constants:
        raise UserError(
            f"not started: no squash constants of seed {key} in "
            f"{where}/{SQUASH_CONSTANTS_FILE} (written when that seed's ERM trial finishes)"
        )
    return replace(config, relif=replace(config.relif, squash_constants=constants))


def newest_complete_state(checkpoint_dir: Path) -> dict[str, Any]:
    """The engine state in `checkpoint_dir`, or, where it has none or one that does not load, in
    the newest checkpoint folder beside it that holds a loadable one.

    After a driver kill Tune can restore a trial from a checkpoint that it had deleted
    (ray-project/ray#27790, `surviving_checkpoint`, which names the newest folder beside it that
    has a state file instead). That newer folder can hold a state that a killed trial left
    half-written; it does not load, and the newest complete one is taken. Folders beside it
    exist where the experiment is on a file system (local, NFS); from object storage Tune
    fetches only the named checkpoint.
    """
    named = checkpoint_dir / STATE_FILE
    beside = sorted(checkpoint_dir.parent.glob(f"checkpoint_*/{STATE_FILE}"), reverse=True)
    for state_file in [named, *(other for other in beside if other != named)]:
        state = readable_state(state_file)
        if state is not None:
            return state
    raise UserError(f"not restored: {named} is missing, and no checkpoint beside it has a state")


def write_state(state: dict[str, Any], state_file: Path) -> None:
    """`torch.save(state, state_file)` without a CRC-32 per zip record. `torch.load` never
    checks those checksums (a flipped byte loads either way), and computing them took about
    half of a trial's checkpoint save: 0.23-0.33 s against 0.11-0.12 s of CPU for a ResNet-18
    with Adam's moments (133 MB, one thread). A file cut off mid-write still fails to load
    (`readable_state`). The process-wide setting is put back afterwards. The file is a Python
    file object, as fast, so that a write that fails for lack of space keeps its cause
    (`storage.writing`; torch's own file writer reports none)."""
    crc32 = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        with storage.writing(state_file), state_file.open("wb") as file:
            torch.save(state, file)
    finally:
        torch.serialization.set_crc32_options(crc32)


def readable_state(state_file: Path) -> dict[str, Any] | None:
    """The engine state saved in `state_file`; None where the file is missing or was cut off
    mid-write. torch raises a zip error for a file cut within its first few kilobytes, an
    OSError "Invalid argument" for one cut later (its zip reader seeks back from the end for a
    directory that is not there) and a pickle error for one that is not a zip at all."""
    if not state_file.exists():
        return None
    try:
        return torch.load(state_file, weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError):
        return None
    except OSError as error:
        if error.errno != errno.EINVAL:  # not a cut file: unreadable for another reason
            raise
        return None


def surviving_checkpoint(result: Any) -> Any:
    """Tune's restore `result` (a `_TrainingResult`), pointed at the newest `checkpoint_*`
    folder beside its checkpoint that holds a state, where its own checkpoint holds none.

    The driver-kill race of ray-project/ray#27790 (`newest_complete_state`) leaves the
    experiment state naming a checkpoint folder that Tune deleted, whole or in part;
    `Trainable.restore` would error the trial on a missing folder ("does not exist on storage
    anymore") and find no state in a part-deleted one, although a newer checkpoint of the trial
    is there. The named folder is then made again, empty: Tune's driver still counts it as the
    trial's checkpoint and deletes it when the trial's next checkpoint replaces it, which logs
    a traceback where the folder is missing. The storage's own file system (`pyarrow.fs`)
    lists the trial's folders, so local, NFS and object storage are treated alike. Where no
    folder beside it holds a state, `result` is returned as it is and Tune's error stands."""
    checkpoint = getattr(result, "checkpoint", None)
    if checkpoint is None:
        return result
    filesystem = checkpoint.filesystem

    def has_state(folder: str) -> bool:
        state = filesystem.get_file_info(posixpath.join(folder, STATE_FILE))
        return state.type == pyarrow.fs.FileType.File

    if has_state(checkpoint.path):
        return result
    trial_dir = posixpath.dirname(checkpoint.path.rstrip("/"))
    entries = filesystem.get_file_info(pyarrow.fs.FileSelector(trial_dir, allow_not_found=True))
    folders = [
        entry.path
        for entry in entries
        if entry.type == pyarrow.fs.FileType.Directory
        and posixpath.basename(entry.path).startswith("checkpoint_")
    ]
    newest = max((folder for folder in folders if has_state(folder)), default=None)
    if newest is not None:
        filesystem.create_dir(checkpoint.path)
        result.checkpoint = tune.Checkpoint(newest, filesystem=filesystem)
    return result


class ReLiFTrainable(tune.Trainable):
    """One trial: `step()` trains one epoch, validates and audits; checkpoints carry the engine
    state, and the final one the trial's outputs."""

    def setup(self, config: dict[str, Any]) -> None:
        show_messages()  # a trial's log lines, as its command's (relif_ray.messages)
        cpus = self.trial_resources.required_resources.get("CPU", 1)
        torch.set_num_threads(max(1, int(cpus)))
        keys = TuneKeys.of(config)
        self.label = keys.label
        self.delta = float(keys.delta)
        self.fault_step = keys.fault_injection_step
        self.outputs_at = set(keys.outputs_at_iterations)
        self.restored = False
        self.started_at = time.time()  # this process's start (wall clock), kept in trial.json
        if keys.reference_error:
            raise UserError(f"not started: {keys.reference_error}")
        configs = [
            with_reference_constants(seed_config, keys.experiment_dir)
            for seed_config in seed_configs(experiment_config(config), keys.fused_seeds)
        ]
        self.trainer = FusedTrainingRun(configs) if keys.fused_seeds else TrainingRun(configs[0])
        """What trains: the one seed's run, or the fused run of several (`relif_ray.fused`)."""
        self.runs = self.trainer.members if keys.fused_seeds else [self.trainer]
        """Each seed's own run (live parameters, trace): what validates and writes outputs."""
        self.run = self.runs[0]  # what the seeds share: budget, device, problem
        self.probability_tasks = {task.name for task in self.run.tasks if task.score_is_probability}
        self.squashed_tasks = [t.name for t in self.run.tasks if not t.score_is_probability]
        self.is_reference = is_reference(configs[0])
        self.live_audits = [
            LiveValidationAudit(
                self.probability_tasks,
                self.delta,
                run.config.relif.squash_constants if run.config.relif.enabled else None,
            )
            for run in self.runs
        ]
        """Each seed's live audit of its validation scores (its pairs sampled once)."""
        self.last_eval: list[EvalResult | None] = [None] * len(self.runs)
        self.last_test: list[EvalResult | None] = [None] * len(self.runs)
        """Each seed's evaluation of this epoch (test: where train.epoch_test_metrics)."""
        self.checkpoint_seconds = math.nan

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self.setup(new_config)
        return True

    def step(self) -> dict[str, Any]:
        self._inject_fault()
        train = PhaseTimer()
        with train("train"):
            self.trainer.train_epoch()
        evaluated = evaluates_after(
            self.iteration + 1,  # this step's Tune iteration: Trainable counts it on return
            self.run.config.train.eval_every,
            self.trainer.finished,
            self.outputs_at,
        )
        results = []
        for index, run in enumerate(self.runs):
            timer = PhaseTimer()  # a seed's share of the training, its own validation
            timer.seconds["train"] = train.seconds["train"] / len(self.runs)
            validation = self._validate(index, timer) if evaluated else self._skip(index)
            results.append(
                EpochResult(
                    label=self.label,
                    seed=run.config.seed,
                    epoch=run.epoch,
                    train_step=run.step,
                    done=run.finished,
                    device=str(run.device),
                    validation=validation,
                    settings=setting_values(run.config.relif),
                    controller=live_controller_state(run.trace),
                    seconds=timer.seconds,
                    checkpoint_seconds=self.checkpoint_seconds,
                    cuda_peak_mb=self._device_memory(),
                )
            )
        return tune_result(results)

    def _validate(self, index: int, timer: PhaseTimer) -> Validation:
        """This epoch's validation pass and live audit of seed `index` (and test pass, where
        `train.epoch_test_metrics`)."""
        run = self.runs[index]
        with timer("evaluate"):
            self.last_eval[index] = last_eval = run.evaluate("val")
        with timer("audit"):
            audit = self.live_audits[index](last_eval.scores)
        metrics = {split_metric("val", key): value for key, value in last_eval.metrics.items()}
        if run.config.train.epoch_test_metrics and "test" in run.problem.splits:
            with timer("evaluate_test"):
                self.last_test[index] = last_test = run.evaluate("test")
            metrics.update({split_metric("test", k): v for k, v in last_test.metrics.items()})
        reference = self.is_reference and run.finished
        return Validation(
            metrics=metrics,
            worst=last_eval.metrics[WORST],
            macro=last_eval.metrics[MACRO],
            val_bias=audit.bias if audit else math.nan,
            val_vr=audit.vr if audit else math.nan,
            squash_constants=(
                last_eval.squash_constants(self.squashed_tasks) if reference else None
            ),
        )

    def _skip(self, index: int) -> None:
        """An epoch without validation: the metrics a scheduler or searcher may read are
        reported as NaN (`NOT_VALIDATED`; never the last evaluation's, which would pass for
        this epoch's), the others not at all; outputs written now would be evaluated afresh
        (`_write_outputs`)."""
        self.last_eval[index] = self.last_test[index] = None

    def _device_memory(self) -> float | None:
        """On CUDA, the trial's peak GPU memory so far (MiB; the caching allocator's count,
        read on the host without waiting for the device): what decides how many trials share
        a GPU (`--gpus-per-trial`)."""
        device = self.run.device
        if device.type != "cuda":
            return None
        return torch.cuda.max_memory_allocated(device) / 2**20

    def _inject_fault(self) -> None:
        """Train up to `fault_injection_step` and raise, unless this trial was restored from a
        checkpoint: the fault fires once, and the retry continues from the last checkpoint."""
        step, trainer = self.fault_step, self.trainer
        if step is None or self.restored:
            return
        end = min((trainer.epoch + 1) * trainer.steps_per_epoch, trainer.total_steps)
        if trainer.step <= step < end:
            trainer.train_steps(step - trainer.step)
            raise InjectedFault(f"fault injected at training step {step}{self._held()}")

    def _held(self) -> str:
        """What a fused trial's failure adds: the seeds it held."""
        if len(self.runs) == 1:
            return ""
        return f" (a fused trial of seeds {', '.join(str(s) for s in self.trainer.seeds)})"

    def save(self, checkpoint_dir: str | None = None) -> Any:
        """Tune's save (`save_checkpoint` into a folder on this node, then the checkpoint
        copied into storage), timed: the next result reports its seconds
        (`relif_ray.experiment.record.CHECKPOINT_SECONDS`), which the checkpoint cadence
        keeps to a small share of the trial's time (`relif_ray.tuning.launch.CheckpointCadence`).

        A save that fails for lack of space (a full disk here or in storage, a quota, a
        file-size limit) fails the trial with `storage.OutOfSpace`, one line that names the file
        and the cause (`_copy_out_of_space`). Like any failure but a user error it is retried
        from the trial's last checkpoint, which is left as it was, up to `--max-failures`
        times. The folder on this node is removed either way (Tune leaves it behind when the
        save fails, on a disk that may be full)."""
        staging = checkpoint_dir or tempfile.mkdtemp(prefix="relif-checkpoint-")
        index = self._storage.current_checkpoint_index if self._storage else None
        start = time.perf_counter()
        try:
            result = super().save(staging)
        except Exception as error:
            self._copy_out_of_space(error, index)
            raise
        finally:
            if checkpoint_dir is None:
                shutil.rmtree(staging, ignore_errors=True)
        self.checkpoint_seconds = time.perf_counter() - start
        return result

    def _copy_out_of_space(self, error: Exception, index: int | None) -> None:
        """Where a save failed for lack of space while Tune copied the checkpoint into storage
        (Tune had numbered it: its checkpoint index moved from `index`), remove the part
        copied, which no one reads, and raise `storage.OutOfSpace` naming its folder (the copy's
        own error names no file). A failure in `save_checkpoint` names its file already."""
        cause = storage.lack_of_space(error)
        moved = self._storage is not None and self._storage.current_checkpoint_index != index
        if cause is None or isinstance(error, storage.OutOfSpace) or not moved:
            return
        folder = self._storage.checkpoint_fs_path
        with contextlib.suppress(OSError):
            self._storage.storage_filesystem.delete_dir(folder)
        raise storage.OutOfSpace(cause.errno, os.strerror(cause.errno), folder) from error

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        write_state(self.trainer.state_dict(), Path(checkpoint_dir) / STATE_FILE)
        if self.trainer.finished or self.iteration in self.outputs_at:
            self._write_outputs(Path(checkpoint_dir))

    def restore(self, checkpoint_path: Any) -> None:
        """Tune's restore, from the newest surviving checkpoint where Tune names one that it
        deleted (`surviving_checkpoint`)."""
        super().restore(surviving_checkpoint(checkpoint_path))

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        """Load the engine state of `checkpoint_dir`, else of the trial's newest complete
        checkpoint (`newest_complete_state`); Tune's iteration count follows the engine's epoch
        (one iteration is one epoch), which is the loaded checkpoint's either way."""
        self.trainer.load_state_dict(newest_complete_state(Path(checkpoint_dir)))
        self._iteration = self.trainer.epoch  # Tune's counter; Trainable has no setter for it
        self.restored = True

    def _write_outputs(self, directory: Path) -> None:
        """The trial's outputs: its one seed's, or each fused seed's in a folder of its own
        (`write_fused_outputs`)."""
        seeds = [self._seed_outputs(index) for index in range(len(self.runs))]
        if len(seeds) == 1:
            write_trial_outputs(directory, seeds[0].record, seeds[0].splits, seeds[0].trace)
            return
        status = COMPLETED if self.trainer.finished else STOPPED
        write_fused_outputs(directory, self.trial_id, status, seeds)

    def _seed_outputs(self, index: int) -> SeedOutputs:
        run = self.runs[index]
        latest = {"val": self.last_eval[index], "test": self.last_test[index]}
        splits = {
            name: latest[name] if latest[name] is not None else run.evaluate(name)
            for name in EVAL_SPLITS
            if name in run.problem.splits
        }
        config = run.config
        fused = len(self.runs) > 1
        record = TrialRecord(
            trial_id=seed_row_id(self.trial_id, config.seed) if fused else self.trial_id,
            label=self.label,
            method=config.method.name,
            relif=config.relif.enabled,
            seed=config.seed,
            steps=run.step,
            config=config.to_dict(),
            status=COMPLETED if run.finished else STOPPED,
            device=str(run.device),
            restored_from_checkpoint=self.restored,
            started_at=self.started_at,
            finished_at=time.time(),
        )
        return SeedOutputs(record, splits, run.trace)
