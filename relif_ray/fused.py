"""Several seeds of one setting trained as one stacked model (`train.fused_seeds`).

Why: on a small model a training step is a few hundred tiny kernels, each dispatched by the
host; S trials of S seeds dispatch S times as many for S times the arithmetic. Trained as one
model whose every weight has a leading seed dimension, the S seeds share each dispatch
(HFTA's horizontal fusion, MLSys 2021; PyTorch's ensembling with `torch.func`).

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

Two forms (`fused_form`): the tabular MLP and the clinical LSTM of hard sharing are *stacked*
as described above (the LSTM through `relif_ray.seedwise.stacked_lstm`, its recursion over
every seed's padded stays as one batched product per time step, each seed's dropout masks
drawn as its own `nn.LSTM` draws them: `_sequence_noise`); every other model (NYUv2's ResNet,
the expert architectures), and a method or field that acts on one model, is *looped*: each
seed's forward, losses, ReLiF term and its method's own backward run in turn, exactly as its
unfused step (its own model, batch and global random stream: `seed_stream`), then one fused
optimiser step updates every seed. A looped trial shares what a trial costs beside its steps
(the process, the data, the evaluation set-up) and the optimiser's dispatch, not the steps'
kernels: a stacked ResNet would have to batch its BatchNorm statistics per seed. A stacked
tabular seed and a looped seed train bit for bit as their own trials on the CPU; a stacked
clinical seed up to the rounding of the unrolled recursion (`nn.LSTM` runs it over the packed
stays in kernels of its own).

What cannot be fused is refused before anything is built (`fusion_refusal`): see its
docstring for each reason.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from relif_ray.config import ExperimentConfig
from relif_ray.engine import TrainingRun, build_optimizer, fp32_output
from relif_ray.errors import UserError
from relif_ray.methods import methods
from relif_ray.methods.base import LossWeighting
from relif_ray.methods.gradients import GradientAggregator, PendingUpdate
from relif_ray.models.clinical import ClinicalMTLModel, packing_plan
from relif_ray.problems import Problem, load_problem
from relif_ray.relif.regularizer import STAT_KEYS
from relif_ray.schedule import steps_to_take
from relif_ray.seedwise import drawn_dropouts, seedwise_functions, stacked_lstm
from relif_ray.tasks.base import Batch

LOGGER = logging.getLogger(__name__)

STACKED_DATASETS = ("tabular", "mimic3", "eicu")
"""The benchmarks whose model is stacked (`fused_form`): the tabular MLP (every tabular preset
and table) and the clinical LSTM of hard sharing (`model.architecture` hps; its LSTM unrolled:
`relif_ray.models.clinical.unrolled_lstm`). The others are looped."""


def fused_form(config: ExperimentConfig) -> Literal["stacked", "looped"]:
    """How `config`'s seeds are fused: "stacked" (one vmapped forward and one backward for
    all seeds) where the model is stacked (`STACKED_DATASETS`), the method is a loss weighting
    or a gradient aggregation on the shared parameters and no fast-path field acts on one
    model (torch.compile, bf16 autocast, channels-last); "looped" otherwise: GradNorm and
    DB-MTL take their per-task passes inside their own backward, the representation gradient
    source backpropagates through the encoder after a solve, and the fast-path fields act on
    each seed's own model."""
    method = methods().get(config.method.name)
    train = config.train
    stacked = (
        config.data.dataset in STACKED_DATASETS
        and (config.data.dataset == "tabular" or config.model.architecture == "hps")
        and config.method.gradient_source == "parameters"
        and method is not None
        and issubclass(method, LossWeighting | GradientAggregator)
        and not (train.compile or train.compile_relif or train.channels_last)
        and train.precision == "fp32"
    )
    return "stacked" if stacked else "looped"


