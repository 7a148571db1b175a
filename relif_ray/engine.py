"""One training run, without Ray: fit, evaluate, and a checkpointable state.

Determinism: the model is initialised from `torch.manual_seed(seed)`; the batch order of epoch
e is a permutation drawn from a generator seeded by (seed, e), so it does not depend on how
many steps ran in this process; the global torch RNG (dropout) is part of the state. A run
restored from `state_dict()` at any step therefore ends with exactly the numbers of an
uninterrupted run (on CPU). The learning-rate schedule (`TrainConfig.scheduler`) steps at
the end of each complete epoch and is part of the state too.

Fast path (the `train` fields precision, channels_last, compile, cudnn_benchmark,
data_on_device; see `TrainConfig`): the model forward may run under bf16 autocast, in
channels-last layout and through `torch.compile`; everything after the forward (task losses,
audit scores, ReLiF, metrics) sees fp32 outputs; the splits may live on the GPU. On CUDA the
optimiser is torch's fused one. The engine and the ReLiF regularizer read no device value on
the host during a step: the trace keeps detached device tensors and converts them once per
`train_steps` call. Evaluation reads none inside its loop either (`relif_ray.evaluation`): a
split's results are copied to the host once.

Method hooks: after the optimizer step the engine calls `method.after_step` (with a function
that re-evaluates the step's batch, used by FAMO), and after the last step of every full epoch
`method.end_epoch()` (DWA); both are no-ops for the other methods.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math

import torch
from torch import Tensor

from relif_ray.config import ExperimentConfig, TrainConfig
from relif_ray.cuda_graph import (
    GraphedForward,
    GraphedStep,
    SolvedGraphedStep,
    capturable_optimizer_options,
    eager_reason,
    eval_graphs_hold,
    make_capturable,
)
from relif_ray.data.splits import Split, TensorSplit
from relif_ray.errors import UserError
from relif_ray.evaluation import EvalResult, SplitCollector
from relif_ray.gpu_stack import channels_last_applies, forward_precision
from relif_ray.methods import StepContext, build_method
from relif_ray.models.base import check_gradient_source
from relif_ray.problems import Problem, load_problem
from relif_ray.relif.regularizer import ReLiFRegularizer, compiled_regularizer
from relif_ray.schedule import (
    build_lr_scheduler,
    epoch_permutation,
    step_budget,
    steps_to_take,
)
from relif_ray.tasks.base import Batch, ModelOutput
from relif_ray.transfer import move_batch, move_tensor, resident_split

LOGGER = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("config field device: 'cuda' requested but no CUDA device is available")
    return torch.device(name)


def fp32_output(output: ModelOutput) -> ModelOutput:
    """The model output with every floating tensor in fp32 (a no-op for an fp32 model).

    Under bf16 autocast the losses, audit scores and ReLiF statistics are computed from this,
    so quantiles, squashes and metrics never run in bf16.
    """

    def cast(value: Tensor) -> Tensor:
        return value.float() if value.is_floating_point() else value

    return ModelOutput(
        predictions={name: cast(value) for name, value in output.predictions.items()},
        representation=cast(output.representation),
        features={name: cast(value) for name, value in output.features.items()},
        encoder_output=output.encoder_output,  # uncast: the heads read this very tensor
        auxiliary_loss=None if output.auxiliary_loss is None else cast(output.auxiliary_loss),
    )


def sum_of(first: Tensor | None, second: Tensor | None) -> Tensor | None:
    """The sum of two optional loss terms (None: no term)."""
    if first is None or second is None:
        return second if first is None else first
    return first + second


def trace_row(
    losses: dict[str, Tensor], weights: dict[str, Tensor], stats: dict[str, Tensor]
) -> dict[str, Tensor]:
    """A step's trace row, still as tensors: the task losses, the method's weights, ReLiF's
    statistics."""
    row = {f"loss_{name}": loss.detach() for name, loss in losses.items()}
    row.update({f"weight_{name}": torch.as_tensor(w).detach() for name, w in weights.items()})
    return row | stats


def use_deterministic_cpu_kernels() -> None:
    """Deterministic algorithms on the CPU, without filling every new tensor with NaN.

    `torch.use_deterministic_algorithms(True)` also sets
    `torch.utils.deterministic.fill_uninitialized_memory`, which writes NaN into each tensor
    `torch.empty` allocates so that a kernel reading memory it never wrote gives the same
    result every time. Our steps read no such memory (the same seed gives bit-identical
    numbers with and without the fill: `tests/test_engine.py`), and the fill cost 0.9% of a
    demo step (ResNet-18 at 48x64, batch 8, one thread: 201.8 against 200.0 ms; about 580
    fills per step).
    """
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False


def build_optimizer(
    parameters: list[torch.nn.Parameter], train: TrainConfig, graph_device: torch.device | None
) -> torch.optim.Optimizer:
    """`train`'s optimiser in torch's fused implementation, on CUDA and on the CPU: one
    kernel updates every parameter, rather than several per parameter (on CUDA host time; on
    one CPU thread Adam's update of a ResNet-18 takes 6 ms instead of 58 ms, a fifth of a demo
    step). Its rounding differs from the per-parameter loop's in the last bits, so its numbers
    are those of the pins, not of releases before it. For a CUDA graph (`graph_device`) it is
    capturable, with the learning rate a float32 tensor on the device that the schedule fills
    in place (`relif_ray.cuda_graph`). Each parameter's update is elementwise, so one optimiser
    over several runs' parameters updates each as its own would (`relif_ray.fused`)."""
    common = {"lr": train.lr, "weight_decay": train.weight_decay, "fused": True}
    if graph_device is not None:
        common.update(capturable_optimizer_options(train.lr, graph_device))
    if train.optimizer == "sgd":
        return torch.optim.SGD(parameters, momentum=0.9, **common)
    optimizer_class = torch.optim.AdamW if train.optimizer == "adamw" else torch.optim.Adam
    return optimizer_class(parameters, **common)


