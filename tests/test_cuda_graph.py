"""The whole training step as one CUDA graph (`relif_ray.cuda_graph`, `train.cuda_graph`).

On the CPU: when a trial's steps are captured and why not (`eager_reason`), every registered
method's declaration (a capturable one keeps its state in tensors changed in place, reads
nothing from the host and has no after-step hook; the others say why in one line), and the
graphed step's plumbing run without the capture itself (static index, trace buffer, learning
rate as a tensor filled by the schedule, resume), which must give the eager step's numbers
bit for bit; for a method that solves on the host, the two parts around its solve. On CUDA
(CUDA-only tests): 10 graphed steps against 10 eager steps from one state, also with the
regularizer compiled (`train.compile_relif`) and for methods graphed around their host solve,
a graphed run resumed from its checkpoint, and the evaluation forward from CUDA graphs
(`train.eval_cuda_graph`; its plumbing is checked on the CPU too).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from relif_ray.config import ExperimentConfig
from relif_ray.cuda_graph import (
    CAPTURE_WARMUP_STEPS,
    GraphedForward,
    GraphedStep,
    SolvedGraphedStep,
    eager_reason,
)
from relif_ray.data.splits import TensorSplit
from relif_ray.engine import TrainingRun
from relif_ray.methods import METHODS, MTLMethod
from relif_ray.methods.registry import missing_requirements
from relif_ray.schedule import build_lr_scheduler
from relif_ray.testing.runs import largest_relative_difference
from tests.conftest import needs_cuda, tiny_resnets
from tests.host_sync import no_host_sync
from tests.test_fast_path import dense_values

CAPTURABLE = sorted(name for name, cls in METHODS.items() if cls.capturable)
HOST_SOLVING = sorted(
    name
    for name, cls in METHODS.items()
    if cls.splits_at_host_solve is not MTLMethod.splits_at_host_solve
)
"""The methods whose steps split at a host solve (with parameter gradients): graphed as two
CUDA graphs around it (`SolvedGraphedStep`)."""


def reason_of(
    method: str = "erm", device: str = "cuda", source: str = "parameters", **train: object
) -> str | None:
    """`eager_reason` of what a run would give it, without building one (no CUDA here)."""
    fields = {"cuda_graph": "auto", "data_on_device": True, "compile": False, **train}
    return eager_reason(
        SimpleNamespace(**fields),
        torch.device(device),
        METHODS[method](["a", "b"], gradient_source=source),
        TensorSplit({"example_id": torch.arange(4)}),
    )


REPRESENTATION = "representation"


@pytest.mark.parametrize(
    ("method", "device", "train", "reason"),
    [
        ("erm", "cuda", {}, None),
        ("uncertainty", "cuda", {}, None),
        ("fairgrad", "cuda", {}, None),
        ("pcgrad", "cuda", {}, None),
        ("erm", "cpu", {}, "a CUDA graph needs a CUDA device"),
        ("erm", "cuda", {"cuda_graph": "off"}, "train.cuda_graph is off"),
        ("rlw", "cuda", {}, "method rlw draws its task weights on the host"),
        ("pcgrad", "cuda", {"source": REPRESENTATION}, "method pcgrad uses the representation"),
        ("famo", "cuda", {}, "method famo re-evaluates the batch"),
        ("erm", "cuda", {"data_on_device": False}, "its batches come from the host"),
        ("pcgrad", "cuda", {"data_on_device": False}, "its batches come from the host"),
        ("erm", "cuda", {"compile": True}, "train.compile is on"),
    ],
)
def test_when_a_step_is_captured_and_why_not(method, device, train, reason) -> None:
    found = reason_of(method, device, **train)
    assert found == reason if reason is None else found.startswith(reason)


def test_every_method_declares_whether_it_is_capturable() -> None:
    """A capturable method has no after-step hook (it would run outside the graph); a method
    that splits at its host solve is a gradient aggregator with parameter gradients; every
    other method, and an aggregator in representation mode, says in one line why its steps
    stay eager."""
    assert {"erm", "uncertainty", "dwa", "gradnorm"} <= set(CAPTURABLE)
    assert {"fairgrad", "pcgrad", "upgrad", "nashmtl"} <= set(HOST_SOLVING)
    assert not set(CAPTURABLE) & set(HOST_SOLVING)
    for name, cls in METHODS.items():
        if cls.capturable:
            assert cls.after_step is MTLMethod.after_step, name
        else:
            reason = cls.eager_reason
            assert reason and "\n" not in reason and reason != MTLMethod.eager_reason, name
        if name in HOST_SOLVING:
            assert cls.after_step is MTLMethod.after_step, name
            assert cls.end_epoch is MTLMethod.end_epoch, name
            if REPRESENTATION in cls.gradient_sources and not missing_requirements(cls):
                method = cls(["a", "b"], gradient_source=REPRESENTATION)
                assert not method.splits_at_host_solve(), name


def tensor_state(module: torch.nn.Module) -> dict[str, object]:
    """Every tensor a module holds (parameters, buffers, tensor attributes), by name, and
    every other attribute's value: what a graph captured once must find unchanged."""
    found: dict[str, object] = {}
    for prefix, child in module.named_modules():
        for name, value in vars(child).items():
            if name.startswith("_") or isinstance(value, torch.nn.Module):
                continue
            found[f"{prefix}.{name}"] = value
        found.update({f"{prefix}.{n}": v for n, v in child.named_parameters(recurse=False)})
        found.update({f"{prefix}.{n}": v for n, v in child.named_buffers(recurse=False)})
    return found


