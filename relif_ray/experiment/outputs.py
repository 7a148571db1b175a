"""The on-disk outputs of one finished trial, written by the Tune layer, read by analysis.

A trial's outputs live in a folder `outputs/` inside its final Ray Tune checkpoint, so they
reach the experiment directory in storage (local, NFS or s3://) through Tune's own checkpoint
persistence, and analysis needs nothing but a copy of that directory:

    trial.json            label, method, seed, status, the full ExperimentConfig, metrics per split
    scores.parquet        split, task, example_id, score (raw audit score p_k), valid
    representations.parquet  split, example_id, embedding (list<float32>, shared representation)
    trace.parquet         one row per training step: step, lr (the learning rate it used),
                          loss_<task>, weight_<task>, and the ReLiF statistics (lambda, r,
                          r_ema, tau, kappa, loss_lip) when enabled

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
from relif_ray.experiment.storage import Location

if TYPE_CHECKING:
    from relif_ray.engine import EvalResult

OUTPUTS_DIR = "outputs"
TRIAL_FILE = "trial.json"
SCORES_FILE = "scores.parquet"
REPRESENTATIONS_FILE = "representations.parquet"
TRACE_FILE = "trace.parquet"
TRIAL_KEYS = ("trial_id", "label", "method", "relif", "seed", "steps", "config", "metrics")
"""What every trial.json holds (analysis reads them; more keys are descriptive)."""
FILES_KEY = "files"
"""trial.json's list of the folder's other files: name -> size in bytes (absent in outputs
written before it was added: those are taken as complete)."""


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
    columns = ["split", "task", "example_id", "score", "valid"]
    with storage.writing(staging / SCORES_FILE):
        scores[columns].to_parquet(staging / SCORES_FILE, index=False)
    with storage.writing(staging / REPRESENTATIONS_FILE):
        pq.write_table(_representation_table(splits), staging / REPRESENTATIONS_FILE)
    with storage.writing(staging / TRACE_FILE):
        pd.DataFrame(trace).to_parquet(staging / TRACE_FILE, index=False)
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


def read_representations(outputs: Location, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(example_ids, (N, D) float32 matrix) of one split."""
    table = storage.read_parquet(
        storage.join(outputs, REPRESENTATIONS_FILE), filters=[("split", "=", split)]
    )
    column = table.column("embedding").combine_chunks()
    width = column.type.list_size
    matrix = column.flatten().to_numpy().reshape(-1, width)
    return table.column("example_id").to_numpy(), matrix
