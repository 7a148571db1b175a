"""The `relif-ops` section of `run.py`: ATen calls and device kernel launches of one ReLiF
regularizer forward + backward against their pinned bounds, counted by `relif_op_count.py`."""

from __future__ import annotations

import torch
from rows import Context, Row
from timing import verdict

RELIF_COUNT_METHODS = {
    "ATen calls": "nested calls included (torch.profiler)",
    "kernel launches": "operations on device tensors, views excluded, counted on the meta device",
}


def relif_op_count_rows(ctx: Context) -> list[Row]:
    """ATen calls and device kernel launches of one regularizer forward + backward (counts,
    made on the CPU whatever the device), against the counts before issue 29's rewrite
    (`relif_op_count.py`)."""
    import relif_op_count as module

    rows = []
    for setting in module.SETTINGS:
        shape = (
            f"{len(setting.tasks)} tasks, batch {setting.batch_size}, representation "
            f"{setting.width}; torch {torch.__version__}"
        )
        counts = {
            "ATen calls": (module.aten_calls, module.LIMIT, module.BEFORE),
            "kernel launches": (module.device_kernels, module.KERNEL_LIMIT, module.KERNELS_BEFORE),
        }
        for what, (count_of, limits, befores) in counts.items():
            how = RELIF_COUNT_METHODS[what]
            count, limit, before = count_of(setting), limits[setting.name], befores[setting.name]
            rows.append(
                Row(
                    "relif",
                    f"ReLiF regularizer {what} per step, {setting.name}",
                    count,
                    "",
                    f"<= {limit}",
                    verdict(count <= limit),
                    f"forward + backward, {how}; {before} before the rewrite "
                    f"({before / count:.2f}x); {shape}",
                )
            )
    return rows
