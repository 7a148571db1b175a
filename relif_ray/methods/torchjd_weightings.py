"""TorchJD's weightings as methods of this project: one adapter, one small named class each.

TorchJD (Quinton & Rey, "Jacobian Descent for Multi-Objective Optimization", 2024; the
`torchjd` package, pinned to 0.18 by the `mtl` install extra) splits every aggregator of the
K x P task Jacobian G into a weighting, which computes task weights c from the K x K Gramian
G G^T, and the combination G^T c. That is exactly `GradientAggregator`'s split, so each TorchJD
weighting becomes a method through `TorchJDWeighting`, whose `weighting` calls TorchJD's
weighting class on our Gramian; the per-task passes, the write-back of the shared update, the
plain sum of the task gradients on the task-specific parameters and the ReLiF term added after
aggregation are `GradientAggregator`'s (see `relif_ray.methods.gradients`; cost: K backward
passes, +1 for the ReLiF term). TorchJD's own `mtl_backward` + `jac_to_grad` gives the same
parameter gradients (tested for every line below).

A new Gramian weighting is one small registered class: its config name, the TorchJD class,
its citation, its options with their defaults (the keyword arguments of the TorchJD class,
settable as `method.options`), the modules it needs and the gradient sources it offers. Our
conventions on the options:

- `pref_vector` (UPGrad, DualProj, Aligned-MTL): null (TorchJD's mean 1/K) or a list of K
  numbers, in the problem's task order;
- `norm_eps`, `reg_eps` (UPGrad, DualProj): the options of TorchJD's dual-cone projector
  (`torchjd.linalg.QuadprogProjector`, the quadprog QP solver);
- CAGrad's `c` has no default in TorchJD; ours is 0.4, the default of the CAGrad authors'
  later experiment code (Cranial-XIX/FAMO, experiments/utils.py, `--c`, commit 5b92c20).

Every option value is checked when the method is built (so before any trial starts): TorchJD's
own checks, run by building the weighting and applying it once to the identity Gramian, become
one-line errors naming `method.options`.

The weighting runs on the CPU in float64 (K x K: tiny, and every QP solver is on the host), so
these methods wait for the device once per step, as PCGrad and FairGrad do. TorchJD scales as
its papers do: UPGrad, DualProj, Aligned-MTL, MGDA, CAGrad and IMTL-G combine with weights
around 1/K (a mean of the task gradients, where ERM here takes the sum).

Nash-MTL (Navon et al., ICML 2022) is not a Gramian weighting in TorchJD's API: its
`NashMTL` aggregator weights the Jacobian itself and keeps state across steps (the previous
weights and its step counter) and needs cvxpy + ECOS. It runs through the adapter's Jacobian
path (`TorchJDJacobianWeighting`: TorchJD's weighting of G, in its host and device parts),
and its state is the module's extra state, so it is checkpointed and a resumed run continues
identically.
Like TorchJD (and unlike the official code and LibMTL, which backpropagate sum_k alpha_k L_k
and so weight the heads too), only the shared update is alpha-weighted; the heads get the
plain sum of the task gradients, as for every aggregator here.

Non-conflict: UPGrad and DualProj project onto the dual cone of the task gradients, so
g_k . d >= 0 for every task by construction, but for the Gramian that TorchJD regularises
with `reg_eps` * I. UPGrad promises it (`promises_non_conflict`, tested at a cosine tolerance
of 1e-6); DualProj does not: on the toy problem of the tests its update reaches a cosine of
-7e-4 with a task gradient at the default reg_eps = 1e-4.

Representation mode (`gradient_source: representation`, see `relif_ray.methods.gradients`):
offered where LibMTL defines `rep_grad` for the same method (MGDA, IMTL, Aligned-MTL in
LibMTL/weighting/MGDA.py, IMTL.py, Aligned_MTL.py); LibMTL refuses it for CAGrad, UPGrad and
Nash-MTL, and has no DualProj.
"""

from __future__ import annotations

import importlib
import math
import warnings
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from relif_ray.config import GradientSource
from relif_ray.errors import UserError
from relif_ray.methods.gradients import GradientAggregator
from relif_ray.methods.registry import register

QUADPROG = ("torchjd", "qpsolvers", "quadprog")
"""UPGrad's and DualProj's dual-cone projection (TorchJD's `QuadprogProjector`)."""
CLARABEL = ("torchjd", "cvxpy", "clarabel")
"""CAGrad's cone program."""
ECOS = ("torchjd", "cvxpy", "ecos")
"""Nash-MTL's sequence of convex problems."""
PROJECTOR_OPTIONS = ("norm_eps", "reg_eps")


