"""The GPU fast path, checked on CPU: bf16 autocast, channels-last, torch.compile, compact data.

Every option must leave the science unchanged: losses, audit scores and ReLiF statistics in
fp32, the same numbers (channels-last, compact labels, compile) or close ones (bf16).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math

import numpy as np
import pytest
import torch

from relif_ray.config import ExperimentConfig
from relif_ray.engine import TrainingRun
from relif_ray.errors import UserError
from relif_ray.gpu_stack import channels_last_applies
from relif_ray.problems import Problem, TensorSplit, load_problem
from relif_ray.relif.regularizer import ReLiFRegularizer
from relif_ray.transfer import move_batch, resident_split
from tests.conftest import needs_cuda, tiny_config
from tests.host_sync import no_host_sync

RELIF = {"enabled": True, "warmup_steps": 0}


def make_run(
    root, relif: dict | None = None, problem: Problem | None = None, **train
) -> TrainingRun:
    values = tiny_config(root, **train)
    if relif is not None:
        values["relif"] = {**values["relif"], **relif}
    return TrainingRun(ExperimentConfig.from_dict(values), problem)


@pytest.fixture
def without_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN off for the test: channels-last CPU runs then take ATen's own convolutions, the
    same kernels on every CPU (oneDNN's channels-last backward corrupts the heap on CPUs
    without AVX-512, `relif_ray.gpu_stack.channels_last_applies`)."""
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)


def loss_rows(run: TrainingRun) -> list[list[float]]:
    """The task losses of every step."""
    return [[row[f"loss_{task}"] for task in ("seg", "depth", "normal")] for row in run.trace]


def test_speed_fields_are_validated(nyuv2_dir) -> None:
    for field, value, message in [
        ("precision", "fp16", "train.precision: must be one of"),
        ("channels_last", "yes", "train.channels_last: expected true/false"),
        ("compile", 1, "train.compile: expected true/false"),
        ("cudnn_benchmark", None, "train.cudnn_benchmark: expected true/false"),
        ("data_on_device", "yes", "train.data_on_device: expected true/false"),
    ]:
        with pytest.raises(UserError, match=message):
            ExperimentConfig.from_dict(tiny_config(nyuv2_dir, **{field: value}))
    defaults = ExperimentConfig().train
    assert (defaults.precision, defaults.channels_last, defaults.compile) == ("fp32", False, False)
    assert defaults.data_on_device is False


def test_bf16_runs_the_model_in_bf16_and_everything_after_it_in_fp32(
    nyuv2_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, set] = {"encoder": set(), "scores": set(), "representation": set()}
    original = ReLiFRegularizer.forward

    def recording_forward(self, scores, representation, is_probability):  # noqa: ANN001
        seen["scores"] |= {score.dtype for score, _ in scores.values()}
        seen["representation"].add(representation.dtype)
        return original(self, scores, representation, is_probability)

    monkeypatch.setattr(ReLiFRegularizer, "forward", recording_forward)
    fp32 = make_run(nyuv2_dir, RELIF, max_steps=3)
    bf16 = make_run(nyuv2_dir, RELIF, max_steps=3, precision="bf16")
    bf16.model.encoder.register_forward_hook(lambda _m, _i, out: seen["encoder"].add(out.dtype))
    fp32.train_steps(3)
    bf16.train_steps(3)
    assert seen == {
        "encoder": {torch.bfloat16},
        "scores": {torch.float32},
        "representation": {torch.float32},
    }
    assert all(math.isfinite(value) for row in bf16.trace for value in row.values())
    # the first step starts from the same weights: its losses agree to bf16 accuracy
    assert loss_rows(bf16)[0] == pytest.approx(loss_rows(fp32)[0], rel=3e-2)
    assert loss_rows(bf16)[0] != loss_rows(fp32)[0]  # ... and bf16 really was used
    result, reference = bf16.evaluate("val"), fp32.evaluate("val")
    assert result.scores["score"].dtype == "float32" and result.representations.dtype == "float32"
    assert all(math.isfinite(value) for value in result.metrics.values())
    assert result.metrics["macro"] == pytest.approx(reference.metrics["macro"], abs=0.05)
    assert bf16.model.encoder[0].weight.dtype == torch.float32  # weights and optimizer stay fp32


