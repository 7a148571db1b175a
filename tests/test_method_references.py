"""The added methods against their references, on the toy problem of test_methods.py.

Every comparison is of the resulting parameter gradients (all of them, shared and heads),
over several steps with the model updated in between, so that state (Nash-MTL's weights,
DWA's epoch means, FAMO's logits, DB-MTL's averages) takes part:

- TorchJD's methods: TorchJD's own aggregator on the same Jacobian, through its
  `mtl_backward` + `jac_to_grad`;
- DWA, RLW: the LibMTL 1.1.5 package's classes (`relif_ray.testing.libmtl_reference`);
- FAMO, DB-MTL (not in any package): the cited source, transcribed below by hand.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchjd.aggregation as jd
from torchjd.autojac import jac_to_grad, mtl_backward
from torchjd.linalg import QuadprogProjector

from relif_ray.methods import METHODS
from relif_ray.methods.torchjd_weightings import TorchJDWeighting
from relif_ray.testing import libmtl_reference
from tests.test_methods import TASKS, ToyModel, context, losses_and_extra, new_method, toy_data


def conflicting_data():
    x, y = toy_data()
    y["b"] = -4.0 * y["a"]  # opposed targets of different scales
    return x, y


def all_grads(model: ToyModel) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in
            model.parameters()]  # fmt: skip


def sgd(model: ToyModel, lr: float = 0.1) -> None:
    with torch.no_grad():
        for param in model.parameters():
            param -= lr * param.grad


def assert_same_grads(ours: list[torch.Tensor], theirs: list[torch.Tensor], rtol=1e-4) -> None:
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=rtol, atol=1e-6)


# --- TorchJD ------------------------------------------------------------------------------------

PREF = [0.2, 0.3, 0.5]
TORCHJD_CASES = [
    ("upgrad", {}, lambda: jd.UPGrad()),
    (
        "upgrad",
        {"pref_vector": PREF, "reg_eps": 1e-3, "norm_eps": 1e-3},
        lambda: jd.UPGrad(
            torch.tensor(PREF, dtype=torch.float64), QuadprogProjector(norm_eps=1e-3, reg_eps=1e-3)
        ),
    ),
    ("mgda", {}, lambda: jd.MGDA()),
    ("mgda", {"epsilon": 0.01, "max_iters": 5}, lambda: jd.MGDA(epsilon=0.01, max_iters=5)),
    ("cagrad", {}, lambda: jd.CAGrad(c=0.4)),
    ("cagrad", {"c": 0.9}, lambda: jd.CAGrad(c=0.9)),
    ("imtlg", {}, lambda: jd.IMTLG()),
    ("alignedmtl", {}, lambda: jd.AlignedMTL()),
    ("alignedmtl", {"scale_mode": "rmse"}, lambda: jd.AlignedMTL(scale_mode="rmse")),
    ("dualproj", {}, lambda: jd.DualProj()),
    (
        "dualproj",
        {"pref_vector": PREF},
        lambda: jd.DualProj(torch.tensor(PREF, dtype=torch.float64)),
    ),
    ("nashmtl", {}, lambda: jd.NashMTL(n_tasks=3)),
    (
        "nashmtl",
        {"max_norm": 0.05, "optim_niter": 5},
        lambda: jd.NashMTL(n_tasks=3, max_norm=0.05, optim_niter=5),
    ),
]


def torchjd_step(model: ToyModel, aggregator: jd.Aggregator, x, y) -> None:
    """TorchJD's MTL step: per-task gradients of the heads, the Jacobian of the shared
    parameters through the features every head reads, aggregated into .grad."""
    model.zero_grad(set_to_none=True)
    losses, _ = losses_and_extra(model, x, y)
    mtl_backward(
        [losses[t] for t in TASKS],
        features=model.encoder_output,
        tasks_params=[list(model.heads[t].parameters()) for t in TASKS],
        shared_params=model.shared_parameters(),
    )
    jac_to_grad(model.shared_parameters(), aggregator)


def test_every_torchjd_method_has_a_reference_case():
    torchjd_methods = {n for n, c in METHODS.items() if issubclass(c, TorchJDWeighting)}
    assert torchjd_methods == {name for name, _, _ in TORCHJD_CASES}
    assert {"upgrad", "mgda", "cagrad", "imtlg", "alignedmtl", "dualproj", "nashmtl"} <= (
        torchjd_methods
    )


@pytest.mark.parametrize(
    ("name", "options", "aggregator"),
    TORCHJD_CASES,
    ids=[f"{name}-{'-'.join(options) or 'defaults'}" for name, options, _ in TORCHJD_CASES],
)
def test_torchjd_methods_give_torchjds_parameter_gradients(
    name: str, options: dict, aggregator: Callable[[], jd.Aggregator]
):
    # on the opposed targets Nash-MTL's convex problems have no solution and TorchJD keeps
    # its starting weights (ones): there it is compared where it does solve them
    x, y = toy_data() if name == "nashmtl" else conflicting_data()
    ours_model, theirs_model = ToyModel(seed=2), ToyModel(seed=2)
    method, reference = new_method(name, **options), aggregator()
    for step in range(3):
        ours_model.zero_grad(set_to_none=True)
        losses, _ = losses_and_extra(ours_model, x, y)
        method.backward(losses, context(ours_model, step))
        torchjd_step(theirs_model, reference, x, y)
        ours = all_grads(ours_model)
        assert_same_grads(ours, all_grads(theirs_model))
        sgd(ours_model)
        sgd(theirs_model)
    assert any(g.abs().sum() > 0 for g in ours)


def test_nashmtl_state_changes_its_weights_and_is_checkpointed():
    """Nash-MTL's weights depend on its previous weights: a fresh method on the same Jacobian
    gives different weights than one restored from the state after two steps."""
    x, y = toy_data()
    model, method = ToyModel(seed=2), new_method("nashmtl", optim_niter=1)
    for step in range(2):
        losses, _ = losses_and_extra(model, x, y)
        method.backward(losses, context(model, step))
        sgd(model)
    state = method.state_dict()
    assert state["_extra_state"]["step"] == 2
    restored, fresh = new_method("nashmtl", optim_niter=1), new_method("nashmtl", optim_niter=1)
    restored.load_state_dict(state)
    outcomes = []
    for candidate in (method, restored, fresh):
        model.zero_grad(set_to_none=True)
        losses, _ = losses_and_extra(model, x, y)
        weights = candidate.backward(losses, context(model, 2))
        outcomes.append(torch.stack([weights[t] for t in TASKS]))
    torch.testing.assert_close(outcomes[0], outcomes[1])
    assert not torch.allclose(outcomes[0], outcomes[2])
    assert not torch.allclose(outcomes[2], torch.ones(3))  # the problem was solved


# --- LibMTL 1.1.5: DWA and RLW -----------------------------------------------------------------


def test_dwa_matches_libmtl_over_epochs():
    """Four epochs of two steps: LibMTL's DWA with the epoch means we record independently."""
    libmtl = libmtl_reference
    x, y = conflicting_data()
    model, method = ToyModel(seed=1), new_method("dwa", temperature=1.5)
    epochs, steps = 4, 2
    buffer = np.zeros((3, epochs))
    reference = libmtl.libmtl_weighting("DWA", 3, train_loss_buffer=buffer)
    checked_ratio = False
    for epoch in range(epochs):
        reference.epoch = epoch
        for step in range(steps):
            model.zero_grad(set_to_none=True)
            losses, _ = losses_and_extra(model, x, y)
            weights = method.backward(losses, context(model, step))
            ours = all_grads(model)
            model.zero_grad(set_to_none=True)
            losses, _ = losses_and_extra(model, x, y)
            values = torch.stack([losses[t] for t in TASKS])
            theirs_weights = reference.backward(values, T=1.5)
            assert_same_grads(ours, all_grads(model), rtol=1e-5)
            np.testing.assert_allclose(
                [float(weights[t]) for t in TASKS], theirs_weights, rtol=1e-5
            )
            checked_ratio |= not np.allclose(theirs_weights, 1.0)
            buffer[:, epoch] += values.detach().numpy() / steps
            sgd(model, lr=0.05)
        method.end_epoch()
    assert checked_ratio  # epochs 2 and 3 used the loss ratios


