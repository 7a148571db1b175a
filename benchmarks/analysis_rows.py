"""The `analysis` section of `run.py`: load and audit generated trials (`analysis_load.py`;
--quick times 100 and judges the linear extrapolation to 1,000)."""

from __future__ import annotations

from rows import Context, Row
from timing import verdict


def analysis_rows(ctx: Context) -> list[Row]:
    import analysis_load as module

    trials = 100 if ctx.quick else 1000
    root = ctx.workdir / "analysis"
    generated = module.generate(root, trials, 654)
    result = module.measure(root)
    per_thousand = result["total_s"] * 1000 / trials
    passed = per_thousand <= module.TARGET_SECONDS
    detail = (
        f"load {result['load_s']:.2f} s + audit {result['audit_s']:.2f} s; generating took "
        f"{generated:.0f} s (not timed)"
    )
    if ctx.quick:
        detail = f"{trials} trials (--quick), x10 = {per_thousand:.1f} s for 1000; " + detail
    return [
        Row(
            "analysis",
            f"load + audit {trials} generated trials",
            result["total_s"],
            "s",
            f"<= {module.TARGET_SECONDS:g} s / 1000",
            verdict(passed) + (" (scaled)" if ctx.quick else ""),
            detail,
        )
    ]
