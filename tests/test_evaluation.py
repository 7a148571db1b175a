"""Evaluation on the device (`relif_ray.evaluation`): the same numbers as the host path it
replaced (`relif_ray.testing.host_evaluation`) on the same model, no host synchronisation
inside its loop, and its split held on the device under the train split's rule."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from relif_ray.config import ExperimentConfig
from relif_ray.engine import TrainingRun
from relif_ray.evaluation import EvalResult
from relif_ray.tasks.base import count_bins
from relif_ray.testing.host_evaluation import host_evaluate
from tests.conftest import needs_cuda
from tests.host_sync import no_host_sync
from tests.test_fast_path import clinical_values, dense_values

FLOAT_SUMS_RTOL = 1e-12
"""The device path sums every pixel (zeros where invalid) where the host path summed only the
valid ones: the same float64 terms added in another order, which moves a sum of a few
thousand terms by a few float64 ulps, far below this tolerance."""


def trained_run(values: dict, **train: object) -> TrainingRun:
    """A run two steps in, evaluated in batches of 5 (several batches, the last one short)."""
    values["train"] = {**values["train"], "eval_batch_size": 5, **train}
    run = TrainingRun(ExperimentConfig.from_dict(values))
    run.train_steps(2)
    return run


def assert_same_metrics(ours: dict[str, float], theirs: dict[str, float]) -> None:
    assert ours.keys() == theirs.keys()
    for name, value in ours.items():
        assert value == pytest.approx(theirs[name], rel=FLOAT_SUMS_RTOL, nan_ok=True), name


def assert_same_outputs(ours: EvalResult, theirs: EvalResult) -> None:
    pd.testing.assert_frame_equal(ours.scores, theirs.scores)
    np.testing.assert_array_equal(ours.example_ids, theirs.example_ids)
    np.testing.assert_array_equal(ours.representations, theirs.representations)
    assert_same_metrics(ours.metrics, theirs.metrics)


def state(accumulator: object) -> dict[str, torch.Tensor]:
    """The sums and counts of a NYUv2 accumulator, as CPU tensors (the host path kept some
    as Python numbers: float64 and int64 tensors then)."""
    names = ("confusion", "sums", "count", "histogram", "angle_sum", "below")
    return {
        name: torch.as_tensor(value, dtype=torch.float64 if isinstance(value, float) else None)
        for name, value in vars(accumulator).items()
        if name in names
    }


def test_nyuv2_counts_are_exact_and_sums_equal_within_the_stated_tolerance(nyuv2_dir) -> None:
    run = trained_run(dense_values(nyuv2_dir))
    expected, host = host_evaluate(run)
    collector = run.collect("val")
    for task, accumulator in collector.accumulators.items():
        ours, theirs = state(accumulator), state(host[task])
        ours = {name: value.cpu() for name, value in ours.items()}
        assert ours.keys() == theirs.keys() and ours, task
        for name, value in ours.items():
            if value.is_floating_point():
                torch.testing.assert_close(value, theirs[name], rtol=FLOAT_SUMS_RTOL, atol=0)
            else:
                assert torch.equal(value, theirs[name]), (task, name)
    assert int(state(host["depth"])["count"]) > 0 and state(host["seg"])["confusion"].sum() > 0
    assert_same_outputs(collector.result(), expected)


def test_clinical_numbers_equal_the_host_path(tmp_path) -> None:
    run = trained_run(clinical_values(tmp_path))
    expected, host = host_evaluate(run)
    result = run.evaluate("val")
    assert_same_outputs(result, expected)
    assert not math.isnan(result.metrics["length_of_stay_kappa"])
    assert result.metrics == pytest.approx(expected.metrics, nan_ok=True)


def test_a_resident_split_gives_the_numbers_of_the_host_split(nyuv2_dir) -> None:
    host_run = trained_run(dense_values(nyuv2_dir))
    resident_run = trained_run(dense_values(nyuv2_dir), data_on_device=True)
    assert resident_run.split("val") is not host_run.problem.splits["val"]
    assert_same_outputs(resident_run.evaluate("val"), host_run.evaluate("val"))


def test_the_evaluation_loop_never_waits_for_the_device(nyuv2_dir, monkeypatch) -> None:
    """The whole loop over a resident split: index ranges made on the device, the batch
    gathered there, forward, metric accumulators, scores, representations; only `result`
    copies to the host."""
    run = trained_run(dense_values(nyuv2_dir), data_on_device=True)
    with no_host_sync(monkeypatch):
        collector = run.collect("val")
    assert len(collector.example_ids) == 3
    assert_same_outputs(collector.result(), run.evaluate("val"))


def test_clinical_accumulators_never_wait_for_the_device(tmp_path, monkeypatch) -> None:
    """Forward and accumulation of a clinical batch (the stays are gathered and padded on the
    host; their lengths stay there)."""
    run = trained_run(clinical_values(tmp_path))
    collector = run.collect("val")
    run.model.eval()
    split = run.problem.splits["val"]
    batch = run._to_device(split.batch(torch.arange(len(split))))
    with torch.inference_mode(), no_host_sync(monkeypatch, host_tensors=(batch["lengths"],)):
        collector.add(batch, run._forward(batch))
    assert collector.result().metrics.keys() == run.evaluate("val").metrics.keys()


def test_count_bins_counts_like_bincount() -> None:
    index = torch.tensor([3, 0, 3, 5, 5, 5])
    assert torch.equal(count_bins(index, 7), torch.bincount(index, minlength=7))
    assert count_bins(torch.zeros(0, dtype=torch.long), 3).tolist() == [0, 0, 0]
    # a mask leaves positions out, also those whose index is out of range (an ignored label)
    index, keep = torch.tensor([3, -4, 3, 9, 5]), torch.tensor([True, False, True, False, True])
    assert count_bins(index, 7, keep).tolist() == [0, 0, 0, 2, 0, 1, 0]


def test_the_guard_refuses_bincount(monkeypatch) -> None:
    """CUDA's bincount reads the largest index on the host: the CPU guard refuses it too."""
    with pytest.raises(AssertionError, match="host synchronisation"), no_host_sync(monkeypatch):
        torch.bincount(torch.tensor([1, 2]), minlength=4)


@needs_cuda
def test_cuda_evaluation_loop_never_synchronises(nyuv2_dir) -> None:
    """CUDA's own sync detector over the loop of a resident split; the numbers are the host
    path's on the same model (float sums at the stated tolerance)."""
    values = dense_values(nyuv2_dir, device="cuda")
    run = trained_run(values, data_on_device=True)
    expected, _ = host_evaluate(run)
    run.collect("val")  # cuDNN's first calls, allocator warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        collector = run.collect("val")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_same_outputs(collector.result(), expected)
