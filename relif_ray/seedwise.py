"""The pieces of the fused forward that keep each seed's arithmetic its own
(`relif_ray.fused`): the functions vmap would batch with other rounding, run once per seed
(`seedwise_functions`), and dropout whose masks are drawn per seed (`DrawnDropout`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from relif_ray.errors import UserError
from relif_ray.models.clinical import packing_plan, unrolled_lstm

_LINEAR = F.linear
_BCE_WITH_LOGITS = F.binary_cross_entropy_with_logits


@torch.library.custom_op("relif::seedwise_linear", mutates_args=())
def seedwise_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """`F.linear`; under the fused step's vmap one `F.linear` per seed (`_per_seed`)."""
    return _LINEAR(x, weight, bias)


@torch.library.custom_op("relif::seedwise_bce_with_logits", mutates_args=())
def seedwise_bce_with_logits(logits: Tensor, target: Tensor, reduction: str) -> Tensor:
    """`F.binary_cross_entropy_with_logits`; under the fused step's vmap one call per seed."""
    return _BCE_WITH_LOGITS(logits, target, reduction=reduction)


@seedwise_linear.register_fake
def _linear_shape(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@seedwise_bce_with_logits.register_fake
def _bce_shape(logits: Tensor, target: Tensor, reduction: str) -> Tensor:
    return logits.new_empty(logits.shape if reduction == "none" else ())


def _per_seed(function: Callable[..., Tensor]) -> Callable:
    """A vmap rule that calls `function` once per seed on that seed's slices (recorded as
    such by autograd) and stacks the results: seed s's op, its rounding and its backward are
    those of its unfused trial. Non-tensor arguments pass as they are."""

    def rule(info, in_dims: tuple, *args: object) -> tuple[Tensor, int]:  # noqa: ANN001
        def per_seed(value: object, dim: int | None) -> list:
            if dim is None or not isinstance(value, Tensor):
                return [value] * info.batch_size
            return list(value.movedim(dim, 0))

        rows = zip(*(per_seed(v, d) for v, d in zip(args, in_dims, strict=True)), strict=True)
        return torch.stack([function(*row) for row in rows]), 0

    return rule


seedwise_linear.register_vmap(_per_seed(_LINEAR))
seedwise_bce_with_logits.register_vmap(
    _per_seed(
        lambda logits, target, reduction: _BCE_WITH_LOGITS(logits, target, reduction=reduction)
    )  # noqa: E501
)


@torch.library.custom_op("relif::stacked_lstm", mutates_args=())
def stacked_lstm(sequences: Tensor, weights: list[Tensor], between: Tensor | None) -> Tensor:
    """One seed's LSTM outputs (B, T, H) over its padded `sequences` (B, T, F), given its
    `lstm_weights` and dropout masks between layers ((layers - 1, B, T, H) or None); under
    the fused step's vmap all seeds' as one batched recursion (`unrolled_lstm`, whose
    products take every seed at once: vmap's own rules would dispatch each of the
    recursion's ops through the vmap once more, 1.6x the time at 10 seeds)."""
    stacked = [weight[None] for weight in weights]
    return unrolled_lstm(sequences[None], stacked, None if between is None else between[None])[0]


@stacked_lstm.register_fake
def _lstm_shape(sequences: Tensor, weights: list[Tensor], between: Tensor | None) -> Tensor:
    return sequences.new_empty((*sequences.shape[:-1], weights[1].shape[1]))


def _stacked_lstm_rule(info, in_dims: tuple, sequences, weights, between):  # noqa: ANN001, ANN202
    """The vmap rule: every argument with its seed dimension first, one `unrolled_lstm`."""
    sequence_dim, weight_dims, between_dim = in_dims

    def seed_first(value: Tensor, dim: int | None) -> Tensor:
        if dim is None:
            return value.expand(info.batch_size, *value.shape)
        return value.movedim(dim, 0)

    weights = [seed_first(w, d) for w, d in zip(weights, weight_dims, strict=True)]
    if between is not None:
        between = seed_first(between, between_dim)
    return unrolled_lstm(seed_first(sequences, sequence_dim), weights, between), 0


stacked_lstm.register_vmap(_stacked_lstm_rule)


def _bce_with_logits(  # noqa: PLR0913 (F.binary_cross_entropy_with_logits' own signature)
    input: Tensor,  # noqa: A002
    target: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
    pos_weight: Tensor | None = None,
) -> Tensor:
    if weight is None and pos_weight is None and size_average is None and reduce is None:
        return seedwise_bce_with_logits(input, target, reduction)
    return _BCE_WITH_LOGITS(input, target, weight, size_average, reduce, reduction, pos_weight)


SEEDWISE_FUNCTIONS: dict[str, Callable] = {
    "linear": seedwise_linear,
    "binary_cross_entropy_with_logits": _bce_with_logits,
}
"""The `torch.nn.functional` functions that the fused step runs once per seed: vmap's own
rule batches a matrix product into one `bmm` and decomposes the binary cross-entropy into
elementwise ops, whose rounding differs in the last bits from the unfused op, and the
discrete parts of a step (ReLiF's prototype selection and violation count) turn such bits
into different trajectories. Every other op of the tabular step (elementwise, reductions,
sorts, the softmax and cross-entropy) is bit for bit the same batched (`tests/test_fused.py`)."""


@contextlib.contextmanager
def seedwise_functions() -> Iterator[None]:
    """`SEEDWISE_FUNCTIONS` in place of torch's own while the fused forward runs."""
    originals = {name: getattr(F, name) for name in SEEDWISE_FUNCTIONS}
    try:
        for name, function in SEEDWISE_FUNCTIONS.items():
            setattr(F, name, function)
        yield
    finally:
        for name, function in originals.items():
            setattr(F, name, function)


class DrawnDropout(nn.Module):
    """Dropout with a mask drawn outside the fused forward (`noise`, already scaled by
    1 / (1 - p)), identity in evaluation.

    Unfused, `nn.Dropout` on the CPU draws `empty_like(x).bernoulli_(1 - p)`, divides it by
    1 - p and multiplies: `draw` makes that very mask from a seed's own generator, so each
    seed's masks are its unfused trial's, bit for bit. `shape` is recorded on a probe forward
    (`record`), before any draw."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.noise: Tensor | None = None
        self.shape: torch.Size | None = None
        self.record = False

    def forward(self, x: Tensor) -> Tensor:
        if self.record:
            self.shape = x.shape
            return x
        if not self.training or self.p == 0.0:
            return x
        return x * self.noise

    def masks(
        self, generators: list[torch.Generator], device: torch.device, training: bool
    ) -> Tensor:
        """`draw`, where a train-mode forward draws (as unfused: nothing for p = 0 or in
        evaluation, an empty (S, 0) then)."""
        if self.p == 0.0 or not training:
            return torch.zeros(len(generators), 0)
        return self.draw(generators, device)

    def draw(self, generators: list[torch.Generator], device: torch.device) -> Tensor:
        """Every seed's mask for one forward, (S, *shape): seed s's drawn from its generator
        into its own contiguous slice (the draws of a tensor of that shape), then all divided
        by 1 - p at once (elementwise: each value as unfused)."""
        noise = torch.empty((len(generators), *self.shape), device=device)
        for row, generator in zip(noise, generators, strict=True):
            row.bernoulli_(1 - self.p, generator=generator)
        return noise.div_(1 - self.p)


def drawn_dropouts(
    model: nn.Module, drawn_by_caller: tuple[nn.Module, ...] = ()
) -> list[DrawnDropout]:
    """Replace every `nn.Dropout` of `model` (in place) with a `DrawnDropout`, in forward
    (registration) order; a module with dropout of its own is refused unless the caller
    draws its masks (`drawn_by_caller`: the unrolled clinical LSTM's)."""
    drawn = []
    for name, module in list(model.named_modules()):
        if any(module is own for own in drawn_by_caller):
            continue
        if isinstance(module, nn.Dropout):
            replacement = DrawnDropout(module.p)
            owner, _, attribute = name.rpartition(".")
            setattr(model.get_submodule(owner) if owner else model, attribute, replacement)
            drawn.append(replacement)
        elif isinstance(rate := getattr(module, "dropout", 0), float) and rate > 0:
            raise UserError(
                f"config field train.fused_seeds: {type(module).__name__} draws its own "
                "dropout and is not fused"
            )
    return drawn


def record_dropout_shapes(
    template: nn.Module, dropouts: list[DrawnDropout], model: nn.Module, batch: dict
) -> None:
    """Record each of `template`'s drawn dropouts' input shape on a forward of `model`'s
    parameters on `batch` (no draw)."""
    for module in dropouts:
        module.record = True
    with torch.no_grad():
        functional_call(template, dict(model.named_parameters()), (batch,))
    for module in dropouts:
        module.record = False


def lstm_dropout_masks(
    lstm: nn.LSTM,
    output_dropout: nn.Module,
    batch: dict[str, Tensor],
    generators: list[torch.Generator],
    training: bool,
    device: torch.device,
) -> list[Tensor]:
    """The stacked clinical LSTM's masks (`relif_ray.fused`), [between its layers (S, layers
    - 1, B, T, H), on its outputs (S, B, T, H)], each seed's drawn from its generator as its
    unfused trial's `nn.LSTM` and `nn.Dropout` draw them: per gap between layers one mask of
    the packed sequence (its valid steps, in packing order: `packing_plan`), then one of the
    outputs padded to the seed's own longest stay; each then laid out in the stacked batch's
    padding (zero where no stay is)."""
    seeds, stays, steps = batch["input"].shape[:3]
    hidden, gaps = lstm.hidden_size, lstm.num_layers - 1
    between_p = lstm.dropout if training and gaps else 0.0
    output_p = output_dropout.p if training else 0.0
    between = torch.zeros((seeds, gaps, stays, steps, hidden) if between_p else (seeds, 0))
    outputs = torch.zeros((seeds, stays, steps, hidden) if output_p else (seeds, 0))
    for seed_index, generator in enumerate(generators):
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
    return [between.to(device), outputs.to(device)]


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
