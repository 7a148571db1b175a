"""The `default` section of the GPU check (c): what `sweeps/nyuv2.py --num-gpus 8` runs by
default against what it ran before the fast path became the default (`--no-gpu-fast-path`):
the trial config each composes (the sweep's own composition, through `sweep_request`), trained
in a trial worker at the GPU rows' size: images/s, GPU utilisation, peak memory."""

from __future__ import annotations

from gpu_common import OUT_OF_TIME, Check
from memory_rows import gpu_rows, setting_text, timed_worker
from workers import data_root

SWEEP_FLAGS = ["--num-gpus", "8"]
"""The headline command's resource flags (the check's machine has one GPU: only the trial
config is taken, which does not depend on how many GPUs the sweep may use)."""


def default_section(check: Check) -> None:
    rates = {}
    for name, extra in (("default", []), ("--no-gpu-fast-path", ["--no-gpu-fast-path"])):
        what = f"training images/s, sweeps/nyuv2.py {name}"
        if not check.has_time(25):
            check.skip(what, OUT_OF_TIME)
            continue
        with check.step(what):
            rates[name] = sweep_trial_rows(check, name, extra)
    if len(rates) == 2:
        ratio = rates["default"] / rates["--no-gpu-fast-path"]
        detail = "the same sweep command's ERM trial config, with and without the flag"
        check.row("sweeps/nyuv2.py default / --no-gpu-fast-path images/s", ratio, "x", detail)


def sweep_trial_rows(check: Check, name: str, extra: list[str]) -> float:
    """The ERM trial `sweeps/nyuv2.py --num-gpus 8 [extra]` would run, in a trial worker on the
    GPU rows' data (resnet50, the sweep's defaults: random weights, batch 8, Adam 1e-4); its
    rows, and its images/s."""
    from relif_ray.cli.sweep import DATASETS, sweep_request
    from relif_ray.sweep.trial_config import experiment_config

    context = check.context()
    root = data_root(context, gpu=True)
    argv = ["--data-dir", str(root), "--methods", "erm", "--seeds", "1", *SWEEP_FLAGS, *extra]
    argv += ["--storage", str(check.workdir / "default-plans")]
    request = sweep_request(argv, "nyuv2.py", tuple(DATASETS), False)
    config = experiment_config({**request.space.constants, **request.space.trials[0]})
    values = config.to_dict()
    values["train"]["epochs"] = 100_000
    if check.dry_run:  # the toy size on the CPU, the config's fields otherwise
        values["model"]["backbone"], values["device"] = "resnet18", "cpu"
    result = timed_worker(context, values)
    setting = f"{setting_text(values, root)}; cuda_graph {values['train']['cuda_graph']}"
    check.add(*gpu_rows(f"sweeps/nyuv2.py {name}", result, setting))
    return result["images_per_s"]
