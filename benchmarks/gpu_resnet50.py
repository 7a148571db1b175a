"""The `resnet50` section of the GPU check: ResNet-50 at 288x384, batch 8: images/s, GPU
utilisation and peak memory of ERM, ERM + ReLiF and the plain fp32 loop, and the ERM+ReLiF /
ERM step time."""

from __future__ import annotations

from gpu_common import OUT_OF_TIME, Check, earlier_row
from memory_rows import PLAIN_LOOP, memory_and_throughput_rows, plain_loop_rows
from relif_rows import relif_rows
from utilisation import warm_up_gpu


def resnet50_section(check: Check) -> None:
    context = check.context()
    if not check.dry_run:
        warm_up_gpu(check.device)  # the first worker timed would meet idle clocks
    for variant in ("erm", "relif"):
        with check.step(f"training images/s, {variant}"):
            check.add(*memory_and_throughput_rows(context, (variant,), plain_loop=False))
    with check.step(f"training images/s, {PLAIN_LOOP}"):
        erm = earlier_row(check, "training images/s, erm")
        check.add(*plain_loop_rows(context, erm.value if erm else None))
    if not check.has_time(20):
        check.skip("ERM+ReLiF / ERM step time", OUT_OF_TIME)
        return
    with check.step("ERM+ReLiF / ERM step time"):
        check.add(*relif_rows(context, rounds=check.size.relif_rounds))
