"""The `packing` section of `run.py` (CUDA only): aggregate images/s and the GPU's utilisation
for 1, 2 and 4 ERM trial workers packed on one GPU."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

from rows import Context, Row
from utilisation import UtilisationSampler
from workers import WORKER_WARMUP_STEPS, data_root, run_worker, trial_config

PACKED_TRIALS = (1, 2, 4)


def packing_rows(ctx: Context) -> list[Row]:
    if not ctx.cuda:
        return [
            Row("gpu", f"GPU utilisation, {k} ERM trial(s) packed", None, "%", "-", "needs a GPU")
            for k in PACKED_TRIALS
        ]
    root = data_root(ctx, gpu=True)
    seconds = 10.0 if ctx.quick else 30.0
    rows = []
    for count in PACKED_TRIALS:
        start_at = time.time() + 60.0  # every worker set up and warmed up by then
        sampler = UtilisationSampler(ctx.device, start_at, seconds)
        sampler.start()
        config = trial_config(ctx, root, "erm", gpu=True)
        job = functools.partial(
            run_worker, config, WORKER_WARMUP_STEPS, seconds=seconds, start_at=start_at
        )
        results = _parallel([job] * count)
        sampler.join()
        utilisation = sampler.mean()
        rows.append(
            Row(
                "gpu",
                f"GPU utilisation, {count} ERM trial(s) packed",
                utilisation,
                "%",
                "-",
                "info" if utilisation is not None else "no reading",
                f"aggregate {sum(r['images_per_s'] for r in results):.1f} img/s over "
                f"{seconds:.0f} s; peak GPU memory per trial "
                f"{max(r['cuda_peak_mb'] for r in results):.0f} MiB",
            )
        )
    return rows


def _parallel(jobs: list[Callable[[], dict]]) -> list[dict]:
    results: list[dict] = [{}] * len(jobs)

    def target(index: int) -> None:
        results[index] = jobs[index]()

    threads = [threading.Thread(target=target, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if any(not result for result in results):
        raise RuntimeError("a packed trial worker failed")
    return results
