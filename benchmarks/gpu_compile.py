"""The `compile` section of the GPU check (h): ERM with `train.compile` in torch.compile's
"reduce-overhead" mode (its own CUDA graphs; our graph is then off) against ERM as one CUDA
graph (`train.cuda_graph: auto`, the graph section's row when it ran): images/s. Where compile
measures equal or better, it should replace the engine's graph."""

from __future__ import annotations

from gpu_common import OUT_OF_TIME, Check, earlier_row
from memory_rows import gpu_rows, setting_text, timed_worker
from workers import data_root, trial_config

GRAPHED = "training images/s, erm (graphed)"


def compile_section(check: Check) -> None:
    name = "training images/s, erm (compile, reduce-overhead)"
    if not check.has_time(90):  # compilation takes most of it
        check.skip(name, OUT_OF_TIME)
        return
    with check.step(name):
        compiled = compiled_rate(check)
        graphed = earlier_row(check, GRAPHED)
        if graphed is None:
            check.skip(f"{name} / graphed", "no graphed ERM row in this run")
            return
        how = "dynamo, eager backend (dry run)" if check.dry_run else "inductor, reduce-overhead"
        check.row("ERM images/s, compile (reduce-overhead) / one CUDA graph",
                  compiled / graphed.value, "x", f"{how}; compilation's steps are not timed",
                  ">= 1.0 would favour compile", "info")  # fmt: skip


def compiled_rate(check: Check) -> float:
    context = check.context()
    root = data_root(context, gpu=True)
    config = trial_config(context, root, "erm", gpu=True)
    config["train"]["compile"] = True
    options = {"compile_backend": "eager"} if check.dry_run else {}
    result = timed_worker(context, config, compile_mode="reduce-overhead", **options)
    check.add(*gpu_rows("erm (compile, reduce-overhead)", result, setting_text(config, root)))
    return result["images_per_s"]