class TrainingRun:
    """Model + method (+ ReLiF) + optimiser for one config; `train_epoch` and `evaluate`."""

    def __init__(self, config: ExperimentConfig, problem: Problem | None = None) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        if self.device.type == "cpu":
            use_deterministic_cpu_kernels()
        self.problem = problem if problem is not None else load_problem(config.data)
        self.tasks = self.problem.tasks
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = config.train.cudnn_benchmark
        self.precision = forward_precision(config.train.precision, self.device)
        """The forward's precision: train.precision, but fp32 on a GPU without native bf16."""
        torch.manual_seed(config.seed)
        self.model = self.problem.build_model(config.model).to(self.device)
        check_gradient_source(self.model, config.method.gradient_source)
        self.channels_last = channels_last_applies(config.train.channels_last, self.device)
        if self.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.forward_model = torch.compile(self.model) if config.train.compile else self.model
        task_names = self.problem.task_names
        self.method = build_method(
            config.method.name,
            task_names,
            config.seed,
            gradient_source=config.method.gradient_source,
            **config.method.options,
        ).to(self.device)
        shared = {id(param) for param in self.model.shared_parameters()}
        self.head_parameters = [
            p for p in self.model.parameters() if p.requires_grad and id(p) not in shared
        ]
        self.regularizer = self._build_regularizer(task_names)
        self.relif_step = self.regularizer
        """What a step calls: the regularizer, or it compiled (`train.compile_relif`)."""
        if self.regularizer is not None and config.train.compile_relif:
            self.relif_step = compiled_regularizer(self.regularizer)
        self.train_split = self.split("train")
        self.eager_reason = eager_reason(config.train, self.device, self.method, self.train_split)
        """Why the steps stay eager (`relif_ray.cuda_graph.eager_reason`); None: graphed."""
        self.optimizer = self._build_optimizer(graph=self.eager_reason is None)
        self.graphed = self.graphed_step() if self.eager_reason is None else None
        graphed_eval = eval_graphs_hold(config.train, self.device)
        self.eval_forward = GraphedForward(self._forward) if graphed_eval else self._forward
        """What evaluation calls: the forward, or it replayed from CUDA graphs."""
        if (
            self.device.type == "cuda"
            and config.train.cuda_graph == "auto"
            and self.graphed is None
        ):
            LOGGER.info("train.cuda_graph auto: eager steps, %s", self.eager_reason)
        self.steps_per_epoch = self._steps_per_epoch(len(self.train_split))
        self.total_steps = step_budget(
            config.train.epochs, config.train.max_steps, self.steps_per_epoch
        )
        budget_epochs = math.ceil(self.total_steps / self.steps_per_epoch)  # last one partial
        self.lr_scheduler = build_lr_scheduler(self.optimizer, config.train, budget_epochs)
        self.step = 0
        self.trace: list[dict[str, float]] = []
        self._pending: list[dict[str, Tensor]] = []
        self._order: tuple[int, Tensor] | None = None

    def split(self, name: str) -> Split:
        """The problem's split `name`, held on the device with `train.data_on_device` (every
        split under the same rule: copied once per process, `resident_split`)."""
        split = self.problem.splits[name]
        if not self.config.train.data_on_device:
            return split
        if not isinstance(split, TensorSplit):
            raise UserError(
                f"config field train.data_on_device: the {self.problem.name} {name} split "
                f"({type(split).__name__}) cannot be held on the device; set it to false"
            )
        return resident_split(split, self.device)

    def _build_regularizer(self, task_names: list[str]) -> torch.nn.Module | None:
        if not self.config.relif.enabled:
            return None
        return ReLiFRegularizer(self.config.relif, task_names).to(self.device)

    def optimizer_parameters(self) -> list[torch.nn.Parameter]:
        """What the optimiser updates: the model's and the method's parameters."""
        return [*self.model.parameters(), *self.method.parameters()]

    def _build_optimizer(self, graph: bool = False) -> torch.optim.Optimizer:
        """The config's optimiser (`build_optimizer`); for a CUDA graph (`graph`) capturable."""
        graph_device = self.device if graph else None
        return build_optimizer(self.optimizer_parameters(), self.config.train, graph_device)

    def _steps_per_epoch(self, n: int) -> int:
        """Full batches only (BatchNorm needs > 1 example), unless the split is smaller."""
        if n == 0:
            raise UserError("data: the train split is empty")
        return max(n // self.config.train.batch_size, 1)

    @property
    def epoch(self) -> int:
        return self.step // self.steps_per_epoch

    @property
    def finished(self) -> bool:
        return self.step >= self.total_steps

    def train_epoch(self) -> None:
        """Train until the end of the current epoch (or the step budget)."""
        self.train_steps(None)

    def train_steps(self, count: int | None) -> None:
        """Train `count` steps (None: to the end of the epoch), within the step budget."""
        for _ in range(steps_to_take(self.step, count, self.steps_per_epoch, self.total_steps)):
            self._train_step()
        self._flush_trace()

    def _epoch_order(self) -> Tensor:
        """This epoch's permutation, drawn once per epoch rather than once per step (on the
        host, so the order does not depend on the device), and held where the train split
        is: with `train.data_on_device` it is copied to the device once per epoch, and each
        step's index is a slice of it there."""
        if self._order is None or self._order[0] != self.epoch:
            order = epoch_permutation(len(self.train_split), self.config.seed, self.epoch)
            if self.config.train.data_on_device:
                order = move_tensor(order, self.device)
            self._order = (self.epoch, order)
        return self._order[1]

    def _train_index(self) -> Tensor:
        """The train split's rows of this step's batch."""
        size = self.config.train.batch_size
        position = self.step % self.steps_per_epoch
        return self._epoch_order()[position * size : (position + 1) * size]

    def _train_batch(self, index: Tensor | None = None) -> Batch:
        """The train split's rows `index` (default: this step's) as a device batch."""
        rows = self._train_index() if index is None else index
        return self._to_device(self.train_split.batch(rows))

    def _to_device(self, batch: Batch) -> Batch:
        """Move a batch to the device; images in channels-last order when configured."""
        batch = move_batch(batch, self.device)
        image = batch["input"]
        if self.channels_last and image.dim() == 4:
            batch["input"] = image.contiguous(memory_format=torch.channels_last)
        return batch

    def _forward(self, batch: Batch) -> ModelOutput:
        """The model forward (bf16 autocast when `self.precision` says so), returned in fp32."""
        autocast = (  # without a weight cache: each weight is cast once anyway, and a CUDA
            # graph cannot keep autocast's cache between replays
            torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=False)
            if self.precision == "bf16"
            else contextlib.nullcontext()
        )
        with autocast:
            output = self.forward_model(batch)
        return fp32_output(output)

    def _train_step(self) -> None:
        if self.graphed is not None:
            self.graphed.step(self._train_index(), self.step)
        else:
            self._eager_step()
        self.step += 1
        if self.step % self.steps_per_epoch == 0:  # a complete epoch ended
            self.method.end_epoch()
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()

    def graphed_step(self, capture: bool = True) -> GraphedStep:
        """This run's training step as a `GraphedStep`, or for a method that solves on the
        host as a `SolvedGraphedStep` (capture=False: the same static-buffer step without
        the graphs, which the CPU tests compare with the eager step)."""
        batch_size = self.config.train.batch_size
        if self.method.splits_at_host_solve():
            parts = (self._before_solve, self.method.solve, self._after_solve)
            count = len(self.problem.task_names)
            return SolvedGraphedStep(parts, count, self.optimizer, batch_size, self.device, capture)
        update = lambda index: self._update(self._train_batch(index))  # noqa: E731
        return GraphedStep(update, self.optimizer, batch_size, self.device, capture)

    def _eager_step(self) -> None:
        batch = self._train_batch()
        self._finish_step(batch, self._update(batch))

    def _finish_step(self, batch: Batch, row: dict[str, Tensor]) -> None:
        """What follows an eager step's update on `batch`: the method's `after_step` hook and
        the step's trace row (`row`, with the step and the learning rate), pending."""
        self.method.after_step(lambda: self._updated_losses(batch))
        row["step"] = torch.tensor(self.step)
        row["lr"] = torch.as_tensor(self.optimizer.param_groups[0]["lr"], dtype=torch.float64)
        self._pending.append(row)

    def _update(self, batch: Batch) -> dict[str, Tensor]:
        """One optimiser update on a device batch: forward, losses, ReLiF and the method's
        backward (`_backward`), gradient clipping, the optimiser's step; the step's trace row,
        still as tensors. The eager step and the graphed one (`relif_ray.cuda_graph`) both run
        it."""
        self.model.train()
        row = self._backward(batch)
        self._optimizer_step()
        return row

    def _before_solve(self, index: Tensor) -> tuple[Tensor, tuple]:
        """A host-solving method's step up to its solve, on the train split's rows at a device
        index (`SolvedGraphedStep`): the Gramian, and what `_after_solve` needs."""
        self.model.train()
        losses, extra_loss, context, stats = self._step_start(self._train_batch(index))
        pending = self.method.gradients_before_solve(losses, context, extra_loss)
        return pending.gramian, (pending, losses, stats)

    def _after_solve(self, state: tuple, solved: Tensor) -> dict[str, Tensor]:
        """The step after the host solve: the update written back, the optimiser's step."""
        pending, losses, stats = state
        weights = self.method.update_after_solve(pending, solved)
        self._optimizer_step()
        return trace_row(losses, weights, stats)

    def _optimizer_step(self) -> None:
        if self.config.train.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.train.grad_clip)
        self.optimizer.step()

    def _task_losses(self, output: ModelOutput, batch: Batch) -> dict[str, Tensor]:
        return {
            task.name: task.loss(output.predictions[task.name], batch[task.name])
            for task in self.tasks
        }

    @torch.no_grad()
    def _updated_losses(self, batch: Batch) -> dict[str, Tensor]:
        """The task losses of `batch` at the parameters after the step: one forward without
        graph, in train mode as the step's own (`MTLMethod.after_step`)."""
        return self._task_losses(self._forward(batch), batch)

    def _backward(self, batch: Batch) -> dict[str, Tensor]:
        """Forward, task losses, ReLiF and the method's backward on one device batch; the
        step's trace row, still as tensors. Nothing here waits for the device (tested), except
        methods that solve a small problem on the host (PCGrad, FairGrad, the TorchJD ones)."""
        losses, extra_loss, context, stats = self._step_start(batch)
        weights = self.method.backward(losses, context, extra_loss)
        return trace_row(losses, weights, stats)

    def _step_start(self, batch: Batch) -> tuple[dict, Tensor | None, StepContext, dict]:
        """Forward, task losses and the ReLiF term on one device batch, gradients cleared:
        the losses, the term added after the method's aggregation, the method's context and
        ReLiF's statistics. The architecture's own loss term (DSelect-k's gate regularizer)
        joins the ReLiF term."""
        output = self._forward(batch)
        losses = self._task_losses(output, batch)
        extra_loss, stats = output.auxiliary_loss, {}
        if self.regularizer is not None:
            scores = {task.name: task.audit_score(output, batch) for task in self.tasks}
            is_probability = {task.name: task.score_is_probability for task in self.tasks}
            relif_loss, stats = self.relif_step(scores, output.representation, is_probability)
            extra_loss = sum_of(extra_loss, relif_loss)
        self.optimizer.zero_grad(set_to_none=True)
        context = StepContext(
            shared_parameters=self.model.shared_parameters(),
            last_shared_parameters=self.model.last_shared_parameters(),
            step=self.step,
            encoder_output=output.encoder_output,
            head_parameters=self.head_parameters,
        )
        return losses, extra_loss, context, stats

    def _flush_trace(self) -> None:
        """Turn the pending per-step tensors into floats: one host sync per `train_steps` call,
        not per step (a graphed run's rows wait in one device buffer)."""
        for row in self._pending:
            self.trace.append({key: float(value) for key, value in row.items()})
        self._pending.clear()
        if self.graphed is not None:
            self.trace += self.graphed.take_rows()

    @torch.inference_mode()
    def evaluate(self, split_name: str = "val") -> EvalResult:
        """Native metrics, normalized scores, Worst/Macro, raw audit scores, representations
        of one split: computed on the device and copied to the host once
        (`relif_ray.evaluation`), with the split's example names."""
        result = self.collect(split_name).result()
        result.names = self.problem.splits[split_name].example_names()
        return result

    @torch.inference_mode()
    def collect(self, split_name: str) -> SplitCollector:
        """The evaluation loop over one split: every batch's results stay on the device."""
        split = self.split(split_name)
        self.model.eval()
        collector = SplitCollector(self.tasks)
        size = self.config.train.eval_batch_size
        for start in range(0, len(split), size):
            index = torch.arange(start, min(start + size, len(split)), device=_device_of(split))
            batch = self._to_device(split.batch(index))
            collector.add(batch, self.eval_forward(batch))
        return collector

    def state_dict(self) -> dict:
        """Everything needed to continue exactly: weights, optimiser, learning-rate schedule,
        method, ReLiF, step, RNG."""
        self._flush_trace()
        state = {
            "model": self.model.state_dict(),
            "method": self.method.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "torch_rng": torch.get_rng_state(),
            "trace": [dict(row) for row in self.trace],
        }
        if self.regularizer is not None:
            state["regularizer"] = self.regularizer.state_dict()
        if self.lr_scheduler is not None:
            state["lr_scheduler"] = self.lr_scheduler.state_dict()
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state` (`state_dict`'s). The optimiser gets a copy of its part:
        torch's `Optimizer.load_state_dict` keeps the given tensors where their device and
        dtype already fit, so training would otherwise move the caller's state, and a second
        run loaded from the same in-memory state would start elsewhere."""
        self.model.load_state_dict(state["model"])
        self.method.load_state_dict(state["method"])
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        if self.regularizer is not None:
            self.regularizer.load_state_dict(state["regularizer"])
        if self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.step = int(state["step"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self.trace = [dict(row) for row in state["trace"]]
        self._pending.clear()
        if self.graphed is not None:  # the graph refers to the optimiser's replaced state
            self.graphed.reset()
            make_capturable(self.optimizer, self.device)


def _device_of(split: Split) -> torch.device:
    """Where a split's batches are gathered: the device of a resident `TensorSplit`."""
    if isinstance(split, TensorSplit):
        return split.tensors["example_id"].device
    return torch.device("cpu")
