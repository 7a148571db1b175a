"""The ReLiF regularizer: margins, scale buffers, squash, controller wiring, ablations."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from relif_ray.config import ReLiFConfig
from relif_ray.errors import UserError
from relif_ray.relif import regularizer as regularizer_module
from relif_ray.relif.regularizer import STAT_KEYS, ReLiFRegularizer, squash_with_gradient
from relif_ray.squash import squash
from tests.host_sync import no_host_sync

TASKS = ["a", "b"]
PROBABILITY = {"a": True, "b": True}
ERM_BAND = {"b": [3.0, 6.0]}
"""Same-seed ERM validation q10/q90 of task b's raw scores, as a sweep would pass them."""


def config(**overrides: object) -> ReLiFConfig:
    values = dict(enabled=True, prototypes_per_task=2, warmup_steps=0, eta=0.5)
    values.update(overrides)
    return ReLiFConfig(**values)


def unit(degrees: float) -> list[float]:
    return [math.cos(math.radians(degrees)), math.sin(math.radians(degrees))]


def batch(a=(0.9, 0.5, 0.1), b=(0.1, 0.45, 0.2), valid_b=(True, True, True)):
    """Three examples at 0, 60 and 90 degrees. Prototypes (top 2): a -> {0, 1}, b -> {1, 2};
    cross pairs (0,1) (0,2) (1,1) (1,2) have d' = 0.25, 0.5, 1e-3 (same example), (1-cos30)/2."""
    scores = {
        "a": (
            torch.tensor(a, dtype=torch.float64, requires_grad=True),
            torch.ones(3, dtype=torch.bool),
        ),
        "b": (torch.tensor(b, dtype=torch.float64, requires_grad=True), torch.tensor(valid_b)),
    }
    representation = torch.tensor([unit(0), unit(60), unit(90)], dtype=torch.float64)
    return scores, representation.requires_grad_(True)


PAIR_INDEX = [(0, 1), (0, 2), (1, 1), (1, 2)]
DISTANCES = np.array([0.25, 0.5, 1e-3, (1 - math.cos(math.radians(30))) / 2])


def rho(u: np.ndarray, beta: float = 0.1) -> np.ndarray:
    u = np.abs(u)
    return np.where(u <= beta, u**2 / (2 * beta), u - beta / 2)


def phi(z: np.ndarray, mu: float = 0.05) -> np.ndarray:
    z = np.maximum(z, 0)
    return np.where(z <= mu, z**2 / (2 * mu), z - mu / 2)


def expected_step(a, b, tau_prev=None, kappa_prev=None, aligned=True):
    gaps = np.array([a[x] - b[y] for x, y in PAIR_INDEX])
    if aligned:
        tau_hat = np.quantile(np.abs(gaps), 0.95)
        kappa_hat = np.quantile(DISTANCES, 0.95)
        tau = tau_hat if tau_prev is None else 0.9 * tau_prev + 0.1 * tau_hat
        kappa = kappa_hat if kappa_prev is None else 0.9 * kappa_prev + 0.1 * kappa_hat
    else:
        tau = kappa = 1.0
    z = rho(gaps) / tau - DISTANCES / kappa
    return dict(tau=tau, kappa=kappa, loss_lip=phi(z).mean(), r=(z > 0).mean())


def test_first_step_matches_closed_form() -> None:
    regularizer = ReLiFRegularizer(config(), TASKS).double()
    scores, representation = batch()
    loss, stats = regularizer(scores, representation, PROBABILITY)
    expected = expected_step((0.9, 0.5, 0.1), (0.1, 0.45, 0.2))
    for key in ("tau", "kappa", "loss_lip", "r"):
        assert stats[key].item() == pytest.approx(expected[key], rel=1e-9), key
    assert 0 < expected["r"] < 1 and expected["loss_lip"] > 0  # a case that exercises both sides
    lam = 0.1 * (1 + 0.5 * (expected["r"] - 0.24))
    assert stats["lambda"].item() == pytest.approx(lam)
    assert stats["r_ema"].item() == pytest.approx(expected["r"])
    assert loss.item() == pytest.approx(lam * expected["loss_lip"])


