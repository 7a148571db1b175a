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
copied: `trial.json` is written last and lists every other file with its size (`FILES_KEY`),
and `check_complete` holds a folder whose files are not all there, whole, as damaged. A write
that fails for lack of space names its file (`relif_ray.experiment.storage.OutOfSpace`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs
import pyarrow.parquet as pq

from relif_ray.experiment import storage
from relif_ray.experiment.schema import (
    EXAMPLES_FILE,
    FILES_KEY,
    OUTCOME_COLUMNS,
    OUTCOMES_FILE,
    OUTPUTS_DIR,
    REPRESENTATIONS_FILE,
    SCORE_COLUMNS,
    SCORES_FILE,
    TRACE_FILE,
    TRIAL_FILE,
    TRIAL_KEYS,
)
from relif_ray.experiment.storage import Location

if TYPE_CHECKING:
    from relif_ray.evaluation import EvalResult


def write_trial_outputs(
    directory: Path,
    info: dict[str, Any],
    splits: dict[str, EvalResult],
    trace: list[dict[str, float]],
) -> Path:
    """Atomically write `directory/outputs/`; `info` holds label, method, seed, config."""
    final = Path(directory) / OUTPUTS_DIR
    staging = Path(directory) / (OUTPUTS_DIR + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    scores = pd.concat(
        [out.scores.assign(split=name) for name, out in splits.items()], ignore_index=True
    )
    with storage.writing(staging / SCORES_FILE):
        scores[SCORE_COLUMNS].to_parquet(staging / SCORES_FILE, index=False)
    with storage.writing(staging / REPRESENTATIONS_FILE):
        pq.write_table(_representation_table(splits), staging / REPRESENTATIONS_FILE)
    with storage.writing(staging / TRACE_FILE):
        pd.DataFrame(trace).to_parquet(staging / TRACE_FILE, index=False)
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
    record = dict(info, metrics={name: out.metrics for name, out in splits.items()})
    with storage.writing(staging / TRIAL_FILE):
        text = json.dumps({**record, FILES_KEY: sizes}, indent=2, sort_keys=True)
        (staging / TRIAL_FILE).write_text(text)
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    return final


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


def read_trial_info(outputs: Location) -> dict[str, Any]:
    """trial.json of an outputs folder (a local path or a URI, `relif_ray.experiment.storage`);
    `storage.DamagedFile` if it is not a JSON object with `TRIAL_KEYS`."""
    place = storage.join(outputs, TRIAL_FILE)
    info = storage.read_json(place)
    with storage.reading(place):
        if not isinstance(info, dict):
            raise ValueError("not a JSON object")
        if missing := [key for key in TRIAL_KEYS if key not in info]:
            raise ValueError(f"no {', '.join(missing)}")
    return info


def check_complete(outputs: Location, info: dict[str, Any], sizes: dict[str, int]) -> None:
    """`storage.DamagedFile` naming the first file that trial.json (`info`) lists but the
    outputs folder lacks, or holds with another size (`sizes`: its files as listed, relative
    to it): a copy into storage that is not finished, or was cut off."""
    for name, size in sorted(info.get(FILES_KEY, {}).items()):
        found = sizes.get(name)
        if found != size:
            reason = "missing" if found is None else f"{found} of its {size} bytes"
            raise storage.DamagedFile(storage.join(outputs, name), reason)


def scheduler_snapshot(info: dict[str, Any], statuses: dict[str, str]) -> bool:
    """Whether outputs (their trial.json, `info`) are the snapshot that a trial wrote where a
    scheduler (ASHA) may stop it (status "stopped") while the trial runs on: not yet the trial's
    last, unless Tune's trial list (`statuses`, `relif_ray.experiment.layout.tune_statuses`)
    has ended it. Asked only while a sweep runs."""
    return info.get("status") == "stopped" and statuses.get(info["trial_id"]) != "TERMINATED"


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
