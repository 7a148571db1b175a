"""The architectures section of `run.py`: each NYUv2 architecture's step time over LibMTL 1.1.5's
same architecture on the same model and batch (`architectures_step_time.py`, target <= 1.0),
and its peak memory per trial (one `trial_worker.py` process each, ERM)."""

from __future__ import annotations

from memory_rows import setting_text, timed_worker
from rows import GPU_SIZE, Context, Row
from workers import data_root, trial_config


def architecture_rows(
    ctx: Context, names: tuple[str, ...] | None = None, rounds: int | None = None
) -> list[Row]:
    """The step-time rows of `names` (default: every NYUv2 architecture), then their memory
    rows (on CUDA in the GPU rows' setting)."""
    import architectures_step_time as module

    size = {}
    if ctx.cuda:
        size = {key: GPU_SIZE[key] for key in ("batch_size", "height", "width", "backbone")}
    device = "cuda" if ctx.cuda else "cpu"
    description, timings = module.measure(device, ctx.quick, rounds, architectures=names, **size)
    rows = []
    for name, timing in timings.items():
        median, lower, upper = timing.ratio
        rows.append(
            Row(
                "architectures",
                f"{name} / LibMTL {module.LIBMTL_NAMES[name]} step time",
                median,
                "x",
                f"<= {module.TARGET}",
                timing.verdict,
                f"[{lower:.2f}, {upper:.2f}]; {timing.ms_per_step:.1f} against "
                f"{timing.libmtl_ms_per_step:.1f} ms/step; {description}",
            )
        )
    return rows + memory_rows(ctx, list(timings), module.QUICK_OPTIONS)


def memory_rows(ctx: Context, names: list[str], quick_options: dict[str, dict]) -> list[Row]:
    """Peak memory of one ERM trial per architecture, each in its own worker process."""
    root = data_root(ctx, ctx.gpu_rows)
    peak = "cuda_peak_mb" if ctx.cuda else "peak_rss_mb"
    where = "torch.cuda.max_memory_allocated" if ctx.cuda else "peak RSS, one process"
    rows = []
    for name in names:
        config = trial_config(ctx, root, "erm", ctx.gpu_rows)
        options = quick_options.get(name, {}) if ctx.quick else {}
        config["model"].update(architecture=name, architecture_options=options)
        result = timed_worker(ctx, config)
        rows.append(
            Row(
                "memory",
                f"peak {'GPU memory' if ctx.cuda else 'RSS'} per trial, architecture {name}",
                result[peak],
                "MiB",
                "-",
                "info",
                f"{setting_text(config, root)}, ERM, {where}",
            )
        )
    return rows