def test_scale_buffers_follow_the_ema() -> None:
    regularizer = ReLiFRegularizer(config(), TASKS).double()
    first = expected_step((0.9, 0.5, 0.1), (0.1, 0.45, 0.2))
    regularizer(*batch(), PROBABILITY)
    a, b = (0.6, 0.55, 0.1), (0.05, 0.9, 0.3)
    _, stats = regularizer(*batch(a, b), PROBABILITY)
    second = expected_step(a, b, first["tau"], first["kappa"])
    for key in ("tau", "kappa", "loss_lip", "r"):
        assert stats[key].item() == pytest.approx(second[key], rel=1e-9), key


def test_scale_buffers_are_clamped_below() -> None:
    regularizer = ReLiFRegularizer(config(), TASKS).double()
    scores, representation = batch(a=(0.5, 0.5, 0.0), b=(0.0, 0.5, 0.5))
    _, stats = regularizer(scores, representation.detach() * 0 + 1, PROBABILITY)
    assert stats["tau"].item() == pytest.approx(1e-4)  # all gaps 0
    assert stats["kappa"].item() == pytest.approx(1e-3)  # all d = 0 -> d' = eps_d


def test_gradients_reach_scores_and_representation_with_buffers_held_constant() -> None:
    regularizer = ReLiFRegularizer(config(), TASKS).double()
    scores, representation = batch()
    loss, _ = regularizer(scores, representation, PROBABILITY)
    loss.backward()
    assert scores["a"][0].grad.abs().sum() > 0 and representation.grad.abs().sum() > 0
    for name, buffer in regularizer.named_buffers():
        assert buffer.grad_fn is None and not buffer.requires_grad, name
    # Reference: the same loss with tau, kappa and lambda as plain constants.
    tau, kappa = regularizer.tau.item(), regularizer.kappa.item()
    lam = regularizer.controller.lambda_.item()
    ref_scores, ref_rep = batch()
    a, b = ref_scores["a"][0], ref_scores["b"][0]
    unit_rep = torch.nn.functional.normalize(ref_rep, dim=1)
    terms = []
    for x, y in PAIR_INDEX:
        gap = (a[x] - b[y]).abs()
        huber = torch.where(gap <= 0.1, gap**2 / 0.2, gap - 0.05)
        distance = ((1 - unit_rep[x] @ unit_rep[y]) / 2).clamp_min(1e-3)
        z = (huber / tau - distance / kappa).clamp_min(0)
        terms.append(torch.where(z <= 0.05, z**2 / 0.1, z - 0.025))
    (lam * torch.stack(terms).mean()).backward()
    torch.testing.assert_close(scores["a"][0].grad, a.grad)
    torch.testing.assert_close(scores["b"][0].grad, b.grad)
    torch.testing.assert_close(representation.grad, ref_rep.grad)


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {key: value.clone() for key, value in module.state_dict().items()}


