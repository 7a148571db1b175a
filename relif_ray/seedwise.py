"""The pieces of the fused forward that keep each seed's arithmetic its own
(`relif_ray.fused`): the functions vmap would batch with other rounding, run once per seed
(`seedwise_functions`), and dropout whose masks are drawn per seed (`DrawnDropout`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relif_ray.errors import UserError

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

    def draw(self, generators: list[torch.Generator], device: torch.device) -> Tensor:
        """Every seed's mask for one forward, (S, *shape): seed s's drawn from its generator
        into its own contiguous slice (the draws of a tensor of that shape), then all divided
        by 1 - p at once (elementwise: each value as unfused)."""
        noise = torch.empty((len(generators), *self.shape), device=device)
        for row, generator in zip(noise, generators, strict=True):
            row.bernoulli_(1 - self.p, generator=generator)
        return noise.div_(1 - self.p)


def drawn_dropouts(model: nn.Module) -> list[DrawnDropout]:
    """Replace every `nn.Dropout` of `model` (in place) with a `DrawnDropout`, in forward
    (registration) order; a module with dropout of its own is refused."""
    drawn = []
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Dropout):
            replacement = DrawnDropout(module.p)
            owner, _, attribute = name.rpartition(".")
            setattr(model.get_submodule(owner) if owner else model, attribute, replacement)
            drawn.append(replacement)
        elif getattr(module, "dropout", 0) and not isinstance(module, DrawnDropout):
            raise UserError(
                f"config field train.fused_seeds: {type(module).__name__} draws its own "
                "dropout and is not fused"
            )
    return drawn
