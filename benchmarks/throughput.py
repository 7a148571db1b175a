"""A training step's speed and memory: the `profile` suite (where one eager step's time goes,
host and GPU, from torch.profiler over steps issued back to back as in training: when the
host's time to issue a step exceeds its GPU time, the GPU waits for the host), and trials in
worker processes: `memory` (each variant's peak memory, and with the GPU rows its images/s),
`graph` (the step as one CUDA graph against eager steps and a plain fp32 loop), `default` (the
trial `sweeps/nyuv2.py --num-gpus 8` runs, with and without the fast path) and `compile`
(torch.compile's reduce-overhead mode against the engine's graph)."""

from __future__ import annotations

import copy
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.harness import NEEDS_GPU, OUT_OF_TIME, Context, trained_on
from benchmarks.workers import (
    data_root,
    setting_text,
    steps_as,
    timed_worker,
    trial_config,
    variants,
    worker_rows,
)
from relif_ray.experiment.record import CUDA_PEAK_MB

PLAIN_LOOP = "plain fp32 loop"
"""The same model trained by a hand-written fp32 loop (`workers.py --loop plain`)."""
GRAPHED = "training images/s, erm (graphed)"
NUMERIC_ROW = "graphed against eager, largest relative difference"
NUMERIC_STEPS = 10
COMPILED_RELIF = "relif, compiled regularizer"
"""ERM + ReLiF with `train.compile_relif`: the regularizer's step compiled as one graph."""


def variant_rows(ctx: Context, variant: str, erm: dict | None = None) -> dict:
    """One worker of `variant`: its peak memory (RSS on a CPU; with the GPU rows the worker's
    rows), as a multiple of ERM's when `erm` (ERM's result) is given; its result."""
    root = data_root(ctx, ctx.gpu_rows)
    config = trial_config(ctx, root, variant, ctx.gpu_rows)
    result = timed_worker(ctx, config)
    peak = CUDA_PEAK_MB if ctx.gpu_rows else "peak_rss_mb"
    note = f"{result[peak] / erm[peak]:.2f}x ERM's; " if erm and erm[peak] else ""
    if ctx.gpu_rows:
        worker_rows(ctx, variant, result, setting_text(config, root), note)
    else:
        ctx.row(f"peak RSS per trial, {variant}", result["peak_rss_mb"], "MiB",
                f"{note}resnet18 64x80 batch 8, one process; after imports "
                f"{result['rss_imports_mb']:.0f} MiB", result="info")  # fmt: skip
    return result


def memory_suite(ctx: Context) -> None:
    """Every variant's worker (ERM first: the others' memory is given as a multiple of its)."""
    erm = None
    for variant in variants():
        with ctx.step(f"peak memory per trial, {variant}"):
            result = variant_rows(ctx, variant, erm)
            erm = erm or result
    if not ctx.gpu_rows:
        for variant in variants():
            ctx.row(f"training images/s, {variant}", None, "img/s", result=NEEDS_GPU)


def warm_up_gpu(device: torch.device, seconds: float = 3.0) -> None:
    """Keep the GPU busy with matrix products for `seconds`, so that the first worker timed
    after an idle spell does not meet it at idle clocks."""
    a = torch.randn(4096, 4096, device=device)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(10):
            a = torch.tanh(a @ a)
        torch.cuda.synchronize(device)
    del a
    torch.cuda.empty_cache()


