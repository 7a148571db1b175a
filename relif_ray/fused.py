"""Several seeds of one setting trained as one stacked model (`train.fused_seeds`).

How (`FusedTrainingRun`): one `relif_ray.engine.TrainingRun` per seed, the *members*, built
exactly as that seed's own trial builds it (model initialisation, method, ReLiF regularizer,
optimiser, learning-rate schedule, batch order), so that each seed keeps everything that is
its own: parameters and optimiser state, method state, the ReLiF controller (lambda, the
violation EMA), its scale buffers and its same-seed ERM squash constants, its data order and
its dropout stream. A step then

1. gathers every seed's batch (its own permutation of the train split) into one (S, B, ...)
   batch, and draws each seed's dropout noise from that seed's own generator (the state its
   unfused run's global generator would have: `DrawnDropout`);
2. stacks the members' parameters along a new first dimension (`torch.stack`, differentiable:
   the gradients flow back to each member's own parameters) and runs the forward, the task
   losses, the audit scores and the ReLiF term of all seeds as one `torch.func.vmap` over
   `functional_call` of one template model and one template regularizer; the regularizers'
   buffers are held stacked here during training and updated in place through the vmap;
3. backpropagates once for all seeds: the seeds' parameters are disjoint, so the gradient of
   the sum of the seeds' objectives with respect to seed s's parameters is exactly seed s's
   own gradient. A loss weighting weighs each seed's losses with that seed's method; a
   gradient aggregation (PCGrad, FairGrad, the TorchJD weightings) takes task k's gradients
   of every seed in one backward pass of the seeds' task-k losses, then solves each seed's
   K x K Gramian with that seed's method;
4. steps each member's own optimiser (and clips its own gradients), then runs each member's
   method hooks (FAMO's re-evaluation, DWA's epoch end) and learning-rate schedule.

Evaluation, checkpoints and outputs stay per seed: the members' parameters are the live ones,
so each member evaluates and writes its outputs as an unfused trial would, and a fused
checkpoint is the list of the members' own states (each with its generator's state as its
RNG), from which `load_state_dict` continues exactly.

Equality with the unfused trials: vmap's own rules would batch a seed's matrix products into
one `torch.bmm` and decompose its binary cross-entropy, whose rounding differs in the last
bits; those functions run once per seed inside the vmap (`relif_ray.seedwise`), and every
other op (elementwise ops, reductions, the optimisers, the Gramians and their solves, the
dropout masks) is the same op on the same numbers, so a stacked seed trains bit for bit as its
own trial on the CPU (`tests/test_fused.py`, every method and ReLiF label).

How seeds are fused on each model (stacked, looped, streamed on a GPU) and what cannot be
fused: `relif_ray.fusion`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from relif_ray.config import ExperimentConfig
from relif_ray.engine import TrainingRun, build_optimizer, fp32_output
from relif_ray.errors import UserError
from relif_ray.fusion import check_fusable, fused_form
from relif_ray.methods.gradients import GradientAggregator, PendingUpdate
from relif_ray.models.clinical import ClinicalMTLModel
from relif_ray.problems import Problem, load_problem
from relif_ray.relif.regularizer import STAT_KEYS
from relif_ray.schedule import steps_to_take
from relif_ray.seedwise import (
    drawn_dropouts,
    lstm_dropout_masks,
    record_dropout_shapes,
    seed_stream,
    seedwise_functions,
    stacked_lstm,
)
from relif_ray.tasks.base import Batch

LOGGER = logging.getLogger(__name__)


@dataclass
class FusedStep:
    """What the fused forward gives for a step: (S, K) task losses, the (S,) terms added
    after the methods' aggregation (ReLiF and the architecture's own; None: none) and the
    ReLiF statistics, each (S,)."""

    losses: Tensor
    extra_loss: Tensor | None
    stats: dict[str, Tensor]


class FusedTrainingRun:
    """S seeds of one config trained in step as one stacked model; `members[s]` is seed s's
    own `TrainingRun`, whose parameters, method, optimiser and trace are live."""

    def __init__(self, configs: Sequence[ExperimentConfig], problem: Problem | None = None) -> None:
        check_fusable(configs)
        self.problem = problem if problem is not None else load_problem(configs[0].data)
        self.members: list[TrainingRun] = []
        self.generators: list[torch.Generator] = []
        for config in configs:
            member = TrainingRun(config, self.problem)
            self.members.append(member)
            generator = torch.Generator()  # the stream the unfused run's dropout draws from
            generator.set_state(torch.get_rng_state())
            self.generators.append(generator)
        first = self.members[0]
        self.config = first.config
        self.device = first.device
        self.form = fused_form(self.config, self.device.type)
        self.streams = [
            torch.cuda.Stream(self.device) if self.form == "streamed" else None
            for _ in self.members
        ]
        """Each seed's CUDA stream (streamed form; None elsewhere: `torch.cuda.stream(None)`
        is a no-op)."""
        self.tasks = first.tasks
        self.task_names = self.problem.task_names
        self.steps_per_epoch = first.steps_per_epoch
        self.total_steps = first.total_steps
        self.optimizer: torch.optim.Optimizer | None = None
        """One optimiser over every member's parameters (one fused update for all seeds; each
        parameter's update is its member's own: `relif_ray.engine.build_optimizer`). The
        members' own optimisers hold their state only in `state_dict` (`_share_state`); None
        where streamed: each member steps its own."""
        if self.form != "streamed":
            parameters = [p for member in self.members for p in member.optimizer_parameters()]
            self.optimizer = build_optimizer(parameters, self.config.train, None)
        self.reg_state: dict[str, Tensor] = {}
        """The members' ReLiF buffers, stacked (S, ...): the live ones while a stacked run
        trains (a looped run's live ones are the members' own)."""
        self._pending: list[tuple[FusedStep, list[dict[str, Tensor]], int, Tensor]] = []
        if self.form == "stacked":
            self._build_stacked()
        LOGGER.info("train.fused_seeds: seeds %s %s", self.seeds, self.form)

    def _build_stacked(self) -> None:
        """The template model and regularizer the stacked forward vmaps over."""
        models = [member.model for member in self.members]
        self.template = copy.deepcopy(models[0])
        self.sequences = isinstance(self.template, ClinicalMTLModel)
        """The clinical LSTM, unrolled: its dropout masks drawn per stay (`lstm_dropout_masks`)."""
        if self.sequences:
            self.template.unrolled = stacked_lstm
            self.dropouts = drawn_dropouts(self.template, drawn_by_caller=(self.template.lstm,))
        else:
            self.dropouts = drawn_dropouts(self.template)
        self._parameters = {
            name: [model.get_parameter(name) for model in models]
            for name, _ in self.template.named_parameters()
        }
        """name -> each member's own parameter (the same objects for the whole run: the
        optimisers and `load_state_dict` write into them)."""
        self._buffers = {
            name: [model.get_buffer(name) for model in models]
            for name, _ in self.template.named_buffers()
        }
        self.reg_template = copy.deepcopy(self.members[0].regularizer)
        self._stack_regularizer_state()
        self.is_probability = {task.name: task.score_is_probability for task in self.tasks}
        if not self.sequences:  # each dropout's input shape, from seed 0's first batch
            first = self.members[0]
            batch = first._to_device(first.train_split.batch(first._train_index()))
            record_dropout_shapes(self.template, self.dropouts, first.model, batch)

    @property
    def step(self) -> int:
        return self.members[0].step

    @property
    def epoch(self) -> int:
        return self.members[0].epoch

    @property
    def finished(self) -> bool:
        return self.members[0].finished

    @property
    def seeds(self) -> list[int]:
        return [member.config.seed for member in self.members]

    def train_epoch(self) -> None:
        """Train every seed until the end of the current epoch (or the step budget)."""
        self.train_steps(None)

    def train_steps(self, count: int | None) -> None:
        """Train `count` steps (None: to the end of the epoch), within the step budget."""
        for _ in range(steps_to_take(self.step, count, self.steps_per_epoch, self.total_steps)):
            self._train_step()
        self._flush_trace()

    def _train_step(self) -> None:
        if self.form == "streamed":
            self._streamed_step()
            return
        if self.form == "looped":
            self._looped_step()
        else:
            self._stacked_step()
        self._advance()

    def _streamed_step(self) -> None:
        """Each seed's own step (`TrainingRun._train_step`: its update, optimiser and epoch
        end, graphed where its config graphs it), on its own CUDA stream that first waits for
        the work queued before it; then the current stream waits for every seed's."""
        streams = [stream for stream in self.streams if stream is not None]
        current = torch.cuda.current_stream(self.device) if streams else None
        for stream in streams:
            stream.wait_stream(current)
        for member, generator, stream in zip(
            self.members, self.generators, self.streams, strict=True
        ):
            with seed_stream(generator), torch.cuda.stream(stream):
                member._train_step()
        for stream in streams:
            current.wait_stream(stream)

    def _looped_step(self) -> None:
        """Each seed's step up to its optimiser update, in turn, as its unfused trial's
        (`TrainingRun._eager_step`, in its own random stream), then one fused update and what
        follows each seed's update (`TrainingRun._finish_step`)."""
        batches, rows = [], []
        for member, generator in zip(self.members, self.generators, strict=True):
            with seed_stream(generator):
                batches.append(member._train_batch())
                member.model.train()
                rows.append(member._backward(batches[-1]))
        self._optimizer_step()
        for member, generator, batch, row in zip(
            self.members, self.generators, batches, rows, strict=True
        ):
            with seed_stream(generator):
                member._finish_step(batch, row)

    def _optimizer_step(self) -> None:
        """Each seed's gradients clipped to its own norm, then the fused update."""
        if self.config.train.grad_clip is not None:
            for member in self.members:
                nn.utils.clip_grad_norm_(member.model.parameters(), self.config.train.grad_clip)
        self.optimizer.step()

    def _advance(self) -> None:
        """Every member one step on: epoch ends (the methods' hooks, the learning rate)."""
        for member in self.members:
            member.step += 1
            if member.step % member.steps_per_epoch == 0:  # a complete epoch ended
                member.method.end_epoch()
                if member.lr_scheduler is not None:
                    member.lr_scheduler.step()  # the same rate for every seed: one config
        self.optimizer.param_groups[0]["lr"] = self.members[0].optimizer.param_groups[0]["lr"]

    def _stacked_step(self) -> None:
        index = torch.stack([member._train_index() for member in self.members])
        batch = self.members[0]._to_device(self.members[0].train_split.batch(index))
        self.template.train()
        fused = self.forward(batch)
        self.optimizer.zero_grad(set_to_none=True)
        weights = self._backward(fused)
        self._optimizer_step()
        self._after_step(batch)
        lr = torch.as_tensor(self.optimizer.param_groups[0]["lr"], dtype=torch.float64)
        self._pending.append((fused, weights, self.step, lr))

    def forward(self, batch: Batch) -> FusedStep:
        """Every seed's forward, task losses and ReLiF term on its own rows of `batch`
        ((S, B, ...) per key), as one vmap; with a graph for the backward."""
        params, buffers = self._stacked_model()
        noise = self._noise(batch)
        with seedwise_functions():
            losses, extra, stats = vmap(self._seed_step, randomness="error")(
                params, buffers, noise, self.reg_state, batch
            )
        return FusedStep(losses, extra if self._has_extra else None, stats)

    def _seed_step(
        self,
        params: dict[str, Tensor],
        buffers: dict[str, Tensor],
        noise: list[Tensor],
        reg_state: dict[str, Tensor],
        batch: Batch,
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """One seed's part of the fused forward (inside the vmap): its unfused
        `TrainingRun._step_start` up to the backward."""
        self._set_noise(noise)
        output = fp32_output(functional_call(self.template, {**params, **buffers}, (batch,)))
        losses = torch.stack(
            [task.loss(output.predictions[task.name], batch[task.name]) for task in self.tasks]
        )
        extra = output.auxiliary_loss
        stats: dict[str, Tensor] = {}
        if self.reg_template is not None:
            scores = {task.name: task.audit_score(output, batch) for task in self.tasks}
            relif_loss, stats = functional_call(
                self.reg_template,
                reg_state,
                (scores, output.representation, self.is_probability),
            )
            if relif_loss is not None:
                extra = relif_loss if extra is None else extra + relif_loss
        self._has_extra = extra is not None  # the same at every step: a fixed choice of config
        if extra is None:
            extra = losses.new_zeros(())
        return losses, extra, stats

    def _backward(self, fused: FusedStep) -> list[dict[str, Tensor]]:
        """Fill every member's `.grad` as its own method would; each seed's weights."""
        methods = [member.method for member in self.members]
        if isinstance(methods[0], GradientAggregator):
            return self._aggregated_backward(fused)
        total = None
        weights = []
        for seed_index, method in enumerate(methods):
            seed_total, seed_weights = method.weighted_loss(fused.losses[seed_index])
            total = seed_total if total is None else total + seed_total
            weights.append(dict(zip(self.task_names, seed_weights, strict=True)))
        if fused.extra_loss is not None:
            total = total + fused.extra_loss.sum()
        total.backward()
        return weights

    def _aggregated_backward(self, fused: FusedStep) -> list[dict[str, Tensor]]:
        """A gradient aggregation for every seed: task k's gradients of all seeds from one
        backward pass of the seeds' summed task-k losses (`backward_per_task`, fused), the
        ReLiF term's backward, then each seed's Gramian solved by its own method and its
        update G^T c written back (`GradientAggregator.update_after_solve`)."""
        shared = [member.model.shared_parameters() for member in self.members]
        sizes = [[p.numel() for p in params] for params in shared]
        num_tasks = len(self.task_names)
        matrices = [
            torch.zeros(num_tasks, sum(size), dtype=params[0].dtype, device=params[0].device)
            for params, size in zip(shared, sizes, strict=True)
        ]
        for params in shared:
            for param in params:
                param.grad = None
        keep = fused.extra_loss is not None
        for row in range(num_tasks):
            fused.losses[:, row].sum().backward(retain_graph=keep or row < num_tasks - 1)
            for matrix, params, size in zip(matrices, shared, sizes, strict=True):
                for chunk, param in zip(matrix[row].split(size), params, strict=True):
                    if param.grad is not None:
                        chunk.copy_(param.grad.reshape(-1))
                        param.grad = None
        if fused.extra_loss is not None:
            fused.extra_loss.sum().backward()
        weights = []
        for member, matrix, params in zip(self.members, matrices, shared, strict=True):
            pending = PendingUpdate(matrix, matrix @ matrix.T, list(params))
            solved = member.method.solve(pending.gramian.cpu()).to(matrix.device)
            weights.append(member.method.update_after_solve(pending, solved))
        return weights

    def _after_step(self, batch: Batch) -> None:
        """Each member's `after_step` hook, with its task losses of the step's batch at the
        updated parameters: one fused forward without graph, made only if a method asks (as
        unfused, it draws that seed's dropout masks again)."""
        updated: list[Tensor] = []

        def losses_of(seed_index: int) -> Callable[[], dict[str, Tensor]]:
            def batch_losses() -> dict[str, Tensor]:
                if not updated:
                    with torch.no_grad():
                        updated.append(self.forward_losses(batch))
                return dict(zip(self.task_names, updated[0][seed_index], strict=True))

            return batch_losses

        for seed_index, member in enumerate(self.members):
            member.method.after_step(losses_of(seed_index))

    def forward_losses(self, batch: Batch) -> Tensor:
        """(S, K) task losses of every seed's rows of `batch`, without the ReLiF term."""
        params, buffers = self._stacked_model()
        noise = self._noise(batch)

        def seed_losses(params: dict, buffers: dict, noise: list, batch: Batch) -> Tensor:
            self._set_noise(noise)
            output = fp32_output(functional_call(self.template, {**params, **buffers}, (batch,)))
            return torch.stack(
                [task.loss(output.predictions[task.name], batch[task.name]) for task in self.tasks]
            )

        with seedwise_functions():
            return vmap(seed_losses, randomness="error")(params, buffers, noise, batch)

    def _stacked_model(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The members' parameters and buffers, each stacked along a new first dimension
        (the parameters differentiably: gradients reach each member's own)."""

        def stacked(tensors: dict[str, list[Tensor]]) -> dict[str, Tensor]:
            return {name: torch.stack(values) for name, values in tensors.items()}

        return stacked(self._parameters), stacked(self._buffers)

    def _noise(self, batch: Batch) -> list[Tensor]:
        """Each dropout's masks for one train-mode forward on `batch`, (S, ...), seed s's from
        its own generator (nothing is drawn for p = 0 or in evaluation, as unfused)."""
        if self.sequences:
            lstm, training = self.template.lstm, self.template.training
            return lstm_dropout_masks(
                lstm, self.dropouts[0], batch, self.generators, training, self.device
            )
        return [module.masks(self.generators, self.device, self.template.training)
                for module in self.dropouts]  # fmt: skip

    def _set_noise(self, noise: list[Tensor]) -> None:
        """Hand one seed's masks (inside the vmap) to the template's dropouts."""
        if self.sequences:
            between, noise = noise[0], noise[1:]
            self.template.between_noise = between if between.numel() else None
        for module, mask in zip(self.dropouts, noise, strict=True):
            module.noise = mask

    def _stack_regularizer_state(self) -> None:
        """The members' ReLiF buffers stacked (the live ones while training)."""
        if self.form != "stacked" or self.reg_template is None:
            return
        regularizers = [member.regularizer for member in self.members]
        names = [name for name, _ in self.reg_template.named_buffers()]
        self.reg_state = {
            name: torch.stack([reg.get_buffer(name).detach() for reg in regularizers])
            for name in names
        }

    def _sync_regularizers(self) -> None:
        """Copy the stacked ReLiF buffers back into each member's regularizer."""
        if self.form != "stacked":
            return
        for seed_index, member in enumerate(self.members):
            if member.regularizer is None:
                return
            for name, stacked in self.reg_state.items():
                member.regularizer.get_buffer(name).copy_(stacked[seed_index])

    def _share_state(self, to_members: bool) -> None:
        """The optimiser state of each parameter, from the fused optimiser into its member's
        (for the member's `state_dict`) or back (after its `load_state_dict`); the members'
        learning rates are the fused one's."""
        if self.optimizer is None:  # streamed: each seed steps its own optimiser
            return
        for member in self.members:
            for param in member.optimizer_parameters():
                if to_members and param in self.optimizer.state:
                    member.optimizer.state[param] = self.optimizer.state[param]
                elif not to_members and param in member.optimizer.state:
                    self.optimizer.state[param] = member.optimizer.state[param]
        if not to_members:
            self.optimizer.param_groups[0]["lr"] = self.members[0].optimizer.param_groups[0]["lr"]

    def _flush_trace(self) -> None:
        """Each step's rows into every member's trace (one host read per call): a looped
        run's members hold their own, a stacked run's are stacked here."""
        for member in self.members:
            member._flush_trace()
        for fused, weights, step, lr in self._pending:
            losses = fused.losses.detach().tolist()
            stats = {key: value.tolist() for key, value in fused.stats.items()}
            for seed_index, member in enumerate(self.members):
                row = {
                    f"loss_{name}": value
                    for name, value in zip(self.task_names, losses[seed_index], strict=True)
                }
                row.update({f"weight_{name}": float(w) for name, w in weights[seed_index].items()})
                row.update({key: stats[key][seed_index] for key in STAT_KEYS if key in stats})
                row["step"] = float(step)
                row["lr"] = float(lr)
                member.trace.append(row)
        self._pending.clear()

    def state_dict(self) -> dict:
        """Each member's own state (as its unfused trial's), with its generator's state as
        its RNG."""
        self._flush_trace()
        self._sync_regularizers()
        self._share_state(to_members=True)
        states = []
        for member, generator in zip(self.members, self.generators, strict=True):
            state = member.state_dict()
            state["torch_rng"] = generator.get_state()
            states.append(state)
        return {"seeds": self.seeds, "members": states}

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state_dict()`'s."""
        if list(state["seeds"]) != self.seeds:
            raise UserError(
                f"checkpoint: it holds seeds {list(state['seeds'])}, this trial {self.seeds}"
            )
        rng = torch.get_rng_state()
        for member, generator, member_state in zip(
            self.members, self.generators, state["members"], strict=True
        ):
            member.load_state_dict(member_state)
            generator.set_state(member_state["torch_rng"])
        torch.set_rng_state(rng)
        self._share_state(to_members=False)
        self._stack_regularizer_state()
        self._pending.clear()
