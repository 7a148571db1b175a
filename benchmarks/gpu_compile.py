"""The `compile` section of the GPU check: ERM's images/s with `train.compile` against without."""

from __future__ import annotations

from gpu_common import OUT_OF_TIME, Check, earlier_row
from memory_rows import memory_and_throughput_rows


def compile_section(check: Check) -> None:
    """ERM with `train.compile` against the same worker without it (the resnet50 section's
    row when it ran)."""
    with check.step("training images/s, erm (compile)"):
        compile_rows(check)


def compile_rows(check: Check) -> None:
    if not check.has_time(90):
        check.skip("training images/s, erm (compile)", OUT_OF_TIME)
        return
    backend = "eager" if check.dry_run else None
    context = check.context(compile=True, compile_backend=backend)
    rows = memory_and_throughput_rows(context, ("erm",), plain_loop=False)
    check.add(*rows)
    compiled = next(r for r in rows if r.name == "training images/s, erm (compile)")
    plain = earlier_row(check, "training images/s, erm")
    if plain is None:
        rows = memory_and_throughput_rows(check.context(), ("erm",), plain_loop=False)
        check.add(*rows)
        plain = next(r for r in rows if r.name == "training images/s, erm")
    how = "dynamo with the eager backend (dry run)" if backend else "inductor, default mode"
    detail = f"{how}; the first 3 steps (compilation) are not timed"
    check.row(
        "ERM images/s with train.compile / without", compiled.value / plain.value, "x", detail
    )
