"""The clinical multi-task model: a shared LSTM over hourly features with one head per task.

Paper (appendix, implementation table): 2-layer LSTM, hidden size 256, dropout 0.3; these come
from `ModelConfig.num_layers`, `hidden_size` and `dropout`. Dropout acts between the LSTM
layers and on the LSTM outputs before the heads (the benchmark's multitask LSTM also drops
out its LSTM outputs).

Variable lengths: a batch is padded to its longest stay and packed exactly as
`pack_padded_sequence` packs it (in one gather: `packing_plan`), so the LSTM never reads
padding and a stay's outputs do not depend on what it is batched with; nothing is truncated.

Each head is a linear layer on the LSTM output, read out in one of three ways:
* "every_step": at every hourly step, (B, T, out) - decompensation, length of stay;
* "last_step": at the stay's last valid step, (B, out) - phenotype;
* "hour": at the step of a given hour (step hour - 1, or the last step of shorter stays, whose
  label is masked anyway), (B, out) - in-hospital mortality at 48 hours, the benchmark's
  ihm_pos.
A head with one output drops that dimension: (B, T) or (B,).

Shared representation (ReLiF's prototypes and the audit's distances): the top LSTM layer's
hidden state at the stay's last valid step (h_n of the packed sequence), before dropout. The
encoder output every head reads (`ModelOutput.encoder_output`) is the LSTM outputs after
dropout, (B, T, H).

Stacked seeds (`relif_ray.fused`): with `unrolled` set, hard sharing runs its LSTM as the
same recursion written out in batched products over the padded batches of all seeds
(`unrolled_lstm`, through `relif_ray.seedwise.stacked_lstm`); a causal recursion's outputs at
a stay's valid steps do not depend on the padding after them, so only the rounding differs
from `nn.LSTM`'s.

`model.backbone` and `model.head_channels` do not apply (the backbone is always this LSTM).

Hard parameter sharing is `ClinicalMTLModel`; the expert architectures (MMoE, CGC, PLE,
DSelect-k: `relif_ray.models.architectures`) are `ClinicalArchitectureModel`, a trunk of LSTM
experts with the same heads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from relif_ray.config import ModelConfig
from relif_ray.errors import UserError
from relif_ray.models.base import MultiTaskModel, TaskTrunk
from relif_ray.tasks.base import Batch, ModelOutput
from relif_ray.transfer import move_tensor


@dataclass(frozen=True)
class HeadSpec:
    """One task head: its output width and where along the stay it reads the LSTM."""

    out_features: int
    readout: Literal["every_step", "last_step", "hour"]
    hour: int = 0


def check_no_pretrained(config: ModelConfig) -> None:
    """The clinical LSTM is always trained from scratch."""
    if config.pretrained != "none":
        raise UserError(
            f"config field model.pretrained: the clinical LSTM has no pretrained weights "
            f"(got {config.pretrained!r}; use none)"
        )


class ClinicalMTLModel(MultiTaskModel):
    """Hard parameter sharing (`model.architecture: hps`): one LSTM read by every linear head;
    forward(batch) reads batch["input"] and batch["lengths"]."""

    def __init__(self, config: ModelConfig, input_size: int, heads: dict[str, HeadSpec]) -> None:
        check_no_pretrained(config)
        super().__init__()
        self.head_specs = dict(heads)
        self.lstm = nn.LSTM(
            input_size=input_size,
            hidden_size=config.hidden_size,
            num_layers=config.num_layers,
            batch_first=True,
            dropout=config.dropout if config.num_layers > 1 else 0.0,
        )
        self.dropout = nn.Dropout(config.dropout)
        self.heads = linear_heads(config.hidden_size, heads)
        self.unrolled: Callable[[Tensor, list[Tensor], Tensor | None], Tensor] | None = None
        """What runs the LSTM over the padded batch, given its `lstm_weights` (a stacked fused
        forward's `relif_ray.seedwise.stacked_lstm`); None: `nn.LSTM` over the packed stays."""
        self.between_noise: Tensor | None = None
        """With `unrolled`, in training: the scaled dropout masks between the LSTM's layers,
        (layers - 1, B, T, H), drawn by the fused run as `nn.LSTM` draws them."""

    def forward(self, batch: Batch) -> ModelOutput:
        inputs = batch["input"]
        if self.unrolled is not None:
            stays = PaddedStays(batch["lengths"] - 1, inputs.shape[1])
            outputs = self.unrolled(inputs, lstm_weights(self.lstm), self.between_noise)
            rows = torch.arange(inputs.shape[0], device=inputs.device)
            representation = outputs[rows, stays.last_step]
            outputs = outputs * stays.valid()[..., None].to(outputs.dtype)  # zero past the end
        else:
            stays = Stays(inputs, batch["lengths"])
            outputs, last_hidden = stays.run(self.lstm, inputs)
            representation = last_hidden[-1]
        outputs = self.dropout(outputs)
        predictions = read_out(
            self.heads, self.head_specs, dict.fromkeys(self.heads, outputs), stays
        )
        return ModelOutput(
            predictions=predictions, representation=representation, encoder_output=outputs
        )

    def shared_parameters(self) -> list[nn.Parameter]:
        return list(self.lstm.parameters())

    def last_shared_parameters(self) -> list[nn.Parameter]:
        return top_layer(self.lstm)


class ClinicalArchitectureModel(MultiTaskModel):
    """Another architecture's trunk of LSTM experts (`relif_ray.models.architectures`) with
    the linear heads; each task's head input is dropped out on its own. Representation: each
    task's head input at the stay's last valid step (before dropout, as hard sharing's h_n),
    concatenated in task order."""

    one_encoder_output = False

    def __init__(self, config: ModelConfig, heads: dict[str, HeadSpec], trunk: TaskTrunk) -> None:
        check_no_pretrained(config)
        super().__init__()
        self.architecture = trunk.name
        self.head_specs = dict(heads)
        self.trunk = trunk
        self.dropout = nn.Dropout(config.dropout)
        self.heads = linear_heads(config.hidden_size, heads)

    def forward(self, batch: Batch) -> ModelOutput:
        inputs = batch["input"]
        stays = Stays(inputs, batch["lengths"])
        encoded = self.trunk(inputs, stays)
        rows = torch.arange(inputs.shape[0], device=inputs.device)
        representation = torch.cat(
            [encoded.per_task[task][rows, stays.last_step] for task in self.heads], 1
        )
        dropped = {task: self.dropout(encoded.per_task[task]) for task in self.heads}
        return ModelOutput(
            predictions=read_out(self.heads, self.head_specs, dropped, stays),
            representation=representation,
            auxiliary_loss=encoded.auxiliary_loss,
        )

    def shared_parameters(self) -> list[nn.Parameter]:
        return self.trunk.shared_parameters()

    def last_shared_parameters(self) -> list[nn.Parameter]:
        return self.trunk.last_shared_parameters()


def linear_heads(hidden_size: int, heads: dict[str, HeadSpec]) -> nn.ModuleDict:
    return nn.ModuleDict(
        {name: nn.Linear(hidden_size, spec.out_features) for name, spec in heads.items()}
    )


def read_out(
    heads: nn.ModuleDict,
    specs: dict[str, HeadSpec],
    head_inputs: dict[str, Tensor],
    stays: Stays | PaddedStays,
) -> dict[str, Tensor]:
    """Each head applied to its task's LSTM outputs (B, T, H) where its readout says."""
    rows = torch.arange(stays.last_step.shape[0], device=stays.last_step.device)
    predictions = {}
    for name, spec in specs.items():
        outputs = head_inputs[name]
        if spec.readout == "every_step":
            features = outputs
        elif spec.readout == "last_step":
            features = outputs[rows, stays.last_step]
        else:
            features = outputs[rows, stays.last_step.clamp(max=spec.hour - 1)]
        logits = heads[name](features)
        predictions[name] = logits.squeeze(-1) if spec.out_features == 1 else logits
    return predictions


def lstm_weights(lstm: nn.LSTM) -> list[Tensor]:
    """`lstm`'s weights and biases, layer by layer (w_ih, w_hh, b_ih, b_hh): what
    `unrolled_lstm` reads (the live tensors: under `functional_call`, the call's)."""
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    return [getattr(lstm, f"{name}_l{layer}") for layer in range(lstm.num_layers) for name in names]


def unrolled_lstm(sequences: Tensor, weights: list[Tensor], between: Tensor | None) -> Tensor:
    """The outputs (S, B, T, H) of S unidirectional LSTMs, each over its own padded batch
    (`sequences` (S, B, T, F); `weights` as `lstm_weights`, each with a leading S), step by
    step in batched products (i, f, g, o gates as `nn.LSTM`'s); each layer's outputs are
    multiplied by `between[:, layer]` (scaled dropout masks, (S, layers - 1, B, T, H))
    before the next.

    Each layer projects all its inputs at once, then steps through time on `unbind`'s views:
    indexing step t would make its backward fill a zero gradient of the whole projection at
    every step (what makes the packed `nn.LSTM`'s backward slow on the CPU)."""
    layer_input = sequences
    layers = len(weights) // 4
    for layer in range(layers):
        weight_ih, weight_hh, bias_ih, bias_hh = weights[4 * layer : 4 * layer + 4]
        seeds, stays, steps, features = layer_input.shape
        projected = torch.baddbmm(
            (bias_ih + bias_hh)[:, None, :],
            layer_input.reshape(seeds, stays * steps, features),
            weight_ih.transpose(1, 2),
        ).view(seeds, stays, steps, -1)
        recurrent = weight_hh.transpose(1, 2)
        hidden = projected.new_zeros(seeds, stays, weight_hh.shape[2])
        cell = hidden
        outputs = []
        for gates_in in projected.unbind(2):
            gates = torch.baddbmm(gates_in, hidden, recurrent)
            in_gate, forget, candidate, out_gate = gates.chunk(4, -1)
            cell = torch.sigmoid(forget) * cell + torch.sigmoid(in_gate) * torch.tanh(candidate)
            hidden = torch.sigmoid(out_gate) * torch.tanh(cell)
            outputs.append(hidden)
        layer_input = torch.stack(outputs, 2)
        if between is not None and layer < layers - 1:
            layer_input = layer_input * between[:, layer]
    return layer_input


def steps_within(last_step: Tensor, steps: int) -> Tensor:
    """(B, T) bool: which of `steps` time steps lie within each stay, given its last (B,)."""
    return torch.arange(steps, device=last_step.device)[None, :] <= last_step[:, None]


@dataclass(frozen=True)
class PaddedStays:
    """What the heads read of an unrolled batch: each stay's last step (B,) of T steps."""

    last_step: Tensor
    steps: int

    def valid(self) -> Tensor:
        """(B, T) bool: the steps within each stay."""
        return steps_within(self.last_step, self.steps)


def top_layer(lstm: nn.LSTM) -> list[nn.Parameter]:
    """The weights and biases of the top layer of `lstm`."""
    top = lstm.num_layers - 1
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    return [getattr(lstm, f"{name}_l{top}") for name in names]


class Stays:
    """A batch of padded stays (B, T, F) packed as `pack_padded_sequence` packs them, the plan
    made once per batch and shared by every LSTM that reads it (the experts of an
    architecture, each level of PLE).

    The packed sequence is exactly `pack_padded_sequence`'s (stays by decreasing length, ties
    in batch order), and the outputs exactly `pad_packed_sequence`'s put back in batch order,
    but each is one gather or scatter of rows (`packing_plan`): torch's functions copy one
    slice per distinct stay length, forward and backward, hundreds of ATen calls (kernel
    launches on a GPU) per step at batch 64. The lengths stay on the host
    (transfer.HOST_KEYS), where the plan is made; its indices reach the device in one
    asynchronous copy (reading anything back would make the host wait).
    """

    def __init__(self, inputs: Tensor, lengths: Tensor) -> None:
        self.batch_size, self.steps = inputs.shape[:2]
        plan = packing_plan(lengths, self.steps)
        indices = move_tensor(plan.indices, inputs.device)
        self.packed_rows, self.restore, self.last_step = indices.split(
            [plan.packed, self.batch_size, self.batch_size]
        )
        """Where each packed row lies in the (B * T) rows, each stay's place in the packing
        order, and each stay's last step (B,), on the device."""
        self.batch_sizes = plan.batch_sizes

    def run(self, lstm: nn.LSTM, sequences: Tensor) -> tuple[Tensor, Tensor]:
        """`lstm` over the packed `sequences` (B, T, F): its outputs (B, T, H), zero past each
        stay's end, and its last hidden states (layers, B, H), both in batch order."""
        flat = sequences.reshape(self.batch_size * self.steps, -1)
        packed = PackedSequence(flat.index_select(0, self.packed_rows), self.batch_sizes)
        packed_outputs, (last_hidden, _) = lstm(packed)
        data = packed_outputs.data
        outputs = data.new_zeros(self.batch_size * self.steps, data.shape[-1])
        outputs = outputs.index_copy(0, self.packed_rows, data)
        return outputs.view(self.batch_size, self.steps, -1), last_hidden[:, self.restore]

    def valid(self) -> Tensor:
        """(B, T) bool: the steps within each stay."""
        return steps_within(self.last_step, self.steps)


@dataclass(frozen=True)
class PackingPlan:
    """Host-side indices of one batch's packed sequence (see `packing_plan`)."""

    indices: Tensor
    """(packed + 2 B,) long: the packed rows, `restore`, then each stay's last step."""
    batch_sizes: Tensor
    """Stays still running at each time step (the LSTM's `batch_sizes`, on the host)."""
    packed: int
    """Number of packed rows (the sum of the lengths)."""


def packing_plan(lengths: Tensor, steps: int) -> PackingPlan:
    """Where `pack_padded_sequence` takes each packed row from, for a batch-first batch of
    `steps` time steps with these (host) lengths: time step by time step, the stays still
    running by decreasing length (ties in batch order), each as its row in the (B * steps)
    flattening of the padded batch. `restore[b]` is stay b's place in that length order.
    Host work only: every tensor here is made from the host's lengths."""
    if int(lengths.min()) < 1:
        raise ValueError("every stay needs at least one time step")
    order = torch.argsort(lengths, descending=True, stable=True)
    step_numbers = torch.arange(steps, out=lengths.new_empty(steps))
    running = step_numbers[:, None] < lengths[order][None, :]  # (steps, B)
    step, rank = running.nonzero(as_tuple=True)  # time step by time step
    packed_rows = order[rank] * steps + step
    batch_sizes = running.sum(dim=1)[: int(lengths.max())]
    indices = torch.cat([packed_rows, torch.argsort(order), lengths - 1])
    return PackingPlan(indices, batch_sizes, len(packed_rows))
