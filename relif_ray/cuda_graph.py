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

A method is captured only if it declares itself capturable (`MTLMethod.capturable`): its step
reads nothing from the host, keeps every state it changes in tensors updated in place, has no
`after_step` hook, and returns its task weights as device tensors or as constants. Methods
that read the host each step (FairGrad's and the TorchJD methods' solvers, PCGrad's random
task order, RLW's host generator) stay eager, and the trial's log says why in one line.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from relif_ray.errors import first_line

CAPTURE_WARMUP_STEPS = 3
"""Eager steps on a side stream before the capture (PyTorch's notes use 3)."""


class GraphedStep:
    """A training step replayed from one CUDA graph (module docstring). It knows only what it
    replays: `update`, the step on the train split's rows at a device index (the batch
    gathered on the device, forward, losses, ReLiF, the method's backward, the optimiser's
    step) returning the step's trace row as tensors, and the `optimizer` it steps; the engine
    decides whether its steps are graphed (`relif_ray.engine.eager_reason`).

    capture=False runs the same static-buffer step without capturing it (on a CPU, in tests:
    everything here but the graph itself is checked against the eager step)."""

    def __init__(
        self,
        update: Callable[[Tensor], dict[str, Tensor]],
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
        self.graph.replay()
        self._record(self.row, number)

    def _captured(self) -> bool:
        """Capture the step; where an operation cannot be captured, say so in one line and
        train eagerly from here on. A failed capture ran none of the step's kernels (they are
        only recorded), so the step is then run eagerly with the same numbers."""
        try:
            self._capture()
        except RuntimeError as error:
            self.graph, self.capture = None, False
            reason = first_line(error)
            print(f"train.cuda_graph auto: eager steps: the capture failed ({reason})", flush=True)
            return False
        return True

    def _eager(self) -> Tensor:
        if not self.capture:
            return self._body()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            row = self._body()
        torch.cuda.current_stream(self.device).wait_stream(side)
        return row

    def _capture(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.row = self._body()

    def _body(self) -> Tensor:
        """The step on the static index: the batch gathered on the device, forward, losses,
        ReLiF, backward, clipping, the optimiser's step; the trace row as one vector."""
        row = self.update(self.index)
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
