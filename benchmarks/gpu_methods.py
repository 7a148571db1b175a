"""The `methods` section of the GPU check: the paper's other methods' images/s and memory, the
step-time ratios to ERM and TorchJD, then any further registered method while time lasts."""

from __future__ import annotations

from gpu_common import OUT_OF_TIME, Check
from memory_rows import memory_and_throughput_rows
from methods_rows import methods_rows
from rows import Context
from workers import variants


def methods_section(check: Check) -> None:
    """The paper's other methods, then the step-time ratios of every method to ERM and to
    TorchJD (one process for all), then the further methods' own rows while the section's time
    lasts: the ratios say more than one further method's images/s, and until run 2 they came
    last and were never reached."""
    from relif_ray.sweep.labels import PAPER_LABELS

    context = check.context()
    others = [v for v in variants() if v not in ("erm", "relif")]
    paper = [v for v in others if v in PAPER_LABELS]
    for method in paper:
        method_throughput(check, context, method)
    if not check.has_time(35):
        check.skip("method / ERM and / TorchJD step times", OUT_OF_TIME)
    else:
        with check.step("method / ERM and / TorchJD step times"):
            check.add(*methods_rows(context, check.size.method_rounds, check.size.cosine_steps))
    for method in [v for v in others if v not in paper]:
        method_throughput(check, context, method)


def method_throughput(check: Check, context: Context, method: str) -> None:
    """One method's images/s, GPU utilisation and peak memory, if 15 s are left."""
    name = f"training images/s, {method}"
    if not check.has_time(15):
        check.skip(name, OUT_OF_TIME)
        return
    with check.step(name):
        check.add(*memory_and_throughput_rows(context, (method,), plain_loop=False))