def assert_changed_in_place(before: dict, after: dict, what: str) -> None:
    assert before.keys() == after.keys(), what
    for name, value in before.items():
        if isinstance(value, torch.Tensor):
            assert after[name] is value, f"{what}: {name} was replaced, not changed in place"
        elif not callable(value):
            assert after[name] == value, f"{what}: {name} changed on the host"


@pytest.mark.parametrize("method", CAPTURABLE)
def test_a_capturable_method_changes_its_state_in_place_and_never_reads_the_host(
    nyuv2_dir, monkeypatch, method: str
) -> None:
    """Two steps and an epoch's end after a warm-up step: the method's and ReLiF's tensors are
    the same objects (their values change), no host-side attribute changes, and the steps
    never wait for the device."""
    if missing_requirements(METHODS[method]):
        pytest.skip(f"{method} needs {missing_requirements(METHODS[method])}")
    values = dense_values(nyuv2_dir, method)
    values["train"]["data_on_device"] = True  # as a graphed trial's
    with tiny_resnets():
        run = TrainingRun(ExperimentConfig.from_dict(values))
    run.train_steps(1)
    before = {"method": tensor_state(run.method), "relif": tensor_state(run.regularizer)}
    with no_host_sync(monkeypatch):
        for _ in range(2):
            run._backward(run._train_batch())
            run.step += 1
        run.method.end_epoch()
    after = {"method": tensor_state(run.method), "relif": tensor_state(run.regularizer)}
    for part in before:
        assert_changed_in_place(before[part], after[part], f"{method} ({part})")


@pytest.mark.parametrize("method", ["pcgrad", "fairgrad", "upgrad", "nashmtl"])
def test_a_host_solving_methods_step_reads_the_host_only_in_its_solve(
    nyuv2_dir, monkeypatch, method: str
) -> None:
    """The parts before and after the solve (what the two graphs hold) never wait for the
    device, with ReLiF on; only the solve reads the K x K Gramian. A warm-up step first (the
    ReLiF scales and squash are set in it)."""
    if missing_requirements(METHODS[method]):
        pytest.skip(f"{method} needs {missing_requirements(METHODS[method])}")
    values = dense_values(nyuv2_dir, method)
    values["train"]["data_on_device"] = True
    with tiny_resnets():
        run = TrainingRun(ExperimentConfig.from_dict(values))
    run.train_steps(1)
    index = run._train_index()
    with no_host_sync(monkeypatch):
        gramian, pending = run._before_solve(index)
    solved = run.method.solve(gramian.cpu())
    with no_host_sync(monkeypatch):
        row = run._after_solve(pending, solved)
    assert gramian.shape == (3, 3) and torch.all(torch.diagonal(gramian) > 0)
    assert {f"weight_{name}" for name in run.problem.task_names} <= row.keys()


def graph_ready_run(values: dict) -> TrainingRun:
    """A CPU run with the optimiser a graphed trial gets (capturable, the learning rate a
    tensor) and its data on the device, eager; its encoder is the tiny ResNet
    (`tests.conftest.tiny_resnet`): the plumbing is the same for any model, and
    ResNet-18's 11M parameters would cost each step's gradients and Adam step."""
    values["train"] = {**values["train"], "data_on_device": True, "epochs": 3}
    values["train"].update(scheduler="step", scheduler_step_size=1, scheduler_gamma=0.5)
    with tiny_resnets():
        run = TrainingRun(ExperimentConfig.from_dict(values))
    run.optimizer = run._build_optimizer(graph=True)
    run.lr_scheduler = build_lr_scheduler(run.optimizer, run.config.train, 3)
    return run


