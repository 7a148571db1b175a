"""The `repeatability` section of the GPU check: the same config and seed twice on one GPU, in
two processes, with `cudnn_benchmark` on (the default) and off: max |diff| of the traces."""

from __future__ import annotations

from pathlib import Path

from gpu_common import NEEDS_CUDA, OUT_OF_TIME, Check, drift
from rows import Context
from workers import data_root, run_worker, trial_config


def repeatability_section(check: Check) -> None:
    context = check.context()
    root = data_root(context, gpu=True)
    for benchmark in (True, False):
        name = f"same seed twice, cudnn_benchmark {'on (default)' if benchmark else 'off'}"
        if not check.has_time(40):  # two worker processes: 42 s on the H100 (run 2)
            check.skip(name, OUT_OF_TIME)
        elif check.dry_run and not benchmark:  # cuDNN settings change nothing on a CPU
            check.skip(name, NEEDS_CUDA)
        else:
            with check.step(name):
                repeat(check, context, root, name, benchmark)


def repeat(check: Check, context: Context, root: Path, name: str, benchmark: bool) -> None:
    """ERM + ReLiF twice from one seed, in two worker processes: max |diff| of the traces."""
    config = trial_config(context, root, "relif", gpu=True)
    config["train"]["cudnn_benchmark"] = benchmark
    steps = check.size.repeat_steps
    traces = [run_worker(config, 0, steps, trace=True)["trace"] for _ in range(2)]
    values = list(drift(traces[0], traces[1]))
    worst = max(value[1] for value in values)
    detail = (
        f"ERM + ReLiF bf16 channels-last, {steps} steps from one seed in two processes on "
        f"{check.device.type}: every step's losses, weights and ReLiF state ({len(values)} "
        "numbers)"
    )
    result = "identical" if worst == 0 else "differs"
    check.row(name, worst, "max |diff|", detail, result=result)