def test_rlw_matches_libmtl_for_the_same_draws():
    """LibMTL 1.1.5's RLW (dist='Normal': softmax of a standard normal draw) given the draws of
    our seeded generator."""
    libmtl = libmtl_reference
    x, y = conflicting_data()
    model, method = ToyModel(seed=1), new_method("rlw", seed=4)
    draws = torch.Generator().manual_seed(4)  # the same stream as the method's

    class SameDraws:
        def sample(self) -> torch.Tensor:
            return torch.randn(3, generator=draws)

    reference = libmtl.libmtl_weighting("RLW", 3, distribution=SameDraws())
    for step in range(3):
        model.zero_grad(set_to_none=True)
        losses, _ = losses_and_extra(model, x, y)
        weights = method.backward(losses, context(model, step))
        ours = all_grads(model)
        model.zero_grad(set_to_none=True)
        losses, _ = losses_and_extra(model, x, y)
        theirs_weights = reference.backward(torch.stack([losses[t] for t in TASKS]), dist="Normal")
        assert_same_grads(ours, all_grads(model), rtol=1e-5)
        np.testing.assert_allclose([float(weights[t]) for t in TASKS], theirs_weights, rtol=1e-6)
        assert abs(sum(theirs_weights) - 1.0) < 1e-6
        sgd(model, lr=0.05)


# --- FAMO: the authors' famo.py, transcribed -------------------------------------------------


