"""The on-disk outputs of one finished trial, written by the Tune layer, read by analysis (the
names of its files and their columns: `relif_ray.experiment.schema`).

A trial's outputs live in a folder `outputs/` inside its final Ray Tune checkpoint, so they
reach the experiment directory in storage (local, NFS or s3://) through Tune's own checkpoint
persistence, and analysis needs nothing but a copy of that directory:

    trial.json            label, method, seed, status, the full ExperimentConfig, metrics per split
    scores.parquet        split, task, example_id, score (raw audit score p_k), valid
    representations.parquet  split, example_id, embedding (list<float32>, shared representation)
    trace.parquet         one row per training step: step, lr (the learning rate it used),
                          loss_<task>, weight_<task>, and the ReLiF statistics (lambda, r,
                          r_ema, tau, kappa, loss_lip) when enabled
    outcomes.parquet      where tasks store outcomes (the clinical ones, `Task.outcomes`):
                          split, task, example_id, position, label, prediction - what a group
                          audit recomputes each task's metric and decisions from
    examples.parquet      where the splits name their examples (a stay's file or id):
                          split, example_id, name - what joins the outcomes to other files

The folder is written under a temporary name and renamed, so it is complete or absent where
the trial writes it. Tune then copies the checkpoint into storage file by file, so a reader of
a running sweep can find `trial.json` there before the other files, or a file still being
copied: `trial.json` is written last and lists every other file with its size
(`relif_ray.experiment.record.FILES_KEY`), and `check_complete` holds a folder whose files are
not all there, whole, as damaged. A write that fails for lack of space names its file
(`relif_ray.experiment.storage.OutOfSpace`).

trial.json holds the trial's `relif_ray.experiment.record.TrialRecord`. A Tune trial that
trained several seeds writes each seed's files and record in a folder of its own
(`seed_folder`, laid out as above) and at the top a `FusedTrialRecord` that names those folders
(`write_fused_outputs`); readers take each seed as a trial of its own (`seed_records`).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs
import pyarrow.parquet as pq

from relif_ray.experiment import storage
from relif_ray.experiment.record import (
    STOPPED,
    FusedTrialRecord,
    TrialRecord,
    record_text,
    trial_record,
)
from relif_ray.experiment.schema import (
    EXAMPLES_FILE,
    OUTCOME_COLUMNS,
    OUTCOMES_FILE,
    OUTPUTS_DIR,
    REPRESENTATIONS_FILE,
    SCORE_COLUMNS,
    SCORES_FILE,
    TRACE_FILE,
    TRIAL_FILE,
)
from relif_ray.experiment.storage import Location

if TYPE_CHECKING:
    from relif_ray.evaluation import EvalResult


@dataclass(frozen=True)
class SeedOutputs:
    """What one seed of a trial leaves: its record (`TrialRecord`; the writer adds its
    metrics per split and its files), its evaluated splits and its per-step trace."""

    record: TrialRecord
    splits: dict[str, EvalResult]
    trace: list[dict[str, float]]


def write_trial_outputs(
    directory: Path,
    record: TrialRecord,
    splits: dict[str, EvalResult],
    trace: list[dict[str, float]],
) -> Path:
    """Atomically write `directory/outputs/` of a trial of one seed: its files and its
    trial.json (`record`, with the splits' metrics and the files' sizes)."""
    final, staging = _staging(Path(directory))
    _write_seed(staging, SeedOutputs(record, splits, trace))
    return _publish(staging, final)


def write_fused_outputs(
    directory: Path, trial_id: str, status: str, seeds: Sequence[SeedOutputs]
) -> Path:
    """Atomically write `directory/outputs/` of a Tune trial that trained several seeds: each
    seed's files and trial.json in a folder of its own (`seed_folder`), as a trial of one seed
    writes them, and at the top a trial.json (`FusedTrialRecord`) that names those folders and
    lists every file below it with its size, written last."""
    final, staging = _staging(Path(directory))
    folders = {}
    for seed in seeds:
        folders[seed.record.seed] = folder = seed_folder(seed.record.seed)
        (staging / folder).mkdir()
        _write_seed(staging / folder, seed)
    sizes = {
        path.relative_to(staging).as_posix(): path.stat().st_size
        for path in sorted(staging.rglob("*"))
        if path.is_file()
    }
    _write_record(staging, FusedTrialRecord(trial_id, folders, status, sizes))
    return _publish(staging, final)


def seed_folder(seed: int) -> str:
    """The folder of one seed's outputs inside a trial's outputs folder, where the trial
    trained several seeds."""
    return f"seed{seed}"


def _staging(directory: Path) -> tuple[Path, Path]:
    """(the outputs folder, its staging folder, made empty)."""
    final, staging = directory / OUTPUTS_DIR, directory / (OUTPUTS_DIR + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return final, staging


def _publish(staging: Path, final: Path) -> Path:
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    return final


def _write_record(folder: Path, record: TrialRecord | FusedTrialRecord) -> None:
    with storage.writing(folder / TRIAL_FILE):
        (folder / TRIAL_FILE).write_text(record_text(record))


def _write_seed(staging: Path, seed: SeedOutputs) -> None:
    """One seed's files in `staging`, its trial.json last."""
    splits = seed.splits
    scores = pd.concat(
        [out.scores.assign(split=name) for name, out in splits.items()], ignore_index=True
    )
    with storage.writing(staging / SCORES_FILE):
        scores[SCORE_COLUMNS].to_parquet(staging / SCORES_FILE, index=False)
    with storage.writing(staging / REPRESENTATIONS_FILE):
        pq.write_table(_representation_table(splits), staging / REPRESENTATIONS_FILE)
    with storage.writing(staging / TRACE_FILE):
        pd.DataFrame(seed.trace).to_parquet(staging / TRACE_FILE, index=False)
    outcomes = [out.outcomes.assign(split=name) for name, out in splits.items()]
    if any(len(frame) for frame in outcomes):
        table = pd.concat(outcomes, ignore_index=True)
        with storage.writing(staging / OUTCOMES_FILE):
            table[["split", *OUTCOME_COLUMNS]].to_parquet(staging / OUTCOMES_FILE, index=False)
    names = [
        pd.DataFrame({"split": name, "example_id": np.arange(len(out.names)), "name": out.names})
        for name, out in splits.items()
        if out.names is not None
    ]
    if names:
        with storage.writing(staging / EXAMPLES_FILE):
            pd.concat(names, ignore_index=True).to_parquet(staging / EXAMPLES_FILE, index=False)
    sizes = {path.name: path.stat().st_size for path in sorted(staging.iterdir())}
    metrics = {name: out.metrics for name, out in splits.items()}
    _write_record(staging, replace(seed.record, metrics=metrics, files=sizes))