def graph_suite(ctx: Context) -> None:
    """ERM and ERM + ReLiF graphed (`train.cuda_graph: auto`) and eager (`off`), the plain
    fp32 loop, their ratios, then 10 graphed against 10 eager steps from one state."""
    if ctx.cuda:
        warm_up_gpu(ctx.device)  # the first worker timed would meet idle clocks
    root, rates = data_root(ctx, gpu=True), {}
    for variant in ("erm", "relif"):
        for mode in ("auto", "off"):
            name = f"{variant} ({'graphed' if mode == 'auto' else 'eager'})"
            if not ctx.has_time(20):
                ctx.skip(f"training images/s, {name}", OUT_OF_TIME)
                continue
            with ctx.step(f"training images/s, {name}"):
                config = trial_config(ctx, root, variant, gpu=True)
                config["train"]["cuda_graph"] = mode
                result = timed_worker(ctx, config)
                worker_rows(ctx, name, result, setting_text(config, root))
                rates[(variant, mode)] = result["images_per_s"]
    with ctx.step(f"training images/s, {PLAIN_LOOP}"):
        config = trial_config(ctx, root, "erm", gpu=True)
        config["train"].update(precision="fp32", channels_last=False, data_on_device=False)
        result = timed_worker(ctx, config, loop="plain")
        worker_rows(ctx, PLAIN_LOOP, result, setting_text(config, root))
        rates["plain"] = result["images_per_s"]
    ratio_rows(ctx, rates)
    compiled_relif_rows(ctx, root, rates.get(("erm", "auto")))
    if not ctx.has_time(30):
        ctx.skip(NUMERIC_ROW, OUT_OF_TIME)
        return
    with ctx.step("graphed against eager steps, numbers"):
        numeric_rows(ctx)


def ratio_rows(ctx: Context, rates: dict) -> None:
    erm, relif = rates.get(("erm", "auto")), rates.get(("relif", "auto"))
    if erm and rates.get("plain"):
        name = "graphed ERM images/s / plain fp32 loop"
        ctx.judged(name, name, erm / rates["plain"], "x", "the default GPU path against a "
                   "hand-written fp32 NCHW loop of the same model with host batches and torch's "
                   "default Adam")  # fmt: skip
    if erm and relif:
        name = "graphed ERM+ReLiF step / graphed ERM step"
        ctx.judged(name, name, erm / relif, "x", "images/s of ERM over ERM+ReLiF, both graphed")
    for variant in ("erm", "relif"):
        graphed, eager = rates.get((variant, "auto")), rates.get((variant, "off"))
        if graphed and eager:
            ctx.row(f"{variant}: graphed / eager images/s", graphed / eager, "x")


def compiled_relif_rows(ctx: Context, root, erm: float | None) -> None:  # noqa: ANN001
    """ERM + ReLiF graphed with the regularizer compiled (`train.compile_relif`; at toy size
    dynamo's eager backend, as the compile suite's), and its step against graphed ERM's."""
    name = f"training images/s, {COMPILED_RELIF} (graphed)"
    if not ctx.has_time(90):  # compilation takes most of it
        ctx.skip(name, OUT_OF_TIME)
        return
    with ctx.step(name):
        config = trial_config(ctx, root, "relif", gpu=True)
        config["train"].update(cuda_graph="auto", compile_relif=True)
        options = {"compile_backend": "eager"} if ctx.toy else {}
        result = timed_worker(ctx, config, **options)
        worker_rows(ctx, f"{COMPILED_RELIF} (graphed)", result, setting_text(config, root))
        if erm:
            name = "graphed ERM+ReLiF step, compiled regularizer / graphed ERM step"
            ctx.judged(name, name, erm / result["images_per_s"], "x", "images/s of ERM over "
                       "ERM+ReLiF with train.compile_relif, both graphed; compilation's steps "
                       "are not timed")  # fmt: skip


def numeric_rows(ctx: Context) -> None:
    """10 steps graphed and 10 eager (twice) from one state 2 steps in, ERM + ReLiF: the
    largest relative difference of every traced number and weight."""
    from relif_ray.config import ExperimentConfig
    from relif_ray.engine import TrainingRun
    from relif_ray.testing.runs import largest_relative_difference

    config = trial_config(ctx, data_root(ctx, gpu=True), "relif", gpu=True)

    def trained(mode: str, state: dict | None, steps: int) -> TrainingRun:
        train = {**config["train"], "cuda_graph": mode}
        run = TrainingRun(ExperimentConfig.from_dict({**config, "train": train}))
        if state is not None:  # a copy: loading keeps the optimiser's tensors, training moves them
            run.load_state_dict(copy.deepcopy(state))
        run.train_steps(steps)
        return run

    start = trained("off", None, 2).state_dict()
    eager = [trained("off", start, NUMERIC_STEPS) for _ in range(2)]
    graphed = trained("auto", start, NUMERIC_STEPS)
    spread = largest_relative_difference(eager[0], eager[1])
    difference = largest_relative_difference(graphed, eager[0])
    name = NUMERIC_ROW
    devices = trained_on(ctx, [str(run.device) for run in (*eager, graphed)], name)
    ctx.judged(name, name, difference, "", f"{NUMERIC_STEPS} steps from one state, ERM+ReLiF, "
               f"every traced number and weight; two eager runs differ by {spread:.3g} (CUDA's "
               f"atomic adds); steps {steps_as(graphed)}; {devices}",
               reference=max(10 * spread, 1e-5))  # fmt: skip