def assert_same_state(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for key in before:
        torch.testing.assert_close(before[key], after[key], equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("warm", [False, True])
def test_no_valid_pair_changes_nothing(warm: bool) -> None:
    regularizer = ReLiFRegularizer(config(), TASKS).double()
    if warm:
        regularizer(*batch(), PROBABILITY)
    before = snapshot(regularizer)
    scores, representation = batch(valid_b=(False, False, False))
    loss, stats = regularizer(scores, representation, PROBABILITY)
    loss.backward()  # an exact zero with exactly zero (finite) gradients, even with NaN scales
    assert loss.item() == 0.0
    assert scores["a"][0].grad.abs().max().item() == 0.0
    assert representation.grad.abs().max().item() == 0.0
    assert_same_state(before, snapshot(regularizer))
    assert math.isnan(stats["r"].item()) and math.isnan(stats["loss_lip"].item())
    assert stats["lambda"].item() == before["controller.lambda_"].item()
    # non-finite values drop pairs the same way
    nan_scores, representation = batch(b=(float("nan"),) * 3)
    assert regularizer(nan_scores, representation, PROBABILITY)[0].item() == 0.0
    assert_same_state(before, snapshot(regularizer))


def test_a_step_without_pairs_leaves_the_following_steps_unchanged() -> None:
    """Interleaving pair-less steps changes no later number (section 4.5)."""
    plain = ReLiFRegularizer(config(warmup_steps=1), TASKS).double()
    interleaved = ReLiFRegularizer(config(warmup_steps=1), TASKS).double()
    interleaved(*batch(valid_b=(False, False, False)), PROBABILITY)
    for a, b in [((0.9, 0.5, 0.1), (0.1, 0.45, 0.2)), ((0.6, 0.55, 0.1), (0.05, 0.9, 0.3))] * 2:
        expected_loss, expected = plain(*batch(a, b), PROBABILITY)
        interleaved(*batch(valid_b=(False, False, False)), PROBABILITY)
        loss, stats = interleaved(*batch(a, b), PROBABILITY)
        assert loss.item() == expected_loss.item()
        # assert_equal treats NaN as equal to NaN (`clipped` is NaN without squashed tasks).
        np.testing.assert_equal(
            {k: v.item() for k, v in stats.items()}, {k: v.item() for k, v in expected.items()}
        )
    assert interleaved.controller.updates.item() == plain.controller.updates.item() == 4


def test_stats_are_detached_fresh_scalars() -> None:
    regularizer = ReLiFRegularizer(config(squash_constants=ERM_BAND), TASKS).double()
    mixed = {"a": True, "b": False}
    _, first = regularizer(*batch(b=(1.0, 9.0, 5.0)), mixed)
    keys = ("lambda", "r", "r_ema", "tau", "kappa", "loss_lip", "clipped")
    assert tuple(first) == STAT_KEYS == keys
    kept = {key: value.item() for key, value in first.items()}
    for _ in range(3):
        regularizer(*batch(a=(0.1, 0.95, 0.3)), mixed)
    for key, value in first.items():
        assert value.dim() == 0 and not value.requires_grad
        assert value.item() == kept[key], key  # not a view of a buffer updated in place


def test_trace_obeys_the_controller_recursion() -> None:
    regularizer = ReLiFRegularizer(config(warmup_steps=2, eta=2.0), TASKS).double()
    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(8):
        a, b = torch.rand(2, 3, generator=generator, dtype=torch.float64).tolist()
        rows.append({k: v.item() for k, v in regularizer(*batch(a, b), PROBABILITY)[1].items()})
    lam, r_ema = 0.1, None
    for t, row in enumerate(rows, start=1):
        r_ema = row["r"] if r_ema is None else 0.1 * row["r"] + 0.9 * r_ema
        if t > 2:
            lam = min(max(lam * (1 + 2.0 * (r_ema - 0.24)), 0.01), 1.0)
        assert row["r_ema"] == pytest.approx(r_ema) and row["lambda"] == pytest.approx(lam)
    assert len({row["lambda"] for row in rows}) > 2


def test_non_probability_scores_are_squashed_with_running_quantiles() -> None:
    regularizer = ReLiFRegularizer(config(squash="running"), TASKS).double()
    is_probability = {"a": True, "b": False}
    raw_b = np.array([2.0, 7.0, 4.0])
    regularizer(*batch(b=tuple(raw_b)), is_probability)
    low, high = np.quantile(raw_b, [0.1, 0.9])
    assert regularizer.squash_low[1].item() == pytest.approx(low)
    assert regularizer.squash_high[1].item() == pytest.approx(high)
    raw_b2 = np.array([1.0, 9.0, 5.0])
    _, stats = regularizer(*batch(b=tuple(raw_b2)), is_probability)
    low2 = 0.9 * low + 0.1 * np.quantile(raw_b2, 0.1)
    high2 = 0.9 * high + 0.1 * np.quantile(raw_b2, 0.9)
    assert regularizer.squash_high[1].item() == pytest.approx(high2)
    squashed = np.clip((raw_b2 - low2) / (high2 - low2 + 1e-6), 0, 1)
    gaps = np.array([(0.9, 0.5, 0.1)[x] - squashed[y] for x, y in PAIR_INDEX])
    z = rho(gaps) / stats["tau"].item() - DISTANCES / stats["kappa"].item()
    assert stats["loss_lip"].item() == pytest.approx(phi(z).mean(), rel=1e-9)


def test_erm_squash_uses_the_fixed_erm_quantiles_of_the_audit() -> None:
    """Training gaps use clip((s - q10) / (q90 - q10 + 1e-6), 0, 1) with the ERM constants,
    exactly the audit's squash, and the constants never move."""
    regularizer = ReLiFRegularizer(config(squash_constants=ERM_BAND), TASKS).double()
    is_probability = {"a": True, "b": False}
    for raw_b in ((2.0, 7.0, 4.0), (1.0, 9.0, 5.0)):
        _, stats = regularizer(*batch(b=raw_b), is_probability)
        assert regularizer.squash_low[1].item() == 3.0
        assert regularizer.squash_high[1].item() == 6.0
    squashed = np.clip((np.array([1.0, 9.0, 5.0]) - 3.0) / (3.0 + 1e-6), 0, 1)
    gaps = np.array([(0.9, 0.5, 0.1)[x] - squashed[y] for x, y in PAIR_INDEX])
    z = rho(gaps) / stats["tau"].item() - DISTANCES / stats["kappa"].item()
    assert stats["loss_lip"].item() == pytest.approx(phi(z).mean(), rel=1e-9)


def test_clipped_share_counts_squashed_prototypes_outside_the_erm_band() -> None:
    """b's prototypes are examples 1 (raw 9, above q90) and 2 (raw 5, inside): one of two is
    clipped, and a clipped score passes no gradient; probability tasks are not counted."""
    regularizer = ReLiFRegularizer(config(squash_constants=ERM_BAND), TASKS).double()
    scores, representation = batch(b=(1.0, 9.0, 5.0))
    loss, stats = regularizer(scores, representation, {"a": True, "b": False})
    assert stats["clipped"].item() == 0.5
    loss.backward()
    assert scores["b"][0].grad[1].item() == 0.0 and scores["b"][0].grad[2].item() != 0.0
    _, plain = ReLiFRegularizer(config(), TASKS).double()(*batch(), PROBABILITY)
    assert math.isnan(plain["clipped"].item())


def test_straight_through_squash_keeps_the_clipped_value_and_passes_the_affine_slope() -> None:
    """Forward: the audit's squash to the bit. Backward: 1 / (q90 - q10 + 1e-6) everywhere
    (straight-through) against the clip's slope inside the band and 0 outside it."""
    raw = torch.tensor([-2.0, 1.0, 3.5, 5.0, 7.0, 9.0, math.inf], dtype=torch.float64)
    low, high = torch.tensor(3.0, dtype=torch.float64), torch.tensor(6.0, dtype=torch.float64)
    upstream = torch.arange(1.0, 8.0, dtype=torch.float64)  # a generic incoming gradient
    values, grads = {}, {}
    for gradient in ("clip", "straight_through"):
        leaf = raw.clone().requires_grad_(True)
        values[gradient] = squash_with_gradient(leaf, low, high, gradient)
        (upstream * values[gradient]).sum().backward()
        grads[gradient] = leaf.grad
    assert torch.equal(values["clip"], squash(raw, low, high))
    assert torch.equal(values["straight_through"], values["clip"])
    slope = 1 / (6.0 - 3.0 + 1e-6)
    inside = torch.tensor([False, False, True, True, False, False, False])
    finite = torch.isfinite(raw)
    torch.testing.assert_close(grads["clip"], upstream * slope * inside, rtol=1e-12, atol=0)
    torch.testing.assert_close(
        grads["straight_through"], upstream * slope * finite, rtol=1e-12, atol=0
    )
    differs = grads["straight_through"] != grads["clip"]
    assert differs.tolist() == (finite & ~inside).tolist()
    with pytest.raises(ValueError, match="unknown squash gradient 'identity'"):
        squash_with_gradient(raw, low, high, "identity")  # type: ignore[arg-type]


@pytest.mark.parametrize("squash_kind", ["erm", "running"])
def test_straight_through_changes_only_the_gradient_through_squashed_scores(
    squash_kind: str,
) -> None:
    """Same state and batch: the same loss, statistics and state (scales, squash quantiles,
    controller) under clip and straight-through; the gradient through squashed scores is the
    chain rule's dL/dp x 1 / (q90 - q10 + 1e-6), zeroed by the clip outside the band, where
    dL/dp comes from the same step fed the squashed scores as probabilities."""
    mixed = {"a": True, "b": False}
    warm_b, raw_b = (3.0, 6.0, 5.0), (1.0, 9.0, 5.0)  # below q10, above q90, inside the band
    settings = dict(squash=squash_kind, squash_constants=ERM_BAND, prototypes_per_task=3)
    runs = {}
    for gradient in ("clip", "straight_through"):
        regularizer = ReLiFRegularizer(config(**settings, squash_gradient=gradient), TASKS)
        regularizer = regularizer.double()
        regularizer(*batch(b=warm_b), mixed)  # warm state, as in the middle of training
        warm_band = regularizer.squash_low[1].item(), regularizer.squash_high[1].item()
        scores, representation = batch(b=raw_b)
        loss, stats = regularizer(scores, representation, mixed)
        loss.backward()
        band = regularizer.squash_low[1].item(), regularizer.squash_high[1].item()
        runs[gradient] = (loss, stats, snapshot(regularizer), scores, representation)
    (clip_loss, clip_stats, clip_state, clip_scores, clip_rep) = runs["clip"]
    (st_loss, st_stats, st_state, st_scores, st_rep) = runs["straight_through"]
    assert st_loss.item() == clip_loss.item()
    np.testing.assert_equal(
        {k: v.item() for k, v in st_stats.items()}, {k: v.item() for k, v in clip_stats.items()}
    )
    assert clip_stats["clipped"].item() == pytest.approx(2 / 3)
    assert_same_state(clip_state, st_state)
    assert torch.equal(st_scores["a"][0].grad, clip_scores["a"][0].grad)
    assert torch.equal(st_rep.grad, clip_rep.grad)

    reference = ReLiFRegularizer(config(prototypes_per_task=3), TASKS).double()
    reference(*batch(b=tuple(squash(np.array(warm_b), *warm_band))), PROBABILITY)
    squashed = squash(np.array(raw_b), *band)
    assert squashed.tolist()[:2] == [0.0, 1.0]
    ref_scores, ref_rep = batch(b=tuple(squashed))
    ref_loss, _ = reference(ref_scores, ref_rep, PROBABILITY)
    ref_loss.backward()
    assert ref_loss.item() == pytest.approx(clip_loss.item(), rel=1e-12)
    dl_dp = ref_scores["b"][0].grad
    assert (dl_dp != 0).all()  # every prototype of b feels the loss
    slope = 1 / (band[1] - band[0] + 1e-6)
    inside = torch.tensor([False, False, True])
    torch.testing.assert_close(st_scores["b"][0].grad, dl_dp * slope, rtol=1e-9, atol=0)
    torch.testing.assert_close(clip_scores["b"][0].grad, dl_dp * slope * inside, rtol=1e-9, atol=0)


def test_erm_squash_without_constants_is_a_one_line_config_error() -> None:
    regularizer = ReLiFRegularizer(config(), TASKS).double()
    with pytest.raises(UserError, match=r"relif.squash_constants: .* for b$"):
        regularizer(*batch(), {"a": True, "b": False})
    regularizer(*batch(), PROBABILITY)  # probabilities need no constants


def test_ablation_without_quantile_alignment_uses_unit_scales() -> None:
    regularizer = ReLiFRegularizer(config(quantile_alignment=False), TASKS).double()
    _, stats = regularizer(*batch(), PROBABILITY)
    expected = expected_step((0.9, 0.5, 0.1), (0.1, 0.45, 0.2), aligned=False)
    assert stats["tau"].item() == 1.0 and stats["kappa"].item() == 1.0
    assert stats["loss_lip"].item() == pytest.approx(expected["loss_lip"], rel=1e-9)
    assert stats["r"].item() == pytest.approx(expected["r"])


def test_ablation_static_lambda() -> None:
    regularizer = ReLiFRegularizer(config(controller="static", eta=10.0), TASKS).double()
    for _ in range(3):
        loss, stats = regularizer(*batch(), PROBABILITY)
        assert stats["lambda"].item() == pytest.approx(0.1)
        assert loss.item() == pytest.approx(0.1 * stats["loss_lip"].item())


def test_ablation_without_lipschitz_branch() -> None:
    full = ReLiFRegularizer(config(), TASKS).double()
    ablated = ReLiFRegularizer(config(lipschitz_branch=False), TASKS).double()
    _, full_stats = full(*batch(), PROBABILITY)
    loss, stats = ablated(*batch(), PROBABILITY)
    assert loss is None
    assert stats["lambda"].item() == 0.0
    for key in ("r", "r_ema", "tau", "kappa", "loss_lip"):
        assert stats[key].item() == pytest.approx(full_stats[key].item()), key


def test_rank_pairing_uses_k_pairs() -> None:
    regularizer = ReLiFRegularizer(config(prototype_pairing="rank"), TASKS).double()
    _, stats = regularizer(*batch(), PROBABILITY)
    # rank pairs: (0 with 1), (1 with 2)
    gaps = np.array([0.9 - 0.45, 0.5 - 0.2])
    distances = DISTANCES[[0, 3]]
    z = rho(gaps) / np.quantile(gaps, 0.95) - distances / np.quantile(distances, 0.95)
    assert stats["loss_lip"].item() == pytest.approx(phi(z).mean(), rel=1e-9)


def test_state_dict_and_deterministic_mode() -> None:
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        regularizer = ReLiFRegularizer(config(), TASKS)
        scores = {k: (v.float(), m) for k, (v, m) in batch()[0].items()}
        loss, _ = regularizer(scores, batch()[1].float(), PROBABILITY)
        assert loss.dtype == torch.float32
    finally:
        torch.use_deterministic_algorithms(previous)
    state = regularizer.state_dict()
    assert set(state) == {
        "tau",
        "kappa",
        "squash_low",
        "squash_high",
        "controller.lambda_",
        "controller.r_ema",
        "controller.updates",
    }
    restored = ReLiFRegularizer(config(), TASKS)
    restored.load_state_dict(state)
    assert_same_state(snapshot(regularizer), snapshot(restored))


@pytest.mark.parametrize("pairing", ["cross", "rank"])
@pytest.mark.parametrize("valid_b", [(True, True, True), (False, False, False)])
@pytest.mark.parametrize(
    ("squash", "gradient", "variant"),
    [
        ("erm", "clip", {}),
        ("running", "clip", {}),
        ("erm", "straight_through", {}),
        ("erm", "clip", {"surrogate_score": "logistic"}),
        ("running", "clip", {"clip_share_penalty": True}),
    ],
)
def test_a_training_step_has_no_host_synchronisation(
    monkeypatch: pytest.MonkeyPatch,
    pairing: str,
    valid_b: tuple[bool, ...],
    squash: str,
    gradient: str,
    variant: dict,
) -> None:
    """Forward (squash, pairs, scales, controller, stats) and backward, with and without pairs,
    also for our variants (the logistic surrogate score, the clip-share penalty)."""
    settings = config(
        prototype_pairing=pairing,
        squash=squash,
        squash_constants=ERM_BAND,
        squash_gradient=gradient,
        **variant,
    )
    regularizer = ReLiFRegularizer(settings, TASKS).double()
    mixed = {"a": True, "b": False}
    regularizer(*batch(b=(3.0, 6.0, 5.0)), mixed)  # warm state, as in the middle of training
    scores, representation = batch(b=(2.0, 7.0, 4.0), valid_b=valid_b)
    with no_host_sync(monkeypatch):
        loss, stats = regularizer(scores, representation, mixed)
        loss.backward()
    assert set(stats) == set(STAT_KEYS) and representation.grad is not None


COMPILED_SETTINGS = {
    "the paper's: erm squash, clip": dict(squash_constants=ERM_BAND),
    "ours: running squash, logistic surrogate, clip-share penalty": dict(
        squash="running", surrogate_score="logistic", clip_share_penalty=True
    ),
}


@pytest.mark.parametrize("settings", COMPILED_SETTINGS.values(), ids=COMPILED_SETTINGS.keys())
@pytest.mark.slow
def test_the_compiled_step_is_one_graph_with_the_eager_numbers(
    settings: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`train.compile_relif` traced whole (fullgraph: any graph break fails) and run through
    AOTAutograd, which hands inductor the same functional graph: losses, statistics,
    gradients and every buffer equal the eager step's bit for bit, over steps that initialise
    and update the scales and the squash and one step without pairs (task b all invalid)."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    eager = ReLiFRegularizer(config(**settings), TASKS).double()
    compiled = ReLiFRegularizer(config(**settings), TASKS).double()
    step = regularizer_module.compiled_regularizer(compiled)
    steps = [
        ((3.5, 4.0, 5.5), (True,) * 3),
        ((2.0, 7.0, 4.5), (False,) * 3),
        ((6.5, 3.2, 4.1), (True,) * 3),
    ]
    for b, valid_b in steps:
        results = []
        for run in (eager, step):
            scores, representation = batch(b=b, valid_b=valid_b)
            loss, stats = run(scores, representation, {"a": True, "b": False})
            loss.backward()
            grads = [scores["a"][0].grad, scores["b"][0].grad, representation.grad]
            results.append((loss.detach(), stats, grads))
        (loss, stats, grads), (loss_c, stats_c, grads_c) = results
        assert torch.equal(loss, loss_c)
        for key in STAT_KEYS:
            assert torch.allclose(stats[key], stats_c[key], rtol=0, atol=0, equal_nan=True), key
        assert all(torch.equal(g, g_c) for g, g_c in zip(grads, grads_c, strict=True))
        for name, buffer in eager.state_dict().items():
            assert torch.allclose(buffer, compiled.state_dict()[name], 0, 0, equal_nan=True), name
    torch.compiler.reset()


def test_compiling_a_regularizer_after_others_never_meets_the_recompile_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A trial worker compiles one regularizer per trial, each with its own settings as graph
    constants; torch refuses a fullgraph compile past its recompile limit (8; set to 1 here),
    so each compilation starts from cleared caches."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    with torch._dynamo.config.patch(recompile_limit=1):  # its own patch: put back after
        for eta in (0.5, 0.25):
            regularizer = ReLiFRegularizer(config(eta=eta), TASKS)
            step = regularizer_module.compiled_regularizer(regularizer)
            scores, representation = batch()
            step({k: (v.float(), m) for k, (v, m) in scores.items()}, representation.float())
    torch.compiler.reset()
