"""The clinical multi-task model: a shared LSTM over hourly features with one head per task.

Paper (appendix, implementation table): 2-layer LSTM, hidden size 256, dropout 0.3; these come
from `ModelConfig.num_layers`, `hidden_size` and `dropout`. Dropout acts between the LSTM
layers and on the LSTM outputs before the heads (the benchmark's multitask LSTM also drops
out its LSTM outputs).

Variable lengths: a batch is padded to its longest stay and packed with
`pack_padded_sequence`, so the LSTM never reads padding and a stay's outputs do not depend on
what it is batched with; nothing is truncated.

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

`model.backbone` and `model.head_channels` do not apply (the backbone is always this LSTM).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from relif_ray.config import ModelConfig
from relif_ray.errors import UserError
from relif_ray.models.base import MultiTaskModel
from relif_ray.tasks.base import Batch, ModelOutput


@dataclass(frozen=True)
class HeadSpec:
    """One task head: its output width and where along the stay it reads the LSTM."""

    out_features: int
    readout: Literal["every_step", "last_step", "hour"]
    hour: int = 0


class ClinicalMTLModel(MultiTaskModel):
    """Shared LSTM + linear heads; forward(batch) reads batch["input"] and batch["lengths"]."""

    def __init__(self, config: ModelConfig, input_size: int, heads: dict[str, HeadSpec]) -> None:
        if config.pretrained != "none":
            raise UserError(
                f"config field model.pretrained: the clinical LSTM has no pretrained weights "
                f"(got {config.pretrained!r}; use none)"
            )
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
        self.heads = nn.ModuleDict(
            {name: nn.Linear(config.hidden_size, spec.out_features) for name, spec in heads.items()}
        )

    def forward(self, batch: Batch) -> ModelOutput:
        inputs, lengths = batch["input"], batch["lengths"]
        outputs, last_hidden = self._run_lstm(inputs, lengths)
        outputs = self.dropout(outputs)
        rows = torch.arange(inputs.shape[0], device=inputs.device)
        last_step = _to(lengths - 1, inputs.device)
        predictions = {}
        for name, spec in self.head_specs.items():
            if spec.readout == "every_step":
                features = outputs
            elif spec.readout == "last_step":
                features = outputs[rows, last_step]
            else:
                features = outputs[rows, last_step.clamp(max=spec.hour - 1)]
            logits = self.heads[name](features)
            predictions[name] = logits.squeeze(-1) if spec.out_features == 1 else logits
        return ModelOutput(
            predictions=predictions, representation=last_hidden[-1], encoder_output=outputs
        )

    def _run_lstm(self, inputs: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """LSTM outputs (B, T, H), zero past each stay's end, and the last hidden states
        (layers, B, H), both in batch order.

        The lengths stay on the host (transfer.HOST_KEYS), where packing reads them. The batch
        is sorted by length here, on the host, rather than by `enforce_sorted=False`, whose
        unpacking copies the sort order back from the device and so waits for it every step.
        """
        order = torch.argsort(lengths, descending=True, stable=True)
        restore = torch.argsort(order)
        packed = pack_padded_sequence(
            inputs[_to(order, inputs.device)], lengths[order], batch_first=True
        )
        packed_outputs, (last_hidden, _) = self.lstm(packed)
        outputs, _ = pad_packed_sequence(
            packed_outputs, batch_first=True, total_length=inputs.shape[1]
        )
        restore = _to(restore, inputs.device)
        return outputs[restore], last_hidden[:, restore]

    def shared_parameters(self) -> list[nn.Parameter]:
        return list(self.lstm.parameters())

    def last_shared_parameters(self) -> list[nn.Parameter]:
        top = self.lstm.num_layers - 1
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        return [getattr(self.lstm, f"{name}_l{top}") for name in names]


def _to(index: Tensor, device: torch.device) -> Tensor:
    """A host index tensor on `device`, copied without waiting for the device."""
    return index.to(device, non_blocking=True)
