"""The `breakdown` section of the GPU check: where one real-size trial's time goes, epoch by
epoch (`breakdown_rows.py`, `trial_breakdown.py`): ResNet-50 on 795 / 654 synthetic NYUv2
images at 288x384, the GPU fast path; toy sizes on the CPU in a dry run."""

from __future__ import annotations

from breakdown_rows import size_rows
from gpu_common import Check, real_data


def breakdown_section(check: Check) -> None:
    from trial_breakdown import SIZES

    size = SIZES["toy" if check.dry_run else "real"]
    with check.step(f"trial breakdown, {size.name}"):
        check.add(*size_rows(check.context(), size, real_data(check)))
