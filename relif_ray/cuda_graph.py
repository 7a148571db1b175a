"""The whole training step as one CUDA graph (`train.cuda_graph`).

PyTorch's whole-network capture (the CUDA Graphs section of its CUDA semantics notes) records
a step's kernels once and replays them with one launch, so the host no longer dispatches each
of a step's thousands of kernels (on the H100 about 13 ms of a 31 ms ResNet-50 step waited on
the host). What is captured here: the batch gathered from the resident train split at the
rows of a static index buffer, the forward (bf16 autocast without its weight cache, which
graphs cannot keep), the task losses, ReLiF, the method's backward, gradient clipping and the
fused optimiser's step with its state and learning rate on the device (`capturable=True`, the
rate a device tensor that the schedule fills in place, so schedules keep working), and the
step's trace row stacked into one device vector. BatchNorm's running statistics, ReLiF's
buffers and the method's buffers are updated in place inside the graph.

A capture that fails (an operation a graph cannot hold) is reported in one line and the trial
goes on with eager steps. Before capture `CAPTURE_WARMUP_STEPS` steps run eagerly on a side
stream (cuDNN picks its algorithms, the caching allocator settles, lazily made constants are
made); they are real training steps, so a graphed run trains the same steps as an eager one.
Each step afterwards copies its rows into the static index and replays. The per-step trace is
written into a device buffer that the engine reads once per `train_steps` call. Loading a
checkpoint replaces the optimiser's state tensors, which the graph refers to: the graph is
dropped and made again.

A method is captured whole only if it declares itself capturable (`MTLMethod.capturable`): its
step reads nothing from the host, keeps every state it changes in tensors updated in place, has
no `after_step` hook, and returns its task weights as device tensors or as constants. A method
that solves for its weights on the host from the K x K Gramian (FairGrad's and the TorchJD
methods' solvers, PCGrad's random task orders: `MTLMethod.splits_at_host_solve`) is captured
as two graphs around that solve (`SolvedGraphedStep`). The others (RLW's host generator, FAMO's
after-step hook, a representation-mode aggregator) stay eager, and the trial's log says why in
one line (`eager_reason`).

This module also holds what a graph asks of the run around it: when a step or the evaluation
forward can be graphed (`eager_reason`, `eval_graphs_hold`) and the optimiser a graph can step
(`capturable_optimizer_options`, `make_capturable`). The engine builds the step to replay and
hands it over; nothing here knows the engine.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from relif_ray.data.splits import Split, TensorSplit
from relif_ray.errors import first_line

if TYPE_CHECKING:
    from relif_ray.config import TrainConfig
    from relif_ray.methods.base import MTLMethod

LOGGER = logging.getLogger(__name__)
CAPTURE_WARMUP_STEPS = 3
"""Eager steps on a side stream before the capture (PyTorch's notes use 3)."""


def eager_reason(
    train: TrainConfig, device: torch.device, method: MTLMethod, train_split: Split
) -> str | None:
    """Why a run's steps stay eager under `train.cuda_graph: auto` (None: they are captured as
    one CUDA graph, or as two around the method's host solve); `off` is always eager. A graph
    needs a CUDA device, a method that is capturable or splits at its host solve, batches
    gathered on the device from a resident `TensorSplit`, and no torch.compile."""
    if train.cuda_graph == "off":
        return "train.cuda_graph is off"
    if device.type != "cuda":
        return "a CUDA graph needs a CUDA device"
    if not (method.capturable or method.splits_at_host_solve()):
        return f"method {method.name} {method.eager_reason}"
    if not (train.data_on_device and isinstance(train_split, TensorSplit)):
        return "its batches come from the host (train.data_on_device is false)"
    if train.compile:
        return "train.compile is on (torch.compile makes its own graphs)"
    return None


def eval_graphs_hold(train: TrainConfig, device: torch.device) -> bool:
    """Whether `train.eval_cuda_graph` can hold (`GraphedForward`): on CUDA, batches gathered
    on the device, the forward not compiled (torch.compile makes its own graphs)."""
    on_device = device.type == "cuda" and train.data_on_device
    return train.eval_cuda_graph and on_device and not train.compile


def capturable_optimizer_options(lr: float, device: torch.device) -> dict[str, Any]:
    """The keyword arguments that let a fused torch optimiser step inside a CUDA graph:
    capturable, with the learning rate a float32 tensor on the device that the schedule fills
    in place (so a replayed step reads each epoch's rate)."""
    return {"lr": torch.tensor(lr, device=device), "capturable": True}


def make_capturable(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """An optimiser whose state was just loaded from a checkpoint made capturable again:
    `Optimizer.load_state_dict` restores the saved groups, so each group's `capturable` flag
    is set and its learning rate made a float32 device tensor again, as
    `capturable_optimizer_options` made them."""
    for group in optimizer.param_groups:
        group["capturable"] = True
        group["lr"] = torch.as_tensor(group["lr"], dtype=torch.float32).to(device)


def on_side_stream(function: Callable[[], Any], device: torch.device) -> Any:
    """`function()` run on a side stream that waits for the current one and is waited for
    (PyTorch's notes warm up a capture this way: the eager work before it stays off the
    stream the capture will use)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        result = function()
    torch.cuda.current_stream(device).wait_stream(side)
    return result


class GraphedStep:
    """A training step replayed from one CUDA graph (module docstring). It knows only what it
    replays: `update`, the step on the train split's rows at a device index (the batch
    gathered on the device, forward, losses, ReLiF, the method's backward, the optimiser's
    step) returning the step's trace row as tensors, and the `optimizer` it steps; whether a
    run's steps are graphed is `eager_reason`'s.

    capture=False runs the same static-buffer step without capturing it (on a CPU, in tests:
    everything here but the graph itself is checked against the eager step)."""

    def __init__(
        self,
        update: Callable[[Tensor], dict[str, Tensor]] | None,
        optimizer: torch.optim.Optimizer,
        batch_size: int,
        device: torch.device,
        capture: bool = True,
    ) -> None:
        self.update = update
        self.optimizer = optimizer
        self.device = device
        self.capture = capture
        self.index = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.warm = 0
        self.row: Tensor | None = None
        """The static output: the step's trace values on the device (`device_keys`, then lr)."""
        self.keys: list[str] = []
        self.device_keys: list[str] = []
        self.constants: dict[str, float] = {}
        self.buffer: Tensor | None = None
        self.filled = 0
        self.steps: list[int] = []

    def reset(self) -> None:
        """Forget the graph (its tensors are replaced): warm up and capture again."""
        self.graph, self.warm = None, 0

    def step(self, index: Tensor, number: int) -> None:
        """Training step `number` on the train split's rows `index` (a device tensor)."""
        self.index.copy_(index)
        if self.graph is None and (self.warm < CAPTURE_WARMUP_STEPS or not self.capture):
            self.warm += 1
            self._record(self._eager(), number)
            return
        if self.graph is None and not self._captured():
            self._record(self._body(), number)
            return
        self._replay()
        self._record(self.row, number)

    def _replay(self) -> None:
        self.graph.replay()

    def _captured(self) -> bool:
        """Capture the step; where an operation cannot be captured, say so in one line and
        train eagerly from here on. A failed capture ran none of the step's kernels (they are
        only recorded), so the step is then run eagerly with the same numbers."""
        try:
            self._capture()
        except RuntimeError as error:
            self.graph, self.capture = None, False
            reason = first_line(error)
            LOGGER.warning("train.cuda_graph auto: eager steps: the capture failed (%s)", reason)
            return False
        return True

    def _eager(self) -> Tensor:
        return on_side_stream(self._body, self.device) if self.capture else self._body()

    def _capture(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.row = self._body()

    def _body(self) -> Tensor:
        """The step on the static index: the batch gathered on the device, forward, losses,
        ReLiF, backward, clipping, the optimiser's step; the trace row as one vector."""
        return self._stacked(self.update(self.index))

    def _stacked(self, row: dict[str, Tensor]) -> Tensor:
        """A step's trace row as one device vector (`device_keys`, then the rate)."""
        if not self.keys:
            self._layout(row)
        values = [row[key].to(torch.float64).reshape(()) for key in self.device_keys]
        values.append(torch.as_tensor(self.optimizer.param_groups[0]["lr"]).double().reshape(()))
        return torch.stack(values)

    def _layout(self, row: dict[str, Tensor]) -> None:
        """Which trace values live on the device; the others (host tensors: a method's
        constant weights) are read once, here."""
        self.keys = list(row)
        self.device_keys = [key for key in row if row[key].device == self.device]
        self.constants = {
            key: float(value) for key, value in row.items() if key not in self.device_keys
        }

    def _record(self, row: Tensor, number: int) -> None:
        """Copy step `number`'s row into the trace buffer (on the device; grown as needed)."""
        if self.buffer is None or self.filled == len(self.buffer):
            grown = torch.empty((max(64, 2 * self.filled), len(row)), dtype=row.dtype,
                                device=row.device)  # fmt: skip
            if self.buffer is not None:
                grown[: self.filled].copy_(self.buffer[: self.filled])
            self.buffer = grown
        self.buffer[self.filled].copy_(row)
        self.filled += 1
        self.steps.append(number)

    def take_rows(self) -> list[dict[str, float]]:
        """The trace rows of the steps since the last call, read from the device at once, in
        the eager path's form: the method's and ReLiF's values, step, lr."""
        if self.filled == 0:
            return []
        values = self.buffer[: self.filled].cpu().tolist()
        rows = []
        for step, vector in zip(self.steps, values, strict=True):
            device = dict(zip(self.device_keys, vector, strict=False))
            row = {key: device[key] if key in device else self.constants[key] for key in self.keys}
            rows.append({**row, "step": float(step), "lr": vector[-1]})
        self.filled, self.steps = 0, []
        return rows


class SolvedGraphedStep(GraphedStep):
    """The step of a method that solves for its task weights on the host
    (`MTLMethod.splits_at_host_solve`: PCGrad, FairGrad, the TorchJD methods) as two CUDA
    graphs around that solve. The first replays `before` on the static index (the batch
    gathered on the device, forward, losses, ReLiF, the K per-task backward passes, the
    ReLiF term's backward, the Gramian G G^T) and returns the Gramian and what the second
    part needs; the host copies the K x K Gramian, runs `solve` (PCGrad's random orders,
    FairGrad's SciPy solve, a TorchJD QP) and copies the K weights into a static device
    vector; the second replays `after` (the update G^T c written back, clipping, the
    optimiser's step, the trace row). The Gramian's copy is the step's one wait for the
    device, as in an eager step; what the graphs save is the host's dispatch of every other
    kernel. Warm-up, fallback and trace are `GraphedStep`'s."""

    def __init__(
        self,
        parts: tuple[
            Callable[[Tensor], tuple[Tensor, Any]],
            Callable[[Tensor], Tensor],
            Callable[[Any, Tensor], dict[str, Tensor]],
        ],
        num_weights: int,
        optimizer: torch.optim.Optimizer,
        batch_size: int,
        device: torch.device,
        capture: bool = True,
    ) -> None:
        super().__init__(None, optimizer, batch_size, device, capture)
        self.before, self.solve, self.after = parts
        self.solved = torch.zeros(num_weights, dtype=torch.float64, device=device)
        """The static input of the second graph: the weights the host solved for."""
        self.before_graph: torch.cuda.CUDAGraph | None = None
        self.pending: tuple[Tensor, Any] | None = None
        """The first graph's static output: the Gramian, and what `after` reads."""

    def reset(self) -> None:
        super().reset()
        self.before_graph = None

    def _body(self) -> Tensor:
        gramian, pending = self.before(self.index)
        self.solved.copy_(self.solve(gramian.cpu()))
        return self._stacked(self.after(pending, self.solved))

    def _capture(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.before_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.before_graph):
            self.pending = self.before(self.index)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.row = self._stacked(self.after(self.pending[1], self.solved))

    def _replay(self) -> None:
        self.before_graph.replay()
        self.solved.copy_(self.solve(self.pending[0].cpu()))
        self.graph.replay()


class GraphedForward:
    """The evaluation forward replayed from CUDA graphs (`train.eval_cuda_graph`): one graph
    per batch size (a split's full batches and its last, shorter one), captured on the first
    batch of that size after one eager warm-up forward on a side stream. Each batch is copied
    into the graph's static input, the graph is replayed and its outputs are cloned (the
    evaluation keeps them, and the next replay overwrites the static ones). The model's
    parameters and buffers are read in place, so a graph stays valid as training changes
    them; it must be called in the mode it was captured in (eval, inference mode).

    capture=False runs the same static-buffer forward without capturing it (on a CPU, in
    tests: everything but the graph itself is checked against the eager forward)."""

    def __init__(self, forward: Callable[[dict], Any], capture: bool = True) -> None:
        self.forward = forward
        self.capture = capture
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph | None, dict, Any]] = {}
        """Batch size -> the graph, its static input batch and its static output."""

    def __call__(self, batch: dict[str, Tensor]) -> Any:
        size = len(batch["example_id"])
        if size not in self.graphs:
            self.graphs[size] = self._captured(batch)
        graph, static, output = self.graphs[size]
        for key, value in batch.items():
            static[key].copy_(value)
        if graph is None:
            return _cloned(self.forward(static))
        graph.replay()
        return _cloned(output)

    def _captured(self, batch: dict[str, Tensor]) -> tuple[torch.cuda.CUDAGraph | None, dict, Any]:
        static = {key: value.clone() for key, value in batch.items()}
        if not self.capture:
            return None, static, None
        # the warm-up: cuDNN's choices, lazily made constants
        on_side_stream(lambda: self.forward(static), batch["example_id"].device)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                output = self.forward(static)
        except RuntimeError as error:
            self.capture = False
            reason = first_line(error)
            LOGGER.warning("train.eval_cuda_graph: eager forwards: the capture failed (%s)", reason)
            return None, static, None
        return graph, static, output


def _cloned(value: Any) -> Any:
    """`value` with every tensor in it cloned (a model output's dataclass, dicts, None)."""
    if isinstance(value, Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: _cloned(item) for key, item in value.items()}
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(value, **{
            field.name: _cloned(getattr(value, field.name)) for field in dataclasses.fields(value)
        })  # fmt: skip
    return value