class TorchJDWeighting(GradientAggregator):
    """Adapter: the TorchJD weighting `torchjd_class` (of `torchjd.aggregation`) as this
    project's `weighting` of the float64 Gramian; see the module docstring."""

    torchjd_class: ClassVar[str]
    defaults: ClassVar[dict[str, Any]]
    requires: ClassVar[tuple[str, ...]] = ("torchjd",)
    projector: ClassVar[bool] = False
    """Whether `norm_eps`/`reg_eps` are the options of TorchJD's dual-cone projector."""
    non_conflicting: ClassVar[bool] = False
    """Whether the update lies in the dual cone of the task gradients (g_k . d >= 0)."""

    def __init__(
        self,
        task_names: list[str],
        seed: int = 0,
        gradient_source: GradientSource = "parameters",
        **options: Any,
    ) -> None:
        super().__init__(task_names, seed=seed, gradient_source=gradient_source)
        settings = {**self.defaults, **options}
        self.torchjd_weighting = self._build(self._torchjd_arguments(settings))
        self._probe()

    @classmethod
    def option_defaults(cls) -> dict[str, Any]:
        return dict(cls.defaults)

    def _torchjd_arguments(self, settings: dict[str, Any]) -> dict[str, Any]:
        """Our options as the TorchJD class's keyword arguments."""
        arguments = dict(settings)
        if arguments.get("pref_vector") is not None:
            arguments["pref_vector"] = self._pref_vector(arguments["pref_vector"])
        if self.projector:
            from torchjd.linalg import QuadprogProjector

            for option in PROJECTOR_OPTIONS:
                del arguments[option]

            projector = {option: settings[option] for option in PROJECTOR_OPTIONS}
            arguments["projector"] = self._checked(QuadprogProjector, **projector)
        return arguments

    def _pref_vector(self, value: object) -> Tensor:
        count = len(self.task_names)
        valid = (
            isinstance(value, (list, tuple))
            and len(value) == count
            and all(isinstance(v, (int, float)) and math.isfinite(v) for v in value)
        )
        if not valid:
            raise UserError(
                f"method.options.pref_vector: {self.name} needs null or a list of {count} "
                f"numbers (one per task: {', '.join(self.task_names)}), got {value!r}"
            )
        return torch.tensor(value, dtype=torch.float64)

    def _build(self, arguments: dict[str, Any]) -> nn.Module:
        torchjd_class = getattr(importlib.import_module("torchjd.aggregation"), self.torchjd_class)
        return self._checked(torchjd_class, **arguments)

    def _checked(self, factory: Any, *arguments: Any, **keywords: Any) -> Any:
        """`factory(...)`, TorchJD's own check of a value as a one-line user error."""
        try:
            return factory(*arguments, **keywords)
        except ValueError as exc:
            message = " ".join(str(exc).split())
            raise UserError(f"method.options: {self.name}: {message}") from None

    def _probe(self) -> None:
        """Apply the weighting to the identity Gramian, so that TorchJD checks the options
        it only reads when called (Aligned-MTL's scale_mode)."""
        self._checked(self.weighting, torch.eye(len(self.task_names), dtype=torch.float64))

    def weighting(self, gramian: Tensor) -> Tensor:
        return self.torchjd_weighting(gramian.cpu())

    def promises_non_conflict(self) -> bool:
        return self.non_conflicting and self.gradient_source == "parameters"


