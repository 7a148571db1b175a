"""The `breakdown` section of `run.py`: where one real trial's time goes, epoch by epoch
(`trial_breakdown.py`), at the demo's size and (without --quick) a larger one on the CPU, at
the paper's NYUv2 size on a GPU (the GPU check's `breakdown` section runs the same rows)."""

from __future__ import annotations

from rows import Context, Row
from timing import verdict

GROUP = "breakdown"
TRAIN_SHARE_TARGET = 0.8
"""On a GPU at the real size, training steps take at least this share of an epoch's span."""


def breakdown_rows(ctx: Context) -> list[Row]:
    from trial_breakdown import SIZES

    if ctx.cuda:
        names = ["real"]
    elif ctx.dry_run:
        names = ["toy"]
    else:
        names = ["demo"] if ctx.quick else ["demo", "larger"]
    rows = []
    for name in names:
        rows += size_rows(ctx, SIZES[name])
    return rows


def size_rows(ctx: Context, size: object, root: object = None) -> list[Row]:
    """The rows of one trial at `size`: each epoch's parts, the means, the train share now and
    before, the validation pass before and after, one checkpoint's size and seconds."""
    from trial_breakdown import measure, summary

    measured = measure(size, ctx.workdir / f"breakdown-{size.name}", ctx.cuda, root)
    totals = summary(measured)
    label = f"trial breakdown, {size.name}"
    rows = [
        Row(
            GROUP,
            f"{label}, epoch {index + 1}: train share",
            epoch["train_share"],
            "",
            "-",
            "info",
            epoch_detail(epoch),
        )  # fmt: skip
        for index, epoch in enumerate(measured["epochs"])
    ]
    return rows + [
        share_row(ctx, label, setting(ctx, size, measured), totals),
        evaluation_row(label, size, measured),
        checkpoint_row(label, measured, totals),
    ]


def setting(ctx: Context, size: object, measured: dict) -> str:
    path = "GPU fast path" if ctx.cuda else "CPU, 1 thread"
    return (
        f"{size.backbone} {size.height}x{size.width}, {size.train} train / {size.val} val "
        f"images, batch 8, {len(measured['epochs'])} epochs, ERM, {path}"
    )


def share_row(ctx: Context, label: str, where: str, totals: dict) -> Row:
    """The train share over the epochs, against 0.8 on a GPU, against before on the CPU."""
    share, before = totals["train_share"], totals["train_share_before"]
    target = f">= {TRAIN_SHARE_TARGET:g}" if ctx.cuda else "> before"
    passed = share >= TRAIN_SHARE_TARGET if ctx.cuda else share > before
    detail = (
        f"{where}; mean seconds per epoch: {epoch_detail(totals, suffix='_s')}; before (the "
        f"host evaluation path): {before:.3f}"
    )
    return Row(GROUP, f"{label}: train share of the epochs", share, "", target,
               verdict(passed), detail)  # fmt: skip


def evaluation_row(label: str, size: object, measured: dict) -> Row:
    host, device = measured["evaluate_host_s"], measured["evaluate_device_s"]
    detail = (
        f"{device:.3f} s against {host:.3f} s, the same model ({size.val} images), the faster "
        "of 2 after a warm-up; host path: relif_ray.testing.host_evaluation"
    )
    return Row(GROUP, f"{label}: validation pass, device path / host path", device / host, "x",
               "<= 1.0", verdict(device <= host), detail)  # fmt: skip


def checkpoint_row(label: str, measured: dict, totals: dict) -> Row:
    detail = (
        f"{measured['checkpoint_mb']:.0f} MB (weights, Adam's moments, ReLiF and RNG state) "
        "saved and copied once, as Tune persists it; after every epoch it would take "
        f"{totals['checkpoint_share_every_epoch']:.1%} of the epoch; the sweep's cadence keeps "
        "checkpoints at most 5% of a trial's time"
    )
    return Row(GROUP, f"{label}: one checkpoint", measured["checkpoint_write_s"], "s", "-",
               "info", detail)  # fmt: skip


def epoch_detail(parts: dict, suffix: str = "") -> str:
    """`train 1.21, evaluate 0.20, ...` seconds of one epoch (or of the means)."""
    names = ("train", "evaluate", "audit", "checkpoint", "rest")
    return ", ".join(f"{name} {parts[name + suffix]:.3f}" for name in names)