@pytest.mark.parametrize("method", ["erm", "dwa", "pcgrad", "fairgrad", "nashmtl"])
@pytest.mark.slow
def test_the_graphed_steps_plumbing_gives_the_eager_numbers_on_the_cpu(nyuv2_dir, method) -> None:
    """The static-index step with its trace buffer, run without capturing (CPU), over two
    epoch boundaries (the step schedule halves the rate each epoch, filling the rate tensor),
    gives the eager step's trace and weights bit for bit, also across a resume. For a
    method that solves on the host, the two parts around the solve, with the solved weights
    in their static device vector (PCGrad's random orders, FairGrad's SciPy solve, Nash-MTL's
    state and its bound on the update)."""
    if missing_requirements(METHODS[method]):
        pytest.skip(f"{method} needs {missing_requirements(METHODS[method])}")
    eager = graph_ready_run(dense_values(nyuv2_dir, method))
    eager.train_steps(10)
    graphed = graph_ready_run(dense_values(nyuv2_dir, method))
    graphed.graphed = graphed.graphed_step(capture=False)
    graphed.train_steps(4)
    state = graphed.state_dict()
    resumed = graph_ready_run(dense_values(nyuv2_dir, method))
    resumed.graphed = resumed.graphed_step(capture=False)
    resumed.load_state_dict(state)
    resumed.train_steps(6)
    kind = SolvedGraphedStep if method in HOST_SOLVING else GraphedStep
    assert type(graphed.graphed) is kind and type(resumed.graphed) is kind
    assert [row["lr"] for row in eager.trace][::4] == pytest.approx([1e-3, 5e-4, 2.5e-4])
    for run in (graphed, resumed):
        assert list(run.trace[0]) == list(eager.trace[0])
    assert resumed.trace == eager.trace
    for ours, theirs in zip(resumed.model.parameters(), eager.model.parameters(), strict=True):
        assert torch.equal(ours, theirs)


def assert_same_evaluation(ours, theirs, tolerance: float = 0.0) -> None:
    assert ours.metrics.keys() == theirs.metrics.keys()
    for key, value in ours.metrics.items():
        assert value == pytest.approx(theirs.metrics[key], rel=tolerance, nan_ok=True), key
    pd.testing.assert_frame_equal(ours.scores, theirs.scores, rtol=tolerance, atol=0.0)
    np.testing.assert_allclose(ours.representations, theirs.representations, rtol=tolerance)
    np.testing.assert_array_equal(ours.example_ids, theirs.example_ids)


def test_the_graphed_evaluation_forwards_plumbing_gives_the_eager_result_on_the_cpu(
    nyuv2_dir,
) -> None:
    """The evaluation forward from static inputs with cloned outputs, without capturing (CPU),
    over a split whose last batch is shorter (12 images in batches of 5): one static input per
    batch size, and the eager forward's metrics, scores and representations bit for bit, also
    after more training (the graphs read the parameters in place)."""
    values = dense_values(nyuv2_dir)
    values["train"].update(data_on_device=True, eval_batch_size=5)
    with tiny_resnets():
        run = TrainingRun(ExperimentConfig.from_dict(values))
    assert run.eval_forward == run._forward  # off by default
    graphed = GraphedForward(run._forward, capture=False)
    for steps in (1, 2):
        run.train_steps(steps)
        eager = run.evaluate("val")
        run.eval_forward = graphed
        assert_same_evaluation(run.evaluate("val"), eager)
        run.eval_forward = run._forward
    assert sorted(graphed.graphs) == [2, 5]


def test_the_trace_buffer_grows_and_is_read_once_per_call(nyuv2_dir) -> None:
    run = graph_ready_run(dense_values(nyuv2_dir))
    run.graphed = run.graphed_step(capture=False)
    for _ in range(3):
        run.graphed.step(run._train_index(), run.step)
        run.step += 1
    assert run.graphed.filled == 3 and run.graphed.buffer.shape[0] >= 3
    rows = run.graphed.take_rows()
    assert [row["step"] for row in rows] == [0.0, 1.0, 2.0] and run.graphed.filled == 0
    assert all(math.isfinite(row["loss_seg"]) for row in rows)


# --- on CUDA ------------------------------------------------------------------------------


def cuda_values(nyuv2_dir, cuda_graph: str) -> dict:
    values = dense_values(nyuv2_dir, device="cuda")
    values["train"].update(data_on_device=True, cuda_graph=cuda_graph, epochs=4)
    return values


def trained(values: dict, steps: int, state: dict | None = None) -> TrainingRun:
    run = TrainingRun(ExperimentConfig.from_dict(values))
    if state is not None:
        run.load_state_dict(state)
    run.train_steps(steps)
    return run


