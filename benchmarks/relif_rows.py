"""The `relif` section of `run.py`: ERM + ReLiF step time over ERM's, on the dense NYUv2 model
and the clinical LSTM (target <= 1.05), measured by `relif_step_time.py`."""

from __future__ import annotations

from rows import GPU_FAST_PATH, TOY_SIZE, Context, Row
from timing import verdict_at_most


def relif_rows(ctx: Context, rounds: int | None = None) -> list[Row]:
    import relif_step_time as module

    rounds = rounds or (20 if ctx.quick else 60)
    fast = GPU_FAST_PATH if ctx.gpu_rows else {}
    if ctx.cuda:
        dense = module.Setting(
            device="cuda",
            rounds=rounds,
            backbone="resnet50",
            height=288,
            width=384,
            batch_size=8,
            train=fast,
        )
    else:
        size = TOY_SIZE if ctx.dry_run else (64, 80) if ctx.quick else (96, 128)
        dense = module.Setting(rounds=rounds, height=size[0], width=size[1], train=fast)
    small = ctx.quick and not ctx.cuda
    lstm = module.Setting(
        model="lstm",
        device=str(ctx.device),
        rounds=rounds,
        batch_size=4 if ctx.dry_run else 16 if small else 64,
        patients=12 if ctx.dry_run else 40 if small else 120,
    )
    rows = []
    for label, setting in (("dense", dense), ("clinical LSTM", lstm)):
        result = module.measure(setting)
        shape = (
            f"{setting.backbone} {setting.height}x{setting.width}"
            if setting.model == "dense"
            else "LSTM 2x256"
        )
        rows.append(
            Row(
                "relif",
                f"ERM+ReLiF / ERM step time, {label}",
                result["ratio"],
                "x",
                f"<= {module.TARGET}",
                verdict_at_most(result["ratio"], result["ratio_low"], module.TARGET),
                f"[{result['ratio_low']:.3f}, {result['ratio_high']:.3f}]; {shape}, batch "
                f"{int(result['batch_size'])}; ERM {1e3 * result['erm_step_s']:.1f} ms, "
                f"ReLiF {1e3 * result['relif_step_s']:.1f} ms; {setting.rounds} rounds",
            )
        )
    return rows
