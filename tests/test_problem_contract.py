"""The contract every registered benchmark keeps, checked over the registry: a benchmark module
added to `relif_ray/problems/` (or found on RELIF_PROBLEMS_PATH) is checked without listing it.

For each: its synthetic writer's demo data loads; a batch carries the input, the example ids
and one target per task; the model predicts once per task; every audit score is one finite
value per example with a validity mask (in [0, 1] where the task says it is a probability);
the summed task loss is differentiable into the shared backbone; every native metric has a
declared direction; the squashed tasks are exactly the non-probability ones.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from relif_ray.config import ExperimentConfig
from relif_ray.problems import Benchmark, Problem, benchmarks
from relif_ray.sweep.trial_config import apply_overrides

BATCH = 4


def demo_model_config(described: Benchmark) -> ExperimentConfig:
    """The model of a `--demo` sweep of this benchmark (its demo budget and settings)."""
    defaults = described.defaults
    config = apply_overrides(ExperimentConfig().to_dict(), defaults.config)
    config = apply_overrides(config, defaults.demo_config)
    config["model"]["backbone"] = defaults.demo_train.get("backbone", defaults.backbone)
    return ExperimentConfig.from_dict(config)


@pytest.fixture(scope="module", params=sorted(benchmarks()))
def loaded(request, tmp_path_factory) -> tuple[Benchmark, Problem, ExperimentConfig]:
    described = benchmarks()[request.param]
    root = tmp_path_factory.mktemp(described.name) / "data"
    written = described.synthetic.write(
        root, overwrite=False, seed=0, **described.defaults.demo_data
    )
    torch.manual_seed(0)
    return described, described.load(str(written)), demo_model_config(described)


def test_splits_and_batches_carry_input_ids_and_one_target_per_task(loaded) -> None:
    described, problem, _ = loaded
    assert problem.name == described.name
    assert problem.task_names == [task.name for task in described.tasks()]
    assert len(set(problem.task_names)) == len(problem.task_names) >= 2
    assert {"train", "val"} <= set(problem.splits)
    for split in problem.splits.values():
        assert len(split) >= BATCH
        batch = split.batch(torch.arange(BATCH))
        assert {"input", "example_id", *problem.task_names} <= set(batch)
        assert batch["example_id"].shape == (BATCH,)
        assert all(value.shape[0] == BATCH for value in batch.values())


def test_one_prediction_per_task_and_audit_scores_in_shape_and_range(loaded) -> None:
    _, problem, config = loaded
    model = problem.build_model(config.model).eval()
    batch = problem.splits["val"].batch(torch.arange(BATCH))
    with torch.no_grad():
        output = model(batch)
    assert set(output.predictions) == set(problem.task_names)
    assert output.representation.shape[0] == BATCH and output.representation.dim() == 2
    for task in problem.tasks:
        score, valid = task.audit_score(output, batch)
        assert score.shape == valid.shape == (BATCH,), task.name
        assert valid.dtype == torch.bool, task.name
        assert torch.isfinite(score[valid]).all(), task.name
        if task.score_is_probability:
            assert ((score[valid] >= 0) & (score[valid] <= 1)).all(), task.name


def test_task_losses_are_differentiable_into_the_shared_backbone(loaded) -> None:
    _, problem, config = loaded
    model = problem.build_model(config.model).train()
    batch = problem.splits["train"].batch(torch.arange(BATCH))
    output = model(batch)
    losses = [task.loss(output.predictions[task.name], batch[task.name]) for task in problem.tasks]
    assert all(loss.dim() == 0 and torch.isfinite(loss) for loss in losses)
    torch.stack(losses).sum().backward()
    grads = [p.grad for p in model.shared_parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_every_native_metric_declares_its_direction(loaded) -> None:
    described, problem, config = loaded
    model = problem.build_model(config.model).eval()
    split = problem.splits["val"]
    batch = split.batch(torch.arange(len(split)))
    with torch.no_grad():
        output = model(batch)
    for task in problem.tasks:
        metrics = task.new_metrics()
        metrics.update(output.predictions[task.name], batch[task.name])
        computed = metrics.compute()
        assert set(computed) == set(metrics.higher_is_better), task.name
        score = task.normalized_score(computed)
        assert math.isnan(score) or 0.0 <= score <= 1.0, task.name
        for name in computed:
            assert f"{task.name}_{name}" in described.metric_directions
    for metric in described.report_metrics:
        assert metric.column in described.metric_directions


def test_squashed_tasks_are_the_tasks_whose_score_is_not_a_probability(loaded) -> None:
    described, problem, _ = loaded
    raw = {task.name for task in problem.tasks if not task.score_is_probability}
    assert described.squashed_tasks == raw


def test_the_built_in_benchmarks_are_registered() -> None:
    assert {"nyuv2", "mimic3", "eicu"} <= set(benchmarks())
    assert benchmarks()["nyuv2"].squashed_tasks == {"depth", "normal"}
    assert (benchmarks()["mimic3"].delta_ref, benchmarks()["eicu"].delta_ref) == (0.275, 0.06)


def test_data_readers_know_no_models_and_no_tasks() -> None:
    """data/ is the bottom layer: format readers and writers, importing neither models/ nor
    tasks/ (nor the problems composed on top of them)."""
    data = Path(__file__).resolve().parents[1] / "relif_ray" / "data"
    for path in data.glob("*.py"):
        text = path.read_text()
        for layer in ("relif_ray.models", "relif_ray.tasks", "relif_ray.problems"):
            assert layer not in text, (path.name, layer)
