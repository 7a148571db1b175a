"""The `methods` section of `run.py`: each method's step time over ERM's and over TorchJD's or
LibMTL's implementation, and the representation-gradient modes' update cosines, measured by
`methods_step_time.py` (imported when the section runs: it needs TorchJD)."""

from __future__ import annotations

import statistics

from rows import GPU_SIZE, Context, Row


def methods_rows(ctx: Context, rounds: int | None = None, cosine_steps: int = 20) -> list[Row]:
    import methods_step_time as module

    if ctx.cuda:
        description, summary, cosines = module.measure(
            "cuda",
            quick=ctx.quick,
            batch_size=GPU_SIZE["batch_size"],
            height=GPU_SIZE["height"],
            width=GPU_SIZE["width"],
            backbone=GPU_SIZE["backbone"],
            head_channels=128,
            rounds=rounds,
            cosine_steps=cosine_steps,
        )
    else:
        description, summary, cosines = module.measure(
            "cpu", quick=ctx.quick, rounds=rounds, cosine_steps=cosine_steps
        )
    rows = []
    for name, timing in summary.items():
        if name in module.COUNTERPART.values() or name == "erm":
            continue
        detail = f"{timing.ms_per_step:.1f} ms/step; {description}"
        target, result = "-", "info"
        if timing.erm_verdict is not None:  # representation modes have a target over ERM
            lower, upper = timing.vs_erm_interval
            target, result = f"<= {module.REPRESENTATION_TARGET}", timing.erm_verdict
            detail = f"[{lower:.2f}, {upper:.2f}]; {detail}"
        rows.append(
            Row("methods", f"{name} / ERM step time", timing.vs_erm, "x", target, result, detail)
        )
        if timing.vs_package is not None:
            median, lower, upper = timing.vs_package
            rows.append(
                Row(
                    "methods",
                    f"{name} / {module.COUNTERPART[name]} step time",
                    median,
                    "x",
                    f"<= {module.TARGET}",
                    timing.verdict,
                    f"[{lower:.2f}, {upper:.2f}]",
                )
            )
    for name, values in cosines.items():
        rows.append(
            Row(
                "methods",
                f"{name}-representation update cosine with exact",
                statistics.mean(values),
                "",
                "-",
                "info",
                f"mean over {len(values)} steps on one batch; first {values[0]:.4f}, "
                f"min {min(values):.4f}",
            )
        )
    return rows
