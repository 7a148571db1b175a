"""A plug-in benchmark: two binary tasks on 4 features, an MLP with one head per task.

Put this file in a directory of its own and name that directory in RELIF_PROBLEMS_PATH; then
`toy` is a data set like the built-in ones, for `relif make-data`, the sweeps (and their Ray
workers) and `relif report` (docs/problems.md):

    mkdir -p my_problems && cp docs/examples/my_benchmark.py my_problems/
    export RELIF_PROBLEMS_PATH=$PWD/my_problems
    relif make-data toy --out data/toy --examples 200
    python sweeps/run.py --dataset toy --data-dir data/toy --methods erm,relif
    relif report relif-results/toy --out reports/toy

The module defines `BENCHMARK`: a reader (`load_toy`, the files `write_toy` writes), its tasks
(loss, metrics, normalized score, audit score p_k in [0, 1]), its model (a shared backbone and
one head per task), the sweep defaults and the synthetic writer. tests/test_benchmark_plugin.py
runs exactly these commands' machinery on this file.
"""

from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from relif_ray.config import ModelConfig
from relif_ray.data.atomic_dir import atomic_directory
from relif_ray.data.splits import Batch
from relif_ray.models.base import MultiTaskModel
from relif_ray.problems import (
    SEED_OPTION,
    Benchmark,
    DatasetDefaults,
    DataWriter,
    Problem,
    TensorSplit,
    WriterOption,
)
from relif_ray.tasks.base import MetricAccumulator, ModelOutput, Task

TASKS = ("left", "right")  # task k: is feature k positive?


def write_toy(
    out: str | Path, *, overwrite: bool = False, examples: int = 40, seed: int = 0
) -> Path:
    """The synthetic writer (`relif make-data toy`, `--demo`): {train,val,test}_{x,y}.npy."""
    rng = np.random.default_rng(seed)
    with atomic_directory(out, overwrite=overwrite) as folder:  # complete, or nothing written
        for split in ("train", "val", "test"):
            x = rng.normal(size=(examples, 4)).astype(np.float32)
            np.save(folder / f"{split}_x.npy", x)
            np.save(folder / f"{split}_y.npy", (x[:, :2] > 0).astype(np.float32))
    return Path(out)


class Accuracy(MetricAccumulator):
    """A task's native metric, accumulated over a split; it declares its direction."""

    higher_is_better = {"accuracy": True}

    def __init__(self) -> None:
        self.hits, self.count = 0.0, 0

    def update(self, prediction: Tensor, target: Tensor) -> None:
        self.hits += float(((prediction > 0).float() == target).sum())
        self.count += int(target.numel())

    def compute(self) -> dict[str, float]:
        return {"accuracy": self.hits / max(self.count, 1)}


class Side(Task):
    """One binary task: its loss, metrics, normalized score and audit score p_k."""

    def __init__(self, name: str) -> None:
        self.name = name

    def loss(self, prediction: Tensor, target: Tensor) -> Tensor:
        return nn.functional.binary_cross_entropy_with_logits(prediction, target)

    def new_metrics(self) -> MetricAccumulator:
        return Accuracy()

    def normalized_score(self, metrics: dict[str, float]) -> float:
        return metrics["accuracy"]  # higher is better, in [0, 1] (Worst and Macro use it)

    def audit_score(self, output: ModelOutput, batch: Batch) -> tuple[Tensor, Tensor]:
        score = torch.sigmoid(output.predictions[self.name])  # p_k(x) in [0, 1], (B,)
        return score, torch.ones_like(score, dtype=torch.bool)  # every example is valid


class ToyModel(MultiTaskModel):
    """A shared backbone (whose output is the shared representation) and one head per task."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
        self.heads = nn.ModuleDict({task: nn.Linear(8, 1) for task in TASKS})

    def forward(self, batch: Batch) -> ModelOutput:
        shared = self.backbone(batch["input"])
        predictions = {task: head(shared)[:, 0] for task, head in self.heads.items()}
        return ModelOutput(predictions=predictions, representation=shared)

    def shared_parameters(self) -> list[nn.Parameter]:
        return list(self.backbone.parameters())

    def last_shared_parameters(self) -> list[nn.Parameter]:  # GradNorm's W
        return list(self.backbone[0].parameters())


def load_toy(root: str | Path) -> Problem:
    """The reader: every split as tensors keyed by input, example_id and task."""
    splits = {}
    for split in ("train", "val", "test"):
        x = torch.from_numpy(np.load(Path(root) / f"{split}_x.npy"))
        y = torch.from_numpy(np.load(Path(root) / f"{split}_y.npy"))
        tensors = {"input": x, "example_id": torch.arange(len(x))}
        tensors.update({task: y[:, k] for k, task in enumerate(TASKS)})
        splits[split] = TensorSplit(tensors)
    return Problem("toy", [Side(task) for task in TASKS], splits, ToyModel)


BENCHMARK = Benchmark(
    load=load_toy,
    tasks=lambda: [Side(task) for task in TASKS],
    defaults=DatasetDefaults(
        dataset="toy",  # the name of `relif make-data toy` and `--dataset toy`
        seeds=1,
        backbone="mlp",
        batch_size=8,
        lr=1e-2,
        epochs=1,
        r_star=0.2,
        eta=1e-3,
        delta=0.1,  # the live validation Bias of the sweep's progress table
        delta_ref=0.1,  # the fixed-delta audit's threshold (None: relif report calibrates it)
        demo_data={"examples": 40},
        demo_train={"epochs": 1, "batch_size": 8, "lr": 1e-2, "seeds": 1, "methods": "erm"},
    ),
    synthetic=DataWriter(
        write=write_toy,
        help="toy two-task data",
        options=(
            WriterOption("examples", int, 40, "examples per split"),
            SEED_OPTION,  # --seed, as the built-in writers take it
        ),
    ),
)