def fusion_refusal(config: ExperimentConfig) -> str | None:
    """Why `config`'s seeds cannot be trained as one fused trial, completing
    "train.fused_seeds: ..."; None where they can: every benchmark, method and field on the
    CPU. A CUDA device is refused: fused steps are checked against their unfused trials on
    the CPU only (a CUDA trial's dropout masks come from its fused dropout kernel's own Philox
    stream, and its step is a CUDA graph), and so is "auto", a GPU sweep's device."""
    if config.device != "cpu":  # "auto" (a GPU sweep's) trains on CUDA where it can
        return (
            f"fused trials run on the CPU (device {config.device}: a fused CUDA step is not "
            "checked yet)"
        )
    return None


def check_fusable(configs: Sequence[ExperimentConfig]) -> None:
    """Refuse, in one line, seeds that cannot be one fused trial: a config `fusion_refusal`
    refuses, or configs that differ in more than their seed and their same-seed squash
    constants."""
    if not configs:
        raise ValueError("a fused run trains at least one seed")
    reason = fusion_refusal(configs[0])
    if reason is not None:
        raise UserError(f"config field train.fused_seeds: {reason}")
    first = setting_of(configs[0])
    for config in configs[1:]:
        if setting_of(config) != first:
            raise UserError(
                "config field train.fused_seeds: the fused seeds' configs differ beyond their "
                f"seed (seeds {configs[0].seed} and {config.seed})"
            )
    seeds = [config.seed for config in configs]
    if len(set(seeds)) != len(seeds):
        raise UserError(f"config field train.fused_seeds: a seed repeats in {seeds}")