def default_suite(ctx: Context) -> None:
    """The ERM trial `sweeps/nyuv2.py --num-gpus 8` composes (the sweep's own composition),
    with and without `--no-gpu-fast-path`, each in a worker: images/s."""
    rates = {}
    for name, fast_path in (("default", True), ("--no-gpu-fast-path", False)):
        what = f"training images/s, sweeps/nyuv2.py {name}"
        if not ctx.has_time(25):
            ctx.skip(what, OUT_OF_TIME)
            continue
        with ctx.step(what):
            rates[name] = sweep_trial_rate(ctx, name, fast_path)
    if len(rates) == 2:
        ctx.row("sweeps/nyuv2.py default / --no-gpu-fast-path images/s",
                rates["default"] / rates["--no-gpu-fast-path"], "x",
                "the same sweep command's ERM trial config, with and without the flag")  # fmt: skip


def sweep_trial_rate(ctx: Context, name: str, gpu_fast_path: bool) -> float:
    """The ERM trial that `sweeps/nyuv2.py --num-gpus 8` runs (without the fast path:
    `--no-gpu-fast-path`), composed as the sweep composes it (`compose_config`, trials that
    get a GPU), in a worker on the GPU rows' data; its images/s."""
    from relif_ray.problems import benchmark
    from relif_ray.sweep.compose import compose_config
    from relif_ray.sweep.labels import variant
    from relif_ray.sweep.trial_config import TrialSpec

    root = data_root(ctx, gpu=True)
    defaults = benchmark("nyuv2").defaults
    base = compose_config(defaults, [], str(root), use_gpu=True, gpu_fast_path=gpu_fast_path)
    values = TrialSpec.of(variant("erm"), 0).config(base).to_dict()
    values["train"]["epochs"] = 100_000
    if not ctx.cuda:  # toy size on the CPU (its device "auto" is the CPU there)
        values["model"]["backbone"] = "resnet18"
    result = timed_worker(ctx, values)
    setting = f"{setting_text(values, root)}; cuda_graph {values['train']['cuda_graph']}"
    worker_rows(ctx, f"sweeps/nyuv2.py {name}", result, setting)
    return result["images_per_s"]


def compile_suite(ctx: Context) -> None:
    """ERM with `train.compile` in reduce-overhead mode (its own CUDA graphs; ours is then off)
    against ERM as one CUDA graph (the graph suite's row of this run): where compile measures
    equal or better, it should replace the engine's graph."""
    name = "training images/s, erm (compile, reduce-overhead)"
    if not ctx.has_time(90):  # compilation takes most of it
        ctx.skip(name, OUT_OF_TIME)
        return
    with ctx.step(name):
        root = data_root(ctx, gpu=True)
        config = trial_config(ctx, root, "erm", gpu=True)
        config["train"]["compile"] = True
        options = {"compile_backend": "eager"} if ctx.toy else {}
        result = timed_worker(ctx, config, compile_mode="reduce-overhead", **options)
        worker_rows(ctx, "erm (compile, reduce-overhead)", result, setting_text(config, root))
        graphed = ctx.earlier_row(GRAPHED)
        if graphed is None:
            ctx.skip(f"{name} / graphed", "no graphed ERM row in this run")
            return
        how = "dynamo, eager backend (toy size)" if ctx.toy else "inductor, reduce-overhead"
        ctx.row("ERM images/s, compile (reduce-overhead) / one CUDA graph",
                result["images_per_s"] / graphed.value, "x", f"{how}; compilation's steps are "
                "not timed", target=">= 1.0 would favour compile")  # fmt: skip


