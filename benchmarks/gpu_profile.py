"""The `profile` section of the GPU check (a): one eager training step of ERM and of ERM + ReLiF
at the GPU rows' size (ResNet-50 at 288x384, batch 8, bf16, channels-last, data on the GPU),
profiled with torch.profiler (`step_profile.py`): the host's time to issue the step, the
step's time, its summed GPU time, its kernel launches and ATen calls; then what ReLiF adds."""

from __future__ import annotations

from gpu_common import Check
from workers import WORKER_WARMUP_STEPS, data_root, trial_config

PROFILED_STEPS = 5
FIGURES = {
    "host_ms": ("host time to issue a step", "ms"),
    "wall_ms": ("step time", "ms"),
    "kernel_ms": ("GPU time of a step (kernels, copies)", "ms"),
    "launches": ("kernel launches per step", ""),
    "aten_calls": ("ATen calls per step", ""),
}


def profile_section(check: Check) -> None:
    measured = {}
    for variant in ("erm", "relif"):
        with check.step(f"step profile, {variant}"):
            measured[variant] = profile_variant(check, variant)
    if len(measured) == 2:
        for key, (title, unit) in FIGURES.items():
            erm, relif = measured["erm"][key], measured["relif"][key]
            if erm is not None and relif is not None:
                check.row(f"{title}, ERM+ReLiF - ERM", relif - erm, unit, "eager steps")


def profile_variant(check: Check, variant: str) -> dict:
    """`PROFILED_STEPS` eager steps of `variant` after the workers' warm-up, as rows."""
    from step_profile import profile_steps

    from relif_ray.config import ExperimentConfig
    from relif_ray.engine import TrainingRun

    context = check.context()
    config = trial_config(context, data_root(context, gpu=True), variant, gpu=True)
    config["train"]["cuda_graph"] = "off"
    run = TrainingRun(ExperimentConfig.from_dict(config))
    run.train_steps(WORKER_WARMUP_STEPS if not check.dry_run else 1)
    figures = profile_steps(run, PROFILED_STEPS)
    detail = (
        f"{config['model']['backbone']}, batch {config['train']['batch_size']}, bf16, "
        f"channels-last, data on the device, eager; mean of {PROFILED_STEPS} steps issued back "
        "to back (host time: until the last call returned; step time: until the GPU finished)"
    )
    for key, (title, unit) in FIGURES.items():
        value = figures[key]
        check.row(f"{title}, {variant}", value, unit, detail,
                  result="info" if value is not None else "needs CUDA")  # fmt: skip
    return figures
