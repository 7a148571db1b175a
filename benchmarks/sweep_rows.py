"""The `sweep` section of `run.py`: the efficiency of a local Ray sweep (`sweep_efficiency.py`,
imported when the section runs: it needs Ray), or a "not available" row without it."""

from __future__ import annotations

import importlib
import importlib.util

from rows import Context, Row
from timing import verdict

SWEEP_EFFICIENCY_MODULE = "sweep_efficiency"
"""benchmarks/sweep_efficiency.py: `measure(trial_seconds=...) -> {"ratio": ...}`, `TARGET`."""


def sweep_rows(ctx: Context) -> list[Row]:
    name = "sweep efficiency, local Ray (busy / wall x slots)"
    if importlib.util.find_spec(SWEEP_EFFICIENCY_MODULE) is None:
        return [
            Row(
                "sweep",
                name,
                None,
                "",
                ">= 0.97",
                "not available",
                "benchmarks/sweep_efficiency.py is not in this checkout",
            )
        ]
    module = importlib.import_module(SWEEP_EFFICIENCY_MODULE)
    result = module.measure(trial_seconds=8.0 if ctx.quick else 30.0)
    return [
        Row(
            "sweep",
            name,
            result["ratio"],
            "",
            f">= {module.TARGET}",
            verdict(result["ratio"] >= module.TARGET),
            f"{result['trials']} trials of {result['mean_trial_s']:.1f} s on "
            f"{result['slots']} slots, wall {result['wall_s']:.1f} s; idle slot-s: "
            f"{result['idle_start_s']:.1f} before the first trial (actor start, imports), "
            f"{result['idle_between_s']:.1f} between, {result['idle_end_s']:.1f} after the last",
        )
    ]