class TorchJDJacobianWeighting(TorchJDWeighting):
    """The Jacobian path: TorchJD's `torchjd_class` aggregator's weighting of G (its
    `.weighting`), with its state (Nash-MTL's) as this module's extra state. That weighting
    reads G twice: for its Gramian (the host solve) and, after the solve, for the norm of the
    update G^T alpha that `max_norm` bounds. So TorchJD's forward (torchjd 0.18,
    aggregation/_nash_mtl.py, `_NashMTLWeighting.forward`) runs here in those two parts:
    `solve` (the step count, the Gramian's normalisation, TorchJD's own convex solver) on the
    host, `scaled_weights` (the bound) on the device, with TorchJD's operations in its order."""

    def _build(self, arguments: dict[str, Any]) -> nn.Module:
        return super()._build({"n_tasks": len(self.task_names), **arguments}).weighting

    def _probe(self) -> None:
        """Nothing: a call would advance the stateful weighting; its options are checked by
        TorchJD's constructor."""

    def solve(self, gramian: Tensor) -> Tensor:
        weighting = self.torchjd_weighting
        if weighting.step == 0:
            weighting._init_optim_problem()
        weighting.step += 1
        if (weighting.step - 1) % weighting.update_weights_every != 0:
            return torch.from_numpy(np.asarray(weighting.prvs_alpha)).double()
        weighting.normalization_factor = torch.norm(gramian).numpy().reshape((1,))
        normalised = (gramian / weighting.normalization_factor.item()).numpy()
        with warnings.catch_warnings():  # cvxpy's note that Nash-MTL's problem is not DPP
            warnings.filterwarnings("ignore", "You are solving a parameterized problem")
            return torch.from_numpy(np.asarray(weighting._solve_optimization(normalised))).double()

    def scaled_weights(self, weights: Tensor, gradients: Tensor) -> Tensor:
        """alpha in G's dtype, scaled to norm `max_norm` where |G^T alpha| exceeds it (a
        `torch.where`, so the device is not read)."""
        alpha, max_norm = weights.to(gradients), self.torchjd_weighting.max_norm
        if max_norm <= 0:
            return alpha.double()
        norm = torch.linalg.norm(alpha @ gradients)
        return torch.where(norm > max_norm, (alpha / norm) * max_norm, alpha).double()

    def get_extra_state(self) -> dict[str, Any]:
        weighting = self.torchjd_weighting
        previous = torch.as_tensor(np.asarray(weighting.prvs_alpha, dtype=np.float64))
        return {"step": int(weighting.step), "previous_weights": previous}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        weighting = self.torchjd_weighting
        weighting.reset()
        weighting.prvs_alpha = state["previous_weights"].numpy().copy()
        weighting.step = float(state["step"])
        if weighting.step > 0:  # TorchJD builds its cvxpy problem on its first step only
            weighting._init_optim_problem()


DUAL_CONE = {"pref_vector": None, "norm_eps": 1e-4, "reg_eps": 1e-4}
BOTH: tuple[GradientSource, ...] = ("parameters", "representation")


@register
class UPGrad(TorchJDWeighting):
    """TorchJD's UPGradWeighting: the mean of the task gradients projected onto the dual cone
    of all of them; never conflicts with a task."""

    name = "upgrad"
    torchjd_class = "UPGradWeighting"
    citation = "Quinton & Rey, 2024 (UPGrad)"
    defaults = DUAL_CONE
    requires = QUADPROG
    projector = True
    non_conflicting = True


@register
class MGDA(TorchJDWeighting):
    """TorchJD's MGDAWeighting: the min-norm point of the task gradients' convex hull."""

    name = "mgda"
    torchjd_class = "MGDAWeighting"
    citation = "Sener & Koltun, NeurIPS 2018 (Frank-Wolfe, Algorithm 2)"
    defaults = {"epsilon": 0.001, "max_iters": 100}
    gradient_sources = BOTH


@register
class CAGrad(TorchJDWeighting):
    """TorchJD's CAGradWeighting: the best worst-case improvement within a ball of radius c
    times the mean gradient's norm (`c` 0.4, the CAGrad authors' later default)."""

    name = "cagrad"
    torchjd_class = "CAGradWeighting"
    citation = "Liu et al., NeurIPS 2021"
    defaults = {"c": 0.4, "norm_eps": 1e-4}
    requires = CLARABEL


@register
class IMTLG(TorchJDWeighting):
    """TorchJD's IMTLGWeighting: the update with equal projections on every task gradient."""

    name = "imtlg"
    torchjd_class = "IMTLGWeighting"
    citation = "Liu et al., ICLR 2021 (IMTL-G)"
    defaults: ClassVar[dict[str, Any]] = {}
    gradient_sources = BOTH


@register
class AlignedMTL(TorchJDWeighting):
    """TorchJD's AlignedMTLWeighting: the task gradients aligned by the Gramian's condition
    number."""

    name = "alignedmtl"
    torchjd_class = "AlignedMTLWeighting"
    citation = "Senushkin et al., CVPR 2023"
    defaults = {"pref_vector": None, "scale_mode": "min"}
    gradient_sources = BOTH


@register
class DualProj(TorchJDWeighting):
    """TorchJD's DualProjWeighting: the mean gradient projected onto the task gradients' dual
    cone (GEM's Eq. 11)."""

    name = "dualproj"
    torchjd_class = "DualProjWeighting"
    citation = "Lopez-Paz & Ranzato, NeurIPS 2017 (GEM Eq. 11)"
    defaults = DUAL_CONE
    requires = QUADPROG
    projector = True


@register
class NashMTL(TorchJDJacobianWeighting):
    """TorchJD's NashMTL aggregator: the Nash bargaining solution of the task gradients,
    recomputed every `update_weights_every` steps (its state is checkpointed)."""

    name = "nashmtl"
    torchjd_class = "NashMTL"
    citation = "Navon et al., ICML 2022"
    defaults = {"max_norm": 1.0, "update_weights_every": 1, "optim_niter": 20}
    requires = ECOS
