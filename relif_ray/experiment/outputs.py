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

The folder is written under a temporary name and renamed, so it is complete or absent.
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
TRACE_FILE = "trace.parquet"


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
    record = dict(info, metrics={name: out.metrics for name, out in splits.items()})
    (staging / TRIAL_FILE).write_text(json.dumps(record, indent=2, sort_keys=True))
    scores = pd.concat(
        [out.scores.assign(split=name) for name, out in splits.items()], ignore_index=True
    )
    scores[["split", "task", "example_id", "score", "valid"]].to_parquet(
        staging / SCORES_FILE, index=False
    )
    pq.write_table(_representation_table(splits), staging / "representations.parquet")
    pd.DataFrame(trace).to_parquet(staging / TRACE_FILE, index=False)
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
    """trial.json of an outputs folder (a local path or a URI, `relif_ray.experiment.storage`)."""
    return json.loads(storage.read_text(storage.join(outputs, TRIAL_FILE)))


def read_representations(outputs: Location, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(example_ids, (N, D) float32 matrix) of one split."""
    table = storage.read_parquet(
        storage.join(outputs, "representations.parquet"), filters=[("split", "=", split)]
    )
    column = table.column("embedding").combine_chunks()
    width = column.type.list_size
    matrix = column.flatten().to_numpy().reshape(-1, width)
    return table.column("example_id").to_numpy(), matrix
