"""The `graph` section of the GPU check (b): ERM and ERM + ReLiF with the whole step as one CUDA
graph (`train.cuda_graph: auto`) against eager steps (`off`), in trial worker processes at the
GPU rows' size, and the plain fp32 loop: images/s, GPU utilisation, peak memory. Targets:
graphed ERM >= 2.1x the plain fp32 loop; graphed ERM+ReLiF step <= 1.05x graphed ERM's. Then
the numeric difference of 10 graphed steps against 10 eager steps from one state, beside the
eager path's own difference between two runs."""

from __future__ import annotations

from gpu_common import OUT_OF_TIME, Check
from memory_rows import gpu_rows, plain_loop_rows, setting_text, timed_worker
from timing import verdict
from utilisation import warm_up_gpu
from workers import data_root, trial_config

PLAIN_LOOP_TARGET = 2.1
"""Graphed ERM's images/s over the plain fp32 loop's."""
RELIF_TARGET = 1.05
"""Graphed ERM+ReLiF's step time over graphed ERM's."""
NUMERIC_STEPS = 10


def graph_section(check: Check) -> None:
    context = check.context()
    if not check.dry_run:
        warm_up_gpu(check.device)  # the first worker timed would meet idle clocks
    rates = {}
    for variant in ("erm", "relif"):
        for mode in ("auto", "off"):
            name = f"{variant} ({'graphed' if mode == 'auto' else 'eager'})"
            if not check.has_time(20):
                check.skip(f"training images/s, {name}", OUT_OF_TIME)
                continue
            with check.step(f"training images/s, {name}"):
                config = trial_config(context, data_root(context, gpu=True), variant, gpu=True)
                config["train"]["cuda_graph"] = mode
                result = timed_worker(context, config)
                setting = setting_text(config, data_root(context, gpu=True))
                check.add(*gpu_rows(name, result, setting))
                rates[(variant, mode)] = result["images_per_s"]
    with check.step("training images/s, plain fp32 loop"):
        plain = plain_loop_rows(context, None)
        check.add(*plain)
        rates["plain"] = next(r.value for r in plain if r.name.startswith("training images/s"))
    ratio_rows(check, rates)
    if check.has_time(30):
        with check.step("graphed against eager steps, numbers"):
            numeric_rows(check)


def ratio_rows(check: Check, rates: dict) -> None:
    """The targets and the graph's speed-up, from the rates measured above."""
    erm, relif = rates.get(("erm", "auto")), rates.get(("relif", "auto"))
    if erm and rates.get("plain"):
        ratio = erm / rates["plain"]
        check.row("graphed ERM images/s / plain fp32 loop", ratio, "x",
                  "the default GPU path against a hand-written fp32 NCHW loop",
                  f">= {PLAIN_LOOP_TARGET}", verdict(ratio >= PLAIN_LOOP_TARGET))  # fmt: skip
    if erm and relif:
        ratio = erm / relif
        check.row("graphed ERM+ReLiF step / graphed ERM step", ratio, "x",
                  "images/s of ERM over ERM+ReLiF, both graphed",
                  f"<= {RELIF_TARGET}", verdict(ratio <= RELIF_TARGET))  # fmt: skip
    for variant in ("erm", "relif"):
        graphed, eager = rates.get((variant, "auto")), rates.get((variant, "off"))
        if graphed and eager:
            check.row(f"{variant}: graphed / eager images/s", graphed / eager, "x", "")


def numeric_rows(check: Check) -> None:
    """10 steps graphed and 10 eager (twice) from one state 2 steps in, ERM + ReLiF: the
    largest relative difference of every traced number and weight."""
    from relif_ray.config import ExperimentConfig
    from relif_ray.engine import TrainingRun
    from relif_ray.testing.runs import largest_relative_difference

    context = check.context()
    config = trial_config(context, data_root(context, gpu=True), "relif", gpu=True)

    def trained(mode: str, state: dict | None, steps: int) -> TrainingRun:
        run = TrainingRun(ExperimentConfig.from_dict(
            {**config, "train": {**config["train"], "cuda_graph": mode}}))  # fmt: skip
        if state is not None:
            run.load_state_dict(state)
        run.train_steps(steps)
        return run

    start = trained("off", None, 2).state_dict()
    eager = [trained("off", start, NUMERIC_STEPS) for _ in range(2)]
    graphed = trained("auto", start, NUMERIC_STEPS)
    spread = largest_relative_difference(eager[0], eager[1])
    difference = largest_relative_difference(graphed, eager[0])
    captured = graphed.graphed is not None and graphed.graphed.graph is not None
    check.row("graphed against eager, largest relative difference", difference, "",
              f"{NUMERIC_STEPS} steps from one state, ERM+ReLiF, every traced number and "
              f"weight; two eager runs differ by {spread:.3g} (CUDA's atomic adds); "
              f"{'captured' if captured else 'NOT captured: ' + str(graphed.eager_reason)}",
              "<= 10x eager's, >= 1e-5", verdict(difference <= max(10 * spread, 1e-5)))  # fmt: skip