PROFILED_STEPS = 5
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
"""The CUDA runtime and driver calls that launch a kernel, as the profiler names them."""
FIGURES = {
    "host_ms": ("host time to issue a step", "ms"),
    "wall_ms": ("step time", "ms"),
    "kernel_ms": ("GPU time of a step (kernels, copies)", "ms"),
    "launches": ("kernel launches per step", ""),
    "aten_calls": ("ATen calls per step", ""),
}


def profile_steps(run, steps: int) -> dict[str, float | None]:  # noqa: ANN001
    """Per-step figures of `steps` eager steps of the `TrainingRun` `run` (the module doc). It
    issues the steps one by one (`_train_step`) and reads their trace afterwards, as
    `train_steps` does, so that the host's issue time is not mixed with the trace's sync."""
    cuda = run.device.type == "cuda"
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as profiler:
        start = time.perf_counter()
        for _ in range(steps):
            run._train_step()
        issued = time.perf_counter()
        synchronize()
        done = time.perf_counter()
    run._flush_trace()
    events = profiler.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_us = sum(e.time_range.elapsed_us() for e in kernels)
    return {
        "host_ms": 1e3 * (issued - start) / steps,
        "wall_ms": 1e3 * (done - start) / steps,
        "kernel_ms": kernel_us / 1e3 / steps if cuda else None,
        "launches": sum(e.name in LAUNCH_CALLS for e in events) / steps if cuda else None,
        "aten_calls": sum(e.name.startswith("aten::") for e in events) / steps,
    }


def profile_suite(ctx: Context) -> None:
    """ERM, ERM + ReLiF and, on CUDA, ERM + ReLiF with its regularizer compiled (inductor
    builds no kernels worth profiling on a CPU), then what ReLiF adds to ERM's step."""
    measured = {}
    for variant in ("erm", "relif", COMPILED_RELIF):
        if variant == COMPILED_RELIF and not ctx.cuda:
            ctx.skip(f"step profile, {variant}", NEEDS_GPU)
            continue
        with ctx.step(f"step profile, {variant}"):
            measured[variant] = profile_variant(ctx, variant)
    for variant, what in (("relif", "ERM+ReLiF"), (COMPILED_RELIF, "ERM+ReLiF compiled")):
        if "erm" not in measured or variant not in measured:
            continue
        for key, (title, unit) in FIGURES.items():
            erm, relif = measured["erm"][key], measured[variant][key]
            if erm is not None and relif is not None:
                ctx.row(f"{title}, {what} - ERM", relif - erm, unit, "eager steps")


def profile_variant(ctx: Context, variant: str) -> dict:
    """`PROFILED_STEPS` eager steps of `variant` after the workers' warm-up, as rows."""
    from benchmarks.workers import WORKER_WARMUP_STEPS
    from relif_ray.config import ExperimentConfig
    from relif_ray.engine import TrainingRun

    compiled = variant == COMPILED_RELIF
    config = trial_config(ctx, data_root(ctx, gpu=True), "relif" if compiled else variant, True)
    config["train"].update(cuda_graph="off", compile_relif=compiled)
    run = TrainingRun(ExperimentConfig.from_dict(config))
    run.train_steps(WORKER_WARMUP_STEPS if ctx.cuda else 1)
    figures = profile_steps(run, PROFILED_STEPS)
    devices = trained_on(ctx, [str(run.device)], f"profile, {variant}")
    detail = (f"{config['model']['backbone']}, batch {config['train']['batch_size']}, bf16, "
              f"channels-last, data on the device, eager, {devices}; mean of {PROFILED_STEPS} "
              "steps issued back to back (host time: until the last call returned; step time: "
              "until the GPU finished)")  # fmt: skip
    for key, (title, unit) in FIGURES.items():
        value = figures[key]
        ctx.row(f"{title}, {variant}", value, unit, detail,
                result="info" if value is not None else "needs CUDA")  # fmt: skip
    return figures
