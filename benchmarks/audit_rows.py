"""The `audit` section of `run.py`: fixed-delta audit pairs per second against a plain Python
loop (`audit_throughput.py`)."""

from __future__ import annotations

from rows import Context, Row
from timing import verdict


def audit_rows(ctx: Context) -> list[Row]:
    import audit_throughput as module

    result = module.measure(pairs=2**19 if ctx.quick else 2**21)
    return [
        Row(
            "audit",
            "fixed-delta audit throughput (1 core)",
            result["pairs_per_s"],
            "pairs/s",
            f">= {module.TARGET:.0e}",
            verdict(result["pairs_per_s"] >= module.TARGET),
            f"{result['pairs']:.3g} pairs in {result['seconds']:.3f} s (sampling included); "
            f"plain Python loop {result['loop_pairs_per_s']:.3g} pairs/s "
            f"({result['speedup']:.1f}x)",
        )
    ]