def _representation_table(splits: dict[str, EvalResult]) -> pa.Table:
    tables = []
    for name, out in splits.items():
        matrix = np.ascontiguousarray(out.representations, dtype=np.float32)
        embedding = pa.FixedSizeListArray.from_arrays(pa.array(matrix.ravel()), matrix.shape[1])
        tables.append(
            pa.table(
                {
                    "split": pa.array([name] * len(matrix)),
                    "example_id": pa.array(out.example_ids.astype(np.int64)),
                    "embedding": embedding,
                }
            )
        )
    return pa.concat_tables(tables)


def read_trial_record(outputs: Location) -> TrialRecord | FusedTrialRecord:
    """The record of an outputs folder's trial.json (a local path or a URI,
    `relif_ray.experiment.storage`); `storage.DamagedFile` where it is not one
    (`relif_ray.experiment.record.trial_record`)."""
    place = storage.join(outputs, TRIAL_FILE)
    info = storage.read_json(place)
    with storage.reading(place):
        return trial_record(info)


def read_trial_info(outputs: Location) -> dict[str, Any]:
    """trial.json of an outputs folder as its JSON object, checked as `read_trial_record`
    checks it."""
    return read_trial_record(outputs).to_json()


def seed_records(
    outputs: Location, record: TrialRecord | FusedTrialRecord
) -> list[tuple[TrialRecord, Location]]:
    """Each seed's record and outputs folder, for the trial whose outputs folder `outputs`
    holds `record`: that record and folder for a trial of one seed, each seed folder's for a
    trial of several (`write_fused_outputs`), in the trial's order."""
    if isinstance(record, TrialRecord):
        return [(record, outputs)]
    seeds = []
    for folder in record.seed_folders.values():
        place = storage.join(outputs, folder)
        seed = read_trial_record(place)
        if not isinstance(seed, TrialRecord):
            raise storage.DamagedFile(storage.join(place, TRIAL_FILE), "not one seed's record")
        seeds.append((seed, place))
    return seeds


def check_complete(
    outputs: Location, record: TrialRecord | FusedTrialRecord, sizes: dict[str, int]
) -> None:
    """`storage.DamagedFile` naming the first file that trial.json (`record`) lists but the
    outputs folder lacks, or holds with another size (`sizes`: its files as listed, relative
    to it): a copy into storage that is not finished, or was cut off."""
    for name, size in sorted((record.files or {}).items()):
        found = sizes.get(name)
        if found != size:
            reason = "missing" if found is None else f"{found} of its {size} bytes"
            raise storage.DamagedFile(storage.join(outputs, *name.split("/")), reason)


def scheduler_snapshot(record: TrialRecord | FusedTrialRecord, statuses: dict[str, str]) -> bool:
    """Whether outputs (their trial.json's `record`) are the snapshot that a trial wrote where
    a scheduler (ASHA) may stop it (status "stopped") while the trial runs on: not yet the
    trial's last, unless Tune's trial list (`statuses`,
    `relif_ray.experiment.layout.tune_statuses`) has ended it. Asked only while a sweep runs."""
    return record.status == STOPPED and statuses.get(record.trial_id) != "TERMINATED"


def read_representations(outputs: Location, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(example_ids, (N, D) float32 matrix) of one split."""
    table = storage.read_parquet(
        storage.join(outputs, REPRESENTATIONS_FILE), filters=[("split", "=", split)]
    )
    column = table.column("embedding").combine_chunks()
    width = column.type.list_size
    matrix = column.flatten().to_numpy().reshape(-1, width)
    return table.column("example_id").to_numpy(), matrix


def read_outcomes(outputs: Location, split: str) -> pd.DataFrame | None:
    """The outcomes of one split (task, example_id, position, label, prediction) with each
    example's `name` where the trial stored names (else None in that column); None where the
    trial stored no outcomes. `storage.DamagedFile` names a damaged file."""
    place = storage.join(outputs, OUTCOMES_FILE)
    if storage.file_type(place) != pa.fs.FileType.File:
        return None
    outcomes = storage.read_parquet(place, filters=[("split", "=", split)]).to_pandas()
    outcomes = outcomes.drop(columns="split")
    names = storage.join(outputs, EXAMPLES_FILE)
    if storage.file_type(names) != pa.fs.FileType.File:
        return outcomes.assign(name=None)
    examples = storage.read_parquet(names, filters=[("split", "=", split)]).to_pandas()
    with storage.reading(names):
        name_of = examples.set_index("example_id")["name"]
        if not outcomes["example_id"].isin(name_of.index).all():
            raise ValueError(f"no name for some example ids of the {split} split")
    return outcomes.assign(name=name_of.reindex(outcomes["example_id"]).to_numpy())