def in_float64(run: TrainingRun) -> TrainingRun:
    """The run with its model and every floating-point input in float64: the float32 paths'
    exact numbers, to float32's eyes (the ReLiF scale buffers stay float32, as stored)."""
    run.model.double()
    to_device = run._to_device
    run._to_device = lambda batch: {
        key: value.double() if value.is_floating_point() else value
        for key, value in to_device(batch).items()
    }
    return run


def first_step_error(run: TrainingRun, exact: TrainingRun) -> float:
    """The largest relative error of a run's first step against the float64 run's: each value
    of its trace row and each parameter's gradient (as one vector)."""
    trace = [
        abs(value - exact.trace[0][key]) / max(abs(exact.trace[0][key]), 1e-6)
        for key, value in run.trace[0].items()
    ]
    gradients = [
        float((ours.grad.double() - theirs.grad).norm() / theirs.grad.norm())
        for ours, theirs in zip(run.model.parameters(), exact.model.parameters(), strict=True)
    ]
    return max(trace + gradients)


def test_channels_last_stays_nchw_where_onednn_lacks_avx512(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    with caplog.at_level(logging.INFO, logger="relif_ray.gpu_stack"):
        assert channels_last_applies(True, cpu) is False
    assert "stays NCHW" in caplog.text and "AVX2" in caplog.text
    assert channels_last_applies(True, cuda) is True and channels_last_applies(False, cpu) is False
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert channels_last_applies(True, cpu) is True
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    assert channels_last_applies(True, cpu) is True


@pytest.mark.usefixtures("without_onednn")
def test_channels_last_gives_the_same_numbers(nyuv2_dir) -> None:
    """One step from the same weights, and an evaluation of the same weights: channels-last
    is as close to the exact (float64) numbers as the default layout, within 10x the default's
    own float32 error, measured here (float32 sums in another order; how large that error is
    depends on the CPU's kernels). The squash divides raw depth/normal scores by the ERM band
    width, which magnifies their rounding in tau; the evaluation compares the same weights,
    since one Adam step moves a weight whose gradient is near 0 by about lr, whatever its
    sign: rounding becomes an lr-sized difference there."""
    default = make_run(nyuv2_dir, RELIF, max_steps=1)
    channels_last = make_run(nyuv2_dir, RELIF, max_steps=1, channels_last=True)
    exact = in_float64(make_run(nyuv2_dir, RELIF, max_steps=1))
    seen_layouts = []
    channels_last.model.encoder.register_forward_pre_hook(
        lambda _m, args: seen_layouts.append(
            args[0].is_contiguous(memory_format=torch.channels_last)
        )
    )
    for run in (default, channels_last, exact):
        run.train_steps(1)
    assert seen_layouts and all(seen_layouts)
    assert channels_last.model.encoder[0].weight.is_contiguous(memory_format=torch.channels_last)
    own_error = max(first_step_error(default, exact), 1e-6)
    assert first_step_error(channels_last, exact) <= 10 * own_error
    weights = default.model.state_dict()
    for run in (channels_last, exact):
        run.model.load_state_dict(weights)  # copied into each run's layout and dtype
    result, expected, truth = (run.evaluate("val") for run in (channels_last, default, exact))
    scores = [np.asarray(r.scores["score"], dtype=np.float64) for r in (result, expected, truth)]
    own_error = max(np.abs(scores[1] - scores[2]).max(), 2**-24 * np.abs(scores[2]).max())
    assert np.abs(scores[0] - scores[2]).max() <= 10 * own_error
    # argmax may flip on a pixel whose two top logits tie to rounding: 1 pixel = 6.5e-5 here
    assert result.metrics == pytest.approx(expected.metrics, rel=1e-4, abs=1e-3)


def method_cases() -> list:
    """Every registered method in each of its gradient sources (skipped where its extra is
    not installed)."""
    from relif_ray.methods import METHODS
    from relif_ray.methods.registry import missing_requirements

    return [
        pytest.param(
            name,
            source,
            id=f"{name}-{source}",
            marks=[pytest.mark.skip(reason=f"needs {missing}")] if missing else [],
        )
        for name, cls in sorted(METHODS.items())
        for missing in [", ".join(missing_requirements(cls))]
        for source in cls.gradient_sources
    ]


@pytest.mark.usefixtures("without_onednn")
@pytest.mark.parametrize(("method", "source"), method_cases())
def test_every_method_leaves_gradients_in_the_layout_of_their_weights(
    tiny_encoders, nyuv2_dir, method: str, source: str
) -> None:
    """With channels-last weights, every .grad a method writes keeps its weight's strides, as
    autograd's own do: the fused optimiser (and Adam's moments, made like the weights) refuse
    a gradient of another layout. GPU check run 2 (an H100) found PCGrad and FairGrad writing
    contiguous gradients into channels-last convolutions."""
    values = tiny_config(nyuv2_dir, max_steps=1, channels_last=True)
    values["relif"] = {**values["relif"], **RELIF}
    values["method"] = {"name": method, "gradient_source": source}
    run = TrainingRun(ExperimentConfig.from_dict(values))
    layouts = {}
    optimizer_step = run.optimizer.step

    def step_recording_layouts(*args, **kwargs):
        for name, param in run.model.named_parameters():
            if param.grad is not None:
                layouts[name] = param.grad.stride() == param.stride()
        return optimizer_step(*args, **kwargs)

    run.optimizer.step = step_recording_layouts
    run.train_steps(1)
    assert run.model.encoder[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert layouts and [name for name, same in layouts.items() if not same] == []


@pytest.mark.slow
def test_compile_traces_the_model_and_changes_no_number(
    nyuv2_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.compile with a recording eager backend: dynamo must capture the model (dict in,
    dataclass out) and the run must give exactly the uncompiled numbers and checkpoint keys.
    Inductor's own C++ code generation takes ~90 s on a 2-core CPU, so it is not run here."""
    graphs = []

    def recording_backend(graph: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(graph)
        return graph.forward

    monkeypatch.setattr(
        torch, "compile", functools.partial(torch.compile, backend=recording_backend)
    )
    torch._dynamo.reset()
    plain = make_run(nyuv2_dir, RELIF, max_steps=2)
    compiled = make_run(nyuv2_dir, RELIF, max_steps=2, compile=True)
    plain.train_steps(2)
    compiled.train_steps(2)
    assert graphs, "the compiled forward was never traced"
    assert compiled.trace == plain.trace
    assert compiled.evaluate("val").metrics == plain.evaluate("val").metrics
    assert compiled.state_dict()["model"].keys() == plain.state_dict()["model"].keys()
    torch._dynamo.reset()


@pytest.mark.slow
def test_compile_relif_steps_through_the_compiled_regularizer_with_the_same_numbers(
    tiny_encoders, nyuv2_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`train.compile_relif`: every step calls the regularizer compiled as one graph (here
    through AOTAutograd, the graph inductor gets; inductor's C++ build is too slow for a 2-core
    CPU), with the uncompiled run's trace and checkpoint; off, the step calls the module."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    plain = make_run(nyuv2_dir, RELIF, max_steps=2)
    compiled = make_run(nyuv2_dir, RELIF, max_steps=2, compile_relif=True)
    assert plain.relif_step is plain.regularizer
    assert compiled.relif_step._orig_mod is compiled.regularizer
    plain.train_steps(2)
    compiled.train_steps(2)
    assert compiled.trace == plain.trace
    assert compiled.state_dict()["regularizer"].keys() == plain.state_dict()["regularizer"].keys()
    torch.compiler.reset()


def test_labels_are_held_as_int8_with_identical_numbers(tiny_encoders, nyuv2_dir) -> None:
    problem = load_problem(ExperimentConfig.from_dict(tiny_config(nyuv2_dir)).data)
    train = problem.splits["train"]
    assert isinstance(train, TensorSplit) and train.tensors["seg"].dtype == torch.int8
    wide = Problem(
        problem.name,
        problem.tasks,
        {
            name: TensorSplit({**split.tensors, "seg": split.tensors["seg"].long()})
            for name, split in problem.splits.items()
        },
        problem.model_factory,
    )
    compact_run = make_run(nyuv2_dir, RELIF, problem, max_steps=2)
    wide_run = make_run(nyuv2_dir, RELIF, wide, max_steps=2)
    compact_run.train_steps(2)
    wide_run.train_steps(2)
    assert compact_run.trace == wide_run.trace
    compact, reference = compact_run.evaluate("val"), wide_run.evaluate("val")
    assert compact.metrics == reference.metrics
    assert compact.scores.equals(reference.scores)


def test_the_data_set_is_read_once_per_process(
    tiny_encoders, nyuv2_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trials run one after another in a reused Ray actor (and every step of each) share the
    tensors read by the first: the reader runs once per worker process."""
    import relif_ray.problems as problem_module

    reads: list[str] = []
    nyuv2 = problem_module.benchmarks()["nyuv2"]
    reader = nyuv2.load

    def counting_reader(root: str) -> Problem:
        reads.append(root)
        return reader(root)

    monkeypatch.setitem(
        problem_module.benchmarks(), "nyuv2", dataclasses.replace(nyuv2, load=counting_reader)
    )
    problem_module._cached_problem.cache_clear()
    try:
        first = make_run(nyuv2_dir, RELIF, max_steps=2)
        first.train_steps(2)
        second = make_run(nyuv2_dir, None, max_steps=2)
        second.train_steps(2)
    finally:
        problem_module._cached_problem.cache_clear()
    assert reads == [str(nyuv2_dir)]
    assert first.problem is second.problem


def test_data_on_device_gives_the_same_batches_and_numbers_also_after_resume(
    tiny_encoders, nyuv2_dir
) -> None:
    """Held "on the device" (the CPU here) the train split gives the same batches in the same
    order across an epoch boundary (4 steps per epoch), so the same trace, metrics and
    checkpointed continuation as the host path; the optimiser is torch's fused one on the CPU
    too."""
    host = make_run(nyuv2_dir, RELIF, max_steps=6)
    resident = make_run(nyuv2_dir, RELIF, max_steps=6, data_on_device=True)
    assert host.optimizer.defaults["fused"] is True and resident.steps_per_epoch == 4
    batches = []
    for run in (host, resident):
        run.train_steps(3)
        batches.append(run._train_batch())
        run.train_steps(3)
    assert batches[0].keys() == batches[1].keys()
    assert all(torch.equal(batches[0][key], batches[1][key]) for key in batches[0])
    assert resident.trace == host.trace and len(host.trace) == 6
    assert resident.evaluate("val").metrics == host.evaluate("val").metrics
    interrupted = make_run(nyuv2_dir, RELIF, max_steps=6, data_on_device=True)
    interrupted.train_steps(3)
    resumed = make_run(nyuv2_dir, RELIF, max_steps=6, data_on_device=True)
    resumed.load_state_dict(interrupted.state_dict())
    resumed.train_steps(3)
    assert resumed.trace == host.trace


def test_data_on_device_refuses_variable_length_sequences(tmp_path) -> None:
    values = clinical_values(tmp_path)
    values["train"]["data_on_device"] = True
    with pytest.raises(UserError, match=r"^config field train.data_on_device: the mimic3 train"):
        TrainingRun(ExperimentConfig.from_dict(values))


def test_resident_split_moves_all_but_the_host_keys_once() -> None:
    split = TensorSplit({"input": torch.rand(4, 3), "lengths": torch.arange(4)})
    resident = resident_split(split, torch.device("meta"))
    assert resident.tensors["input"].is_meta and resident.tensors["lengths"].device.type == "cpu"
    assert resident_split(split, torch.device("meta")) is resident  # copied once per process
    assert split.tensors["input"].device.type == "cpu"


def test_move_batch_keeps_values_and_dtypes() -> None:
    batch = {"input": torch.rand(2, 3), "seg": torch.tensor([[-1, 12]], dtype=torch.int8)}
    moved = move_batch(batch, torch.device("cpu"))
    assert all(torch.equal(moved[key], batch[key]) for key in batch)
    assert moved["seg"].dtype == torch.int8


def test_the_guard_catches_host_synchronisation(monkeypatch: pytest.MonkeyPatch) -> None:
    values = torch.tensor([0.5, -1.0, 2.0])
    attempts = [
        lambda: values.sum().item(),
        lambda: bool(values.sum() > 0),
        lambda: float(values.max()),
        lambda: values[values > 0],
        lambda: values[[0, 2]],
        lambda: torch.tensor([0.1, 0.9]),
        lambda: values.cpu(),
        lambda: values.tolist(),
    ]
    for attempt in attempts:
        with (
            pytest.raises(AssertionError, match="host synchronisation"),
            no_host_sync(monkeypatch),
        ):
            attempt()


def dense_values(root, method: str = "erm", relif: bool = True, **top: object) -> dict:
    values = tiny_config(root)
    values["method"] = {"name": method}
    values["relif"] = {**values["relif"], **RELIF, "enabled": relif}
    return {**values, **top}


def clinical_values(root, **top: object) -> dict:
    from relif_ray.data.synthetic_mimic3 import write_synthetic_mimic3

    data = write_synthetic_mimic3(root / "mimic3", patients=12, seed=0)
    return {
        "data": {"dataset": "mimic3", "root": str(data)},
        "model": {"hidden_size": 8},
        "train": {"epochs": 1, "batch_size": 4},
        "relif": RELIF,
        **top,
    }


def warm_run_and_batch(values: dict) -> tuple[TrainingRun, dict[str, torch.Tensor]]:
    """A run one step in (scales, squash bounds, controller, GradNorm's L(0) are set) and its
    next batch, already on the device."""
    run = TrainingRun(ExperimentConfig.from_dict(values))
    run.train_steps(1)
    return run, run._train_batch()


@pytest.mark.parametrize(
    ("method", "relif"),
    [
        ("erm", True),
        ("uncertainty", True),
        ("gradnorm", True),
        ("erm", False),
        ("dwa", True),
        ("rlw", True),
        ("famo", True),
        ("dbmtl", True),
    ],
)
def test_a_dense_training_step_never_waits_for_the_device(
    tiny_encoders, nyuv2_dir, monkeypatch: pytest.MonkeyPatch, method: str, relif: bool
) -> None:
    """Forward, task losses (masked depth/normal means), audit scores, ReLiF, the method's
    backward and its hooks after the step (FAMO's re-evaluation, DWA's epoch means): no
    operation that would sync on CUDA."""
    run, batch = warm_run_and_batch(dense_values(nyuv2_dir, method, relif))
    with no_host_sync(monkeypatch):
        row = run._backward(batch)
        run.method.after_step(lambda: run._updated_losses(batch))
        run.method.end_epoch()
    assert all(value.grad is not None for value in run.model.shared_parameters())
    assert {"loss_seg", "loss_depth", "loss_normal"} <= set(row)


def test_device_resident_batches_never_wait_for_the_device(
    tiny_encoders, nyuv2_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `train.data_on_device` a step's batch is a slice of the epoch's permutation and a
    gather on the device, the next epoch's permutation one copy: no host synchronisation,
    mid-epoch and at the epoch boundary alike (4 steps per epoch)."""
    values = dense_values(nyuv2_dir)
    values["train"]["data_on_device"] = True
    run = TrainingRun(ExperimentConfig.from_dict(values))
    run.train_steps(1)
    with no_host_sync(monkeypatch):
        for _ in range(4):
            run._backward(run._train_batch())
            run.step += 1
    assert run.epoch == 1 and run._order[0] == 1


def test_a_clinical_training_step_never_waits_for_the_device(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The LSTM packs with lengths that stayed on the host (transfer.HOST_KEYS)."""
    run, batch = warm_run_and_batch(clinical_values(tmp_path))
    with no_host_sync(monkeypatch, host_tensors=(batch["lengths"],)):
        row = run._backward(batch)
    assert "loss_mortality" in row and run.model.lstm.weight_hh_l0.grad is not None


def test_host_keys_stay_on_the_host() -> None:
    batch = {"input": torch.rand(2, 5, 3), "lengths": torch.tensor([5, 2])}
    moved = move_batch(batch, torch.device("meta"))
    assert moved["input"].is_meta and moved["lengths"].device.type == "cpu"


@needs_cuda
def test_cuda_batches_come_from_pinned_memory_without_blocking() -> None:
    batch = {"input": torch.rand(2, 3, 8, 8), "example_id": torch.arange(2)}
    moved = move_batch(batch, torch.device("cuda"))
    torch.cuda.synchronize()
    assert all(
        value.is_cuda and torch.equal(value.cpu(), batch[key]) for key, value in moved.items()
    )


@needs_cuda
def test_cuda_relif_step_never_synchronises() -> None:
    """CUDA's own sync detector: any host synchronisation in the regularizer raises. The first
    call is not checked: it builds the per-task squash flags on the device once per run
    (`ReLiFRegularizer._squashed_rows`, one host-to-device copy), as the engine's first step
    does; every later step must not wait."""
    regularizer = ReLiFRegularizer(ExperimentConfig().relif, ["a", "b"]).cuda()
    generator = torch.Generator(device="cuda").manual_seed(0)
    for check, valid_b in ((False, True), (True, True), (True, False)):
        scores = {
            "a": (
                torch.rand(6, device="cuda", generator=generator),
                torch.ones(6, dtype=torch.bool, device="cuda"),
            ),
            "b": (
                torch.rand(6, device="cuda", generator=generator),
                torch.full((6,), valid_b, device="cuda"),
            ),
        }
        representation = torch.randn(6, 4, device="cuda", generator=generator, requires_grad=True)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error" if check else "default")
        try:
            loss, _ = regularizer(scores, representation, {"a": True, "b": True})
            loss.backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")


@needs_cuda
def test_cuda_device_resident_steps_never_synchronise(nyuv2_dir) -> None:
    """CUDA's own sync detector over whole steps (batch gathered on the GPU, forward, ReLiF,
    backward, the fused optimiser's step), across an epoch boundary; the batches are those of
    the host path."""
    values = dense_values(nyuv2_dir, device="cuda")
    values["train"]["data_on_device"] = True
    run = TrainingRun(ExperimentConfig.from_dict(values))
    host = TrainingRun(ExperimentConfig.from_dict(dense_values(nyuv2_dir, device="cuda")))
    assert run.optimizer.defaults["fused"] is True
    assert all(value.is_cuda for value in run.train_split.tensors.values())
    run._train_step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(4):
            batch = run._train_batch()
            run._train_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    host.step = run.step - 1
    expected = host._train_batch()
    assert all(torch.equal(batch[key], expected[key]) for key in expected)


@needs_cuda
@pytest.mark.parametrize("dataset", ["nyuv2", "mimic3"])
def test_cuda_training_step_never_synchronises(nyuv2_dir, tmp_path, dataset: str) -> None:
    """CUDA's own sync detector over a whole ERM + ReLiF step but the optimiser's."""
    if dataset == "nyuv2":
        values = dense_values(nyuv2_dir, device="cuda")
    else:
        values = clinical_values(tmp_path, device="cuda")
    run, batch = warm_run_and_batch(values)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run._backward(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