@needs_cuda
def test_cuda_graphed_steps_match_eager_steps_within_the_eager_paths_own_spread(
    nyuv2_dir,
) -> None:
    """From one state (2 eager steps in), 10 steps graphed and 10 eager (eager twice). CUDA is
    not bitwise repeatable (atomic adds in some backward kernels), so the tolerance is the
    eager path's own run-to-run difference, times 10, and at least 1e-5 relative."""
    start = trained(cuda_values(nyuv2_dir, "off"), 2).state_dict()
    eager = [trained(cuda_values(nyuv2_dir, "off"), 10, start) for _ in range(2)]
    graphed = trained(cuda_values(nyuv2_dir, "auto"), 10, start)
    assert graphed.graphed is not None and graphed.graphed.graph is not None
    assert graphed.graphed.warm == CAPTURE_WARMUP_STEPS
    spread = largest_relative_difference(eager[0], eager[1])
    tolerance = max(10 * spread, 1e-5)
    assert largest_relative_difference(graphed, eager[0]) <= tolerance


@needs_cuda
@pytest.mark.parametrize("method", ["pcgrad", "nashmtl"])
def test_cuda_graphs_around_a_host_solve_match_eager_steps(nyuv2_dir, method: str) -> None:
    """PCGrad (random orders drawn on the host) and Nash-MTL (a convex solve and a bound
    applied on the device) graphed as two CUDA graphs around their solve: 10 steps from one
    state against 10 eager steps, within the eager path's own spread as above."""
    if missing_requirements(METHODS[method]):
        pytest.skip(f"{method} needs {missing_requirements(METHODS[method])}")
    values = {**cuda_values(nyuv2_dir, "off"), "method": {"name": method}}
    start = trained(values, 2).state_dict()
    eager = [trained(values, 10, start) for _ in range(2)]
    graphed = trained({**values, "train": {**values["train"], "cuda_graph": "auto"}}, 10, start)
    assert isinstance(graphed.graphed, SolvedGraphedStep)
    assert graphed.graphed.graph is not None and graphed.graphed.before_graph is not None
    tolerance = max(10 * largest_relative_difference(eager[0], eager[1]), 1e-5)
    assert largest_relative_difference(graphed, eager[0]) <= tolerance


@needs_cuda
def test_cuda_graph_captures_the_compiled_regularizer_with_the_eager_numbers(nyuv2_dir) -> None:
    """`train.compile_relif` in the graphed step: inductor's kernels, compiled in the eager
    warm-up steps, captured with the rest. From one state, 10 such steps against 10 eager
    uncompiled ones, within the tolerance of the graphed steps (fused kernels round
    differently; CUDA's atomic adds differ between two eager runs)."""
    start = trained(cuda_values(nyuv2_dir, "off"), 2).state_dict()
    eager = [trained(cuda_values(nyuv2_dir, "off"), 10, start) for _ in range(2)]
    values = cuda_values(nyuv2_dir, "auto")
    values["train"]["compile_relif"] = True
    compiled = trained(values, 10, start)
    assert compiled.graphed is not None and compiled.graphed.graph is not None
    assert compiled.relif_step is not compiled.regularizer
    tolerance = max(10 * largest_relative_difference(eager[0], eager[1]), 1e-5)
    assert largest_relative_difference(compiled, eager[0]) <= tolerance
    torch.compiler.reset()


@needs_cuda
def test_cuda_graphed_evaluation_gives_the_eager_evaluation(nyuv2_dir) -> None:
    """`train.eval_cuda_graph` on CUDA: the validation split (a shorter last batch) through
    the captured forwards, after 2 and after 4 training steps, against the eager forward of
    the same run: the same kernels replayed, so equal within float32's rounding."""
    values = cuda_values(nyuv2_dir, "auto")
    values["train"].update(eval_cuda_graph=True, eval_batch_size=5)
    run = trained(values, 2)
    assert isinstance(run.eval_forward, GraphedForward)
    for _ in range(2):
        graphed = run.evaluate("val")
        forward, run.eval_forward = run.eval_forward, run._forward
        assert_same_evaluation(graphed, run.evaluate("val"), tolerance=1e-5)
        run.eval_forward = forward
        run.train_steps(2)
    assert all(graph is not None for graph, _, _ in run.eval_forward.graphs.values())


@needs_cuda
def test_cuda_graphed_run_resumes_with_its_uninterrupted_numbers(nyuv2_dir) -> None:
    """A graphed run checkpointed after 5 steps and resumed (the graph is captured again)
    ends where an uninterrupted graphed run ends, within the spread of two such runs."""
    values = cuda_values(nyuv2_dir, "auto")
    whole = [trained(values, 10) for _ in range(2)]
    first = trained(values, 5)
    resumed = trained(values, 5, first.state_dict())
    assert resumed.graphed.graph is not None
    tolerance = max(10 * largest_relative_difference(whole[0], whole[1]), 1e-5)
    assert largest_relative_difference(resumed, whole[0]) <= tolerance
