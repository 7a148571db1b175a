"""ReLiF as a pluggable regularizer: add it to any PyTorch multi-task training loop.

`ReLiFRegularizer(config, task_names)` is an `nn.Module` holding the scale buffers tau/kappa,
the running squash quantiles and the violation-rate controller (`ViolationController`, paper
Eqs. 11 and 12). Call it once per training step with every task's
per-example audit score p_k in [0, 1] (paper section 3; e.g. a sigmoid probability) and valid
mask, and the shared representation the scores come from; it returns lambda_t * L_lip (paper
Algorithm 2) to add to the task loss, and detached statistics (`STAT_KEYS`: lambda, r, r_ema,
tau, kappa, loss_lip, clipped):

    regularizer = ReLiFRegularizer(ReLiFConfig(r_star=0.24, eta=1e-3), ["seg", "depth"])
    loss_lip, stats = regularizer({"seg": (p_seg, valid_seg), "depth": (p_depth, valid_depth)},
                                  representation)
    (task_loss if loss_lip is None else task_loss + loss_lip).backward()

loss_lip is None only for the `lipschitz_branch=False` ablation. eta 1e-3 and the 100-step
warmup are the paper's for its 19,800-step NYUv2 run; `scale_to_budget(steps)` gives the eta
and warmup that move lambda as far in a run of `steps` steps. Its state travels in
`regularizer.state_dict()` (checkpoint it with the model). Audit the trained model under one
held-fixed delta with `relif_ray.audit.fixed_delta_audit` on the table
`relif_ray.audit.scores_frame` builds. Complete examples, audited against the same loop
without ReLiF:
docs/examples/own_loop.py, and with PCGrad docs/examples/own_loop_pcgrad.py.
"""

from relif_ray.config import ReLiFConfig
from relif_ray.relif.controller import ViolationController, scale_to_budget
from relif_ray.relif.regularizer import CONTROLLER_KEYS, STAT_KEYS, ReLiFRegularizer

__all__ = [
    "CONTROLLER_KEYS",
    "STAT_KEYS",
    "ReLiFConfig",
    "ReLiFRegularizer",
    "ViolationController",
    "scale_to_budget",
]