class AuthorsFAMO:
    """Cranial-XIX/FAMO, famo.py at commit 250873e (class FAMO), without its max_norm clip."""

    def __init__(self, n_tasks: int, gamma: float, w_lr: float) -> None:
        self.min_losses = torch.zeros(n_tasks)
        self.w = torch.tensor([0.0] * n_tasks, requires_grad=True)
        self.w_opt = torch.optim.Adam([self.w], lr=w_lr, weight_decay=gamma)

    def get_weighted_loss(self, losses: torch.Tensor) -> torch.Tensor:
        self.prev_loss = losses
        z = F.softmax(self.w, -1)
        D = losses - self.min_losses + 1e-8
        c = (z / D).sum().detach()
        return (D.log() * z / c).sum()

    def update(self, curr_loss: torch.Tensor) -> None:
        delta = (self.prev_loss - self.min_losses + 1e-8).log() - (
            curr_loss - self.min_losses + 1e-8
        ).log()
        with torch.enable_grad():
            d = torch.autograd.grad(F.softmax(self.w, -1), self.w, grad_outputs=delta.detach())[0]
        self.w_opt.zero_grad()
        self.w.grad = d
        self.w_opt.step()


def test_famo_matches_the_authors_code():
    x, y = conflicting_data()
    ours_model, theirs_model = ToyModel(seed=3), ToyModel(seed=3)
    method = new_method("famo", w_lr=0.2, gamma=0.05)
    reference = AuthorsFAMO(3, gamma=0.05, w_lr=0.2)
    for step in range(4):
        ours_model.zero_grad(set_to_none=True)
        losses, _ = losses_and_extra(ours_model, x, y)
        method.backward(losses, context(ours_model, step))
        theirs_model.zero_grad(set_to_none=True)
        losses, _ = losses_and_extra(theirs_model, x, y)
        reference.get_weighted_loss(torch.stack([losses[t] for t in TASKS])).backward()
        assert_same_grads(all_grads(ours_model), all_grads(theirs_model), rtol=1e-5)
        sgd(ours_model)
        sgd(theirs_model)
        with torch.no_grad():
            method.after_step(lambda: losses_and_extra(ours_model, x, y)[0])
            new_losses, _ = losses_and_extra(theirs_model, x, y)
            reference.update(torch.stack([new_losses[t] for t in TASKS]))
        torch.testing.assert_close(method.logits, reference.w.detach(), rtol=1e-4, atol=1e-6)
    assert method.logits.std() > 0.01  # the task weights did move apart


# --- DB-MTL: LibMTL's DB_MTL.backward, transcribed --------------------------------------------


class LibMTLDBMTL:
    """median-research-group/LibMTL, LibMTL/weighting/DB_MTL.py at commit 7b0f56a, with its
    `_compute_grad(mode='backward')` and `_reset_grad` spelled out for the toy model."""

    def __init__(self, model: ToyModel, beta: float, beta_sigma: float) -> None:
        self.model, self.beta, self.beta_sigma = model, beta, beta_sigma
        self.step = 0
        self.grad_buffer = torch.zeros(3, sum(p.numel() for p in model.shared_parameters()))

    def backward(self, losses: torch.Tensor) -> None:
        self.step += 1
        shared = self.model.shared_parameters()
        batch_grads = torch.zeros_like(self.grad_buffer)
        log_losses = torch.log(losses + 1e-8)
        for tn in range(3):
            log_losses[tn].backward(retain_graph=tn < 2)
            batch_grads[tn] = torch.cat([p.grad.reshape(-1) for p in shared])
            for param in shared:
                param.grad = None
        self.grad_buffer = batch_grads + (self.beta / self.step**self.beta_sigma) * (
            self.grad_buffer - batch_grads
        )
        u_grad = self.grad_buffer.norm(dim=-1)
        alpha = u_grad.max() / (u_grad + 1e-8)
        new_grads = sum(alpha[i] * self.grad_buffer[i] for i in range(3))
        for param, chunk in zip(shared, new_grads.split([p.numel() for p in shared]), strict=True):
            param.grad = chunk.view_as(param).clone()


def test_dbmtl_matches_libmtl():
    x, y = conflicting_data()
    ours_model, theirs_model = ToyModel(seed=4), ToyModel(seed=4)
    method = new_method("dbmtl", beta=0.8, beta_sigma=0.5)
    reference = LibMTLDBMTL(theirs_model, beta=0.8, beta_sigma=0.5)
    for step in range(4):
        ours_model.zero_grad(set_to_none=True)
        losses, _ = losses_and_extra(ours_model, x, y)
        method.backward(losses, context(ours_model, step))
        theirs_model.zero_grad(set_to_none=True)
        losses, _ = losses_and_extra(theirs_model, x, y)
        reference.backward(torch.stack([losses[t] for t in TASKS]))
        assert_same_grads(all_grads(ours_model), all_grads(theirs_model), rtol=1e-5)
        sgd(ours_model)
        sgd(theirs_model)
