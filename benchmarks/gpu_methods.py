"""The `methods` section of the GPU check (g): PCGrad's, FairGrad's, UPGrad's and Nash-MTL's
images/s and memory (they read the host each step, so their steps stay eager), then the
step-time ratios of every method to ERM and TorchJD, then any further registered method while
time lasts."""

from __future__ import annotations

from gpu_common import OUT_OF_TIME, Check
from memory_rows import memory_and_throughput_rows
from methods_rows import methods_rows
from rows import Context
from workers import variants

FIRST = ("pcgrad", "fairgrad", "upgrad", "nashmtl")
"""The gradient-aggregation methods whose GPU throughput is asked first."""


def methods_section(check: Check) -> None:
    context = check.context()
    available = [v for v in variants() if v not in ("erm", "relif")]
    first = [method for method in FIRST if method in available]
    for method in first:
        method_throughput(check, context, method)
    if not check.has_time(35):
        check.skip("method / ERM and / TorchJD step times", OUT_OF_TIME)
    else:
        with check.step("method / ERM and / TorchJD step times"):
            check.add(*methods_rows(context, check.size.method_rounds, check.size.cosine_steps))
    for method in [v for v in available if v not in first]:
        method_throughput(check, context, method)


def method_throughput(check: Check, context: Context, method: str) -> None:
    """One method's images/s, GPU utilisation and peak memory, if 15 s are left."""
    name = f"training images/s, {method}"
    if not check.has_time(15):
        check.skip(name, OUT_OF_TIME)
        return
    with check.step(name):
        check.add(*memory_and_throughput_rows(context, (method,), plain_loop=False))