def setting_of(config: ExperimentConfig) -> dict:
    """What the fused seeds must share: the config without its seed and squash constants."""
    values = config.to_dict()
    values.pop("seed")
    values["relif"] = {k: v for k, v in values["relif"].items() if k != "squash_constants"}
    return values


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
        self.form = fused_form(self.config)
        self.device = first.device
        self.tasks = first.tasks
        self.task_names = self.problem.task_names
        self.steps_per_epoch = first.steps_per_epoch
        self.total_steps = first.total_steps
        self.optimizer = build_optimizer(
            [p for member in self.members for p in member.optimizer_parameters()],
            self.config.train,
            None,
        )
        """One optimiser over every member's parameters (one fused update for all seeds; each
        parameter's update is its member's own: `relif_ray.engine.build_optimizer`). The
        members' own optimisers hold their state only in `state_dict` (`_share_state`)."""
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
        """The clinical LSTM, unrolled: its dropout masks drawn per stay (`_sequence_noise`)."""
        if self.sequences:
            self.template.unrolled = stacked_lstm
            self.dropouts = drawn_dropouts(self.template, drawn_by_caller=(self.template.lstm,))
        else:
            self.dropouts = drawn_dropouts(self.template)
        self._parameters = {
            name: [_tensor_of(model, name) for model in models]
            for name, _ in self.template.named_parameters()
        }
        """name -> each member's own parameter (the same objects for the whole run: the
        optimisers and `load_state_dict` write into them)."""
        self._buffers = {
            name: [_tensor_of(model, name) for model in models]
            for name, _ in self.template.named_buffers()
        }
        self.reg_template = copy.deepcopy(self.members[0].regularizer)
        self._stack_regularizer_state()
        self.is_probability = {task.name: task.score_is_probability for task in self.tasks}
        if not self.sequences:
            self._probe_dropout_shapes()

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
        if self.form == "looped":
            self._looped_step()
        else:
            self._stacked_step()
        self._advance()

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
            return self._sequence_noise(batch)
        masks = []
        for module in self.dropouts:
            if module.p == 0.0 or not self.template.training:
                masks.append(torch.zeros(len(self.members), 0))
                continue
            masks.append(module.draw(self.generators, self.device))
        return masks

    def _sequence_noise(self, batch: Batch) -> list[Tensor]:
        """The clinical LSTM's masks, [between its layers (S, layers - 1, B, T, H), on its
        outputs (S, B, T, H)], each seed's drawn from its generator as its unfused trial's
        `nn.LSTM` and `nn.Dropout` draw them: per gap between layers one mask of the packed
        sequence (its valid steps, in packing order: `packing_plan`), then one of the outputs
        padded to the seed's own longest stay; each then laid out in the stacked batch's
        padding (zero where no stay is)."""
        lstm, output_dropout = self.template.lstm, self.dropouts[0]
        seeds, stays, steps = batch["input"].shape[:3]
        hidden, gaps = lstm.hidden_size, lstm.num_layers - 1
        training = self.template.training
        between_p = lstm.dropout if training and gaps else 0.0
        output_p = output_dropout.p if training else 0.0
        between = torch.zeros((seeds, gaps, stays, steps, hidden) if between_p else (seeds, 0))
        outputs = torch.zeros((seeds, stays, steps, hidden) if output_p else (seeds, 0))
        for seed_index, generator in enumerate(self.generators):
            lengths = batch["lengths"][seed_index]
            own_steps = int(lengths.max())
            if between_p:
                plan = packing_plan(lengths, own_steps)
                packed_rows = plan.indices[: plan.packed]
                for gap in range(gaps):
                    mask = torch.empty(plan.packed, hidden).bernoulli_(
                        1 - between_p, generator=generator
                    )
                    padded = mask.new_zeros(stays * own_steps, hidden)
                    padded.index_copy_(0, packed_rows, mask.div_(1 - between_p))
                    between[seed_index, gap, :, :own_steps] = padded.view(stays, own_steps, -1)
            if output_p:
                mask = torch.empty(stays, own_steps, hidden).bernoulli_(
                    1 - output_p, generator=generator
                )
                outputs[seed_index, :, :own_steps] = mask.div_(1 - output_p)
        return [between.to(self.device), outputs.to(self.device)]

    def _set_noise(self, noise: list[Tensor]) -> None:
        """Hand one seed's masks (inside the vmap) to the template's dropouts."""
        if self.sequences:
            between, noise = noise[0], noise[1:]
            self.template.between_noise = between if between.numel() else None
        for module, mask in zip(self.dropouts, noise, strict=True):
            module.noise = mask

    def _probe_dropout_shapes(self) -> None:
        """Record each dropout's input shape on one seed's first batch (no draw)."""
        member = self.members[0]
        batch = member._to_device(member.train_split.batch(member._train_index()))
        for module in self.dropouts:
            module.record = True
        with torch.no_grad():
            functional_call(self.template, dict(member.model.named_parameters()), (batch,))
        for module in self.dropouts:
            module.record = False

    def _stack_regularizer_state(self) -> None:
        """The members' ReLiF buffers stacked (the live ones while training)."""
        if self.form == "looped" or self.reg_template is None:
            return
        regularizers = [member.regularizer for member in self.members]
        names = [name for name, _ in self.reg_template.named_buffers()]
        self.reg_state = {
            name: torch.stack([_tensor_of(reg, name).detach() for reg in regularizers])
            for name in names
        }

    def _sync_regularizers(self) -> None:
        """Copy the stacked ReLiF buffers back into each member's regularizer."""
        if self.form == "looped":
            return
        for seed_index, member in enumerate(self.members):
            if member.regularizer is None:
                return
            for name, stacked in self.reg_state.items():
                _tensor_of(member.regularizer, name).copy_(stacked[seed_index])

    def _share_state(self, to_members: bool) -> None:
        """The optimiser state of each parameter, from the fused optimiser into its member's
        (for the member's `state_dict`) or back (after its `load_state_dict`); the members'
        learning rates are the fused one's."""
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


@contextlib.contextmanager
def seed_stream(generator: torch.Generator) -> Iterator[None]:
    """The global CPU random stream as `generator`'s while the block runs (what a looped
    seed's dropout draws from, as its unfused trial's global stream), its state kept in
    `generator` after; the outer stream is left as it was."""
    outer = torch.get_rng_state()
    torch.set_rng_state(generator.get_state())
    try:
        yield
    finally:
        generator.set_state(torch.get_rng_state())
        torch.set_rng_state(outer)


def _tensor_of(module: nn.Module, name: str) -> Tensor:
    """The parameter or buffer `name` (dotted) of `module`."""
    owner, _, attribute = name.rpartition(".")
    return getattr(module.get_submodule(owner) if owner else module, attribute)
