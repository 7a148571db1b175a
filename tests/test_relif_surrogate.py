"""Huber transform, huberized hinge, cosine distance and prototype pairs (paper section 4)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics.pairwise import cosine_distances

from relif_ray.relif.surrogate import (
    constant,
    cosine_distance,
    huber_rho,
    huberized_hinge,
    is_finite,
    masked_quantiles,
    prototype_pairs,
)

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False)
positive = st.floats(min_value=1e-3, max_value=10.0)


@pytest.mark.parametrize(
    ("u", "expected"),
    [
        (0.0, 0.0),
        (0.05, 0.05**2 / 0.2),
        (-0.05, 0.05**2 / 0.2),
        (0.1, 0.05),
        (0.3, 0.25),
        (-2.0, 1.95),
    ],
)
def test_huber_rho_closed_form(u: float, expected: float) -> None:
    assert huber_rho(torch.tensor(u, dtype=torch.float64), 0.1).item() == pytest.approx(expected)


@pytest.mark.parametrize(
    ("z", "expected"),
    [(-1.0, 0.0), (0.0, 0.0), (0.025, 0.025**2 / 0.1), (0.05, 0.025), (0.2, 0.175)],
)
def test_huberized_hinge_closed_form(z: float, expected: float) -> None:
    value = huberized_hinge(torch.tensor(z, dtype=torch.float64), 0.05).item()
    assert value == pytest.approx(expected)


@given(z=finite, mu=positive)
def test_hinge_gap_bound(z: float, mu: float) -> None:
    """Theorem B.4: 0 <= (z)_+ - phi_mu(z) <= mu / 2."""
    phi = huberized_hinge(torch.tensor(z, dtype=torch.float64), mu).item()
    difference = max(z, 0.0) - phi
    assert -1e-12 <= difference <= mu / 2 + 1e-12


@given(u=finite, beta=positive)
def test_huber_rho_is_even_and_between_bounds(u: float, beta: float) -> None:
    """rho is even, and |u| - beta/2 <= rho(u) <= |u| (a Huber function of |u|)."""
    value = huber_rho(torch.tensor(u, dtype=torch.float64), beta).item()
    mirrored = huber_rho(torch.tensor(-u, dtype=torch.float64), beta).item()
    assert value == mirrored
    assert abs(u) - beta / 2 - 1e-9 <= value <= abs(u) + 1e-9


def test_derivatives_are_continuous_at_the_knots() -> None:
    """rho' -> sign(u) and phi' -> 1 from both sides of beta and mu."""
    for function, knot in ((huber_rho, 0.1), (huberized_hinge, 0.05)):
        points = torch.tensor([knot - 1e-7, knot + 1e-7], dtype=torch.float64, requires_grad=True)
        function(points, knot).sum().backward()
        assert torch.allclose(points.grad, torch.ones(2, dtype=torch.float64), atol=1e-5)


def test_cosine_distance_matches_scikit_learn() -> None:
    generator = torch.Generator().manual_seed(0)
    u = torch.randn(5, 7, generator=generator, dtype=torch.float64)
    v = torch.randn(6, 7, generator=generator, dtype=torch.float64)
    ours = cosine_distance(u[:, None, :], v[None, :, :]).numpy()
    np.testing.assert_allclose(ours, cosine_distances(u.numpy(), v.numpy()) / 2, atol=1e-12)
    # scale-free: L2 normalisation first
    np.testing.assert_allclose(
        cosine_distance(3 * u[:, None, :], 0.1 * v[None, :, :]).numpy(), ours, atol=1e-12
    )


def reference_pairs(scores, valid, representation, per_task, pairing, floor=1e-3):
    """Loop-based reference: top scores among usable examples, then explicit pairs."""
    scores, valid, rep = scores.tolist(), valid.tolist(), representation.numpy()
    usable = [
        [
            valid[t][b] and math.isfinite(scores[t][b]) and np.isfinite(rep[b]).all()
            for b in range(len(scores[t]))
        ]
        for t in range(len(scores))
    ]
    chosen = [
        sorted((b for b in range(len(s)) if ok[b]), key=lambda b, s=s: -s[b])[:per_task]
        for s, ok in zip(scores, usable, strict=True)
    ]
    result = []
    for i, j in itertools.combinations(range(len(scores)), 2):
        if pairing == "cross":
            combos = itertools.product(chosen[i], chosen[j])
        else:
            combos = zip(chosen[i], chosen[j], strict=False)  # rank: shorter list
        for x, y in combos:
            distance = cosine_distances(rep[[x]], rep[[y]])[0, 0] / 2
            result.append((scores[i][x] - scores[j][y], max(distance, floor)))
    return sorted(result)


@pytest.mark.parametrize("pairing", ["cross", "rank"])
def test_prototype_pairs_match_loop_reference(pairing: str) -> None:
    generator = torch.Generator().manual_seed(1)
    scores = torch.rand(3, 7, generator=generator, dtype=torch.float64)
    valid = torch.rand(3, 7, generator=generator) > 0.3
    representation = torch.randn(7, 5, generator=generator, dtype=torch.float64)
    representation[4] = representation[2]  # a duplicate input: d = 0 -> floor
    scores[1, 0] = float("nan")
    representation[6, 1] = float("inf")
    pairs = prototype_pairs(scores, valid, representation, per_task=3, pairing=pairing)
    got = sorted(
        zip(pairs.gap[pairs.mask].tolist(), pairs.distance[pairs.mask].tolist(), strict=True)
    )
    expected = reference_pairs(scores, valid, representation, 3, pairing)
    assert len(got) == len(expected) > 0
    np.testing.assert_allclose(np.array(got), np.array(expected), atol=1e-12)
    assert torch.isfinite(pairs.gap).all() and torch.isfinite(pairs.distance).all()


def test_fewer_usable_examples_than_prototypes_and_same_example_pairs() -> None:
    scores = torch.tensor([[0.9, 0.1, 0.5], [0.7, 0.8, 0.4]], dtype=torch.float64)
    valid = torch.tensor([[True, False, False], [True, True, True]])
    representation = torch.eye(3, dtype=torch.float64)
    pairs = prototype_pairs(scores, valid, representation, per_task=2)
    # task 0 has one usable example (0); task 1 contributes its top two (1, 0)
    assert int(pairs.mask.sum()) == 2
    got = sorted(
        zip(pairs.gap[pairs.mask].tolist(), pairs.distance[pairs.mask].tolist(), strict=True)
    )
    np.testing.assert_allclose(got, [(0.9 - 0.8, 0.5), (0.9 - 0.7, 1e-3)], atol=1e-12)


def test_gradients_are_finite_and_zero_for_dropped_examples() -> None:
    scores = torch.tensor([[0.9, float("nan"), 0.5], [0.2, 0.8, 0.4]], requires_grad=True)
    representation = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    representation[2, 0] = float("nan")
    representation.requires_grad_(True)
    valid = torch.ones(2, 3, dtype=torch.bool)
    pairs = prototype_pairs(scores, valid, representation, per_task=3)
    loss = (torch.where(pairs.mask, pairs.gap.square() + pairs.distance, 0.0)).sum()
    loss.backward()
    assert torch.isfinite(scores.grad).all() and torch.isfinite(representation.grad).all()
    assert scores.grad[0, 1] == 0 and scores.grad[:, 2].eq(0).all()
    assert representation.grad[2].eq(0).all()
    assert scores.grad[0, 0] != 0 and representation.grad[0].ne(0).any()


@settings(max_examples=30, deadline=None)
@given(per_task=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_pair_count(per_task: int, seed: int) -> None:
    """cross: k_i k_j pairs per task pair; rank: min(k_i, k_j)."""
    generator = torch.Generator().manual_seed(seed)
    valid = torch.rand(3, 5, generator=generator) > 0.4
    scores = torch.rand(3, 5, generator=generator)
    representation = torch.randn(5, 2, generator=generator)
    counts = [min(per_task, int(v.sum())) for v in valid]
    cross = prototype_pairs(scores, valid, representation, per_task, "cross").mask.sum()
    rank = prototype_pairs(scores, valid, representation, per_task, "rank").mask.sum()
    pairs = list(itertools.combinations(counts, 2))
    assert int(cross) == sum(a * b for a, b in pairs)
    assert int(rank) == sum(min(a, b) for a, b in pairs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masked_quantiles_are_torch_nanquantile_bit_for_bit(dtype: torch.dtype) -> None:
    """Against torch.nanquantile of the masked-out entries set to NaN (equality, not closeness:
    the scale buffers and the pinned numbers depend on every bit), and numpy's quantile;
    rows without a masked-in entry give NaN. Sizes 1..40, ties, levels at and between ranks."""
    generator = torch.Generator().manual_seed(0)
    levels = (0.0, 0.1, 0.3, 0.5, 0.9, 0.95, 1.0)
    for size in range(1, 41):
        values = torch.rand(3, size, generator=generator, dtype=dtype) * 10 ** (size % 5 - 2)
        if size % 4 == 0:
            values = (values * 4).round() / 4  # ties
        mask = torch.rand(3, size, generator=generator) > 0.3
        mask[2] = False  # a row with nothing masked in
        masked = torch.where(mask, values, torch.nan)
        for level, ours in zip(levels, masked_quantiles(values, mask, levels), strict=True):
            expected = torch.nanquantile(masked, level, dim=-1)
            assert ours.dtype == dtype and ours[2].isnan()
            torch.testing.assert_close(ours, expected, rtol=0, atol=0, equal_nan=True)
            if mask[0].any():  # and numpy's (linear) quantile of the masked-in entries
                reference = np.quantile(values[0][mask[0]].numpy(), level)
                assert ours[0].item() == pytest.approx(reference, rel=1e-6)
    shared = torch.tensor([True, False, True, True])  # one mask broadcast over both rows
    values = torch.tensor([[1.0, 9.0, 2.0, 4.0], [0.5, 9.0, 0.25, 0.0]])
    (ours,) = masked_quantiles(values, shared, (0.5,))
    assert ours.tolist() == [2.0, 0.25]


def test_is_finite_is_torch_isfinite() -> None:
    values = torch.tensor(
        [0.0, -0.0, 1.5, -3e38, 3e38, 1e-45, math.inf, -math.inf, math.nan], dtype=torch.float32
    )
    assert torch.equal(is_finite(values), torch.isfinite(values))
    assert torch.equal(is_finite(values.double()), torch.isfinite(values.double()))


def test_constants_are_made_once_per_value_dtype_and_device() -> None:
    like = torch.zeros(3, dtype=torch.float64)
    half = constant(0.5, like)
    assert half is constant(0.5, like) and half is not constant(0.5, like.float())
    assert (half.dtype, half.shape, half.item(), half.requires_grad) == (
        torch.float64,
        (),
        0.5,
        False,
    )
    with torch.inference_mode():  # made first under inference mode, still usable by autograd
        tenth = constant(0.1, like.float())
    leaf = torch.ones(2, requires_grad=True)
    (leaf / tenth).sum().backward()
    assert leaf.grad.tolist() == pytest.approx([10.0, 10.0])
