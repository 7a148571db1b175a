"""Pinned numbers: one short trial of each method on NYUv2 and one clinical trial, their
comparison with `pinned_numbers.json`, and the cross-kernel drift that sets its tolerance.

The pins guard refactorings: a moved line that changes a number must fail, on any machine.
Float32 kernels differ across CPU instruction sets (and GPUs), so a run on another machine
matches the pins only up to a drift that we measure instead of guess: `--measure-drift` runs
the pinned trials on this machine under other CPU kernel sets (`KERNEL_SETS`: ATen's
`ATEN_CPU_CAPABILITY`, oneDNN's `ONEDNN_MAX_CPU_ISA`, MKL's `MKL_CBWR`, each in a subprocess)
and records, per pinned trial and stage (each trace step, and the evaluation), the largest
relative drift from the pins in `pinned_drift.json`, as this machine's record beside those of
the other machines that measured it (the pins come from one machine, and a real CPU's own
kernels differ from every set that machine can emulate: an Intel Xeon with AMX drifts 37
times more at PCGrad's first step than any set emulated on the AMD EPYC that wrote the pins).
A stage's tolerance is `MARGIN` times the largest drift over the machines, and at least
`MARGIN` float32 ulps: the drift grows about tenfold per training
step (Adam's first steps amplify last-bit differences), so the early steps stay tight enough to
catch a 1% loss weight or a skipped step, which the evaluation alone could not tell from drift.

Bit-identity holds only on one machine and software stack (rerun, resume: tests/test_engine.py,
the kill-and-resume sweep tests). A change that alters numbers on purpose regenerates both
files in its own commit and says why (a few minutes):

    .venv/bin/python -m tests.pinned --write

(ReLiF trials on NYUv2 use the paper's squash, with the pinned ERM run's validation q10/q90.)
`drift` and `exceeded` also compare a run on another device with the pins; the GPU check runs
the pinned trials there with `python -m tests.pinned --compute OUT WORKDIR --device cuda`.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PINS = Path(__file__).with_name("pinned_numbers.json")
DRIFT = Path(__file__).with_name("pinned_drift.json")
NYUV2_LABELS = ["erm", "uncertainty", "gradnorm", "pcgrad", "fairgrad", "relif", "pcgrad+relif"]
CLINICAL_LABEL = "relif"
KEYS = [f"nyuv2/{label}" for label in NYUV2_LABELS] + [f"mimic3/{CLINICAL_LABEL}"]
MARGIN = 10.0
"""Tolerance = MARGIN x the largest drift measured across kernel sets (per trial and stage)."""
FLOAT32_EPS = float(np.finfo(np.float32).eps)
KERNEL_SETS: dict[str, dict[str, str]] = {
    "as-is": {},
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "onednn-avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "onednn-sse41": {"ONEDNN_MAX_CPU_ISA": "SSE41"},
    "mkl-compatible": {"MKL_CBWR": "COMPATIBLE"},
    "mkl-avx512": {"MKL_CBWR": "AVX512"},
    "avx2-cpu": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_CBWR": "AVX2",
        "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
    },
    "oldest-cpu": {
        "ATEN_CPU_CAPABILITY": "default",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "MKL_CBWR": "COMPATIBLE",
        "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR",
    },
}
"""Environment settings that make this machine compute like another CPU: ATen's vectorised
kernels, oneDNN's convolutions, MKL's matrix products and NumPy's (synthetic data) each at a
lower instruction set; "as-is" is the machine's own kernels (no drift on the machine that wrote
the pins). Each set runs in a fresh subprocess that writes its own data."""


def _trial(base: dict, label: str) -> tuple[dict, Any]:
    """Trace, validation metrics and summed audit scores of one short trial of `label`, and
    its validation result (an `EvalResult`)."""
    from relif_ray.config import ExperimentConfig
    from relif_ray.engine import TrainingRun
    from relif_ray.sweep.labels import variant
    from relif_ray.sweep.trial_config import TrialSpec

    run = TrainingRun(TrialSpec.of(variant(label), 0).config(ExperimentConfig.from_dict(base)))
    while not run.finished:
        run.train_epoch()
    result = run.evaluate("val")
    scores = result.scores.groupby("task")["score"].sum()
    numbers = {
        "trace": run.trace,
        "val": {key: float(value) for key, value in result.metrics.items()},
        "val_score_sums": {task: float(total) for task, total in scores.items()},
    }
    return numbers, result


def nyuv2_base(root: Path, device: str = "cpu") -> dict:
    """The pinned NYUv2 trials' config before the label's overrides (3 steps, warmup 1)."""
    from tests.conftest import tiny_config

    base = tiny_config(root, epochs=1, max_steps=3)
    base["relif"] = {"warmup_steps": 1}  # squash constants: the pinned ERM run's
    base["device"] = device
    return base


def clinical_base(root: Path, device: str = "cpu") -> dict:
    return {
        "seed": 0,
        "device": device,
        "data": {"dataset": "mimic3", "root": str(root)},
        "model": {"hidden_size": 16, "num_layers": 2},
        "train": {"epochs": 1, "max_steps": 3, "batch_size": 8, "optimizer": "adamw"},
        "relif": {"warmup_steps": 1},
    }


def write_data(workdir: Path) -> tuple[Path, Path]:
    """The pinned trials' synthetic NYUv2 and MIMIC-III folders, written into `workdir`."""
    from relif_ray.data.synthetic_mimic3 import write_synthetic_mimic3
    from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2
    from tests.conftest import TINY_DATA

    nyuv2 = workdir / "nyuv2"
    if not nyuv2.exists():
        write_synthetic_nyuv2(nyuv2, seed=0, **TINY_DATA)
    mimic3 = workdir / "mimic3"
    if not mimic3.exists():
        write_synthetic_mimic3(mimic3, patients=40, seed=0)
    return nyuv2, mimic3


def compute(workdir: Path, device: str = "cpu", keys: list[str] | None = None) -> dict:
    """Every pinned number (or those of `keys`), computed afresh on data written into
    `workdir`, with one CPU thread (the pins') or on `device`. A ReLiF trial on NYUv2 needs
    the ERM trial's squash constants, so ERM runs whenever one of them is asked for."""
    import torch

    torch.set_num_threads(1)
    keys = KEYS if keys is None else keys
    nyuv2, mimic3 = write_data(workdir)
    base = nyuv2_base(nyuv2, device)
    pins, results = {}, {}
    for label in NYUV2_LABELS:  # erm first: its validation run gives ReLiF's squash constants
        needed = f"nyuv2/{label}" in keys
        if needed or (label == "erm" and any(k.startswith("nyuv2/") for k in keys)):
            pins[f"nyuv2/{label}"], results[label] = _trial(base, label)
            base["relif"]["squash_constants"] = results["erm"].squash_constants(["depth", "normal"])
    if f"mimic3/{CLINICAL_LABEL}" in keys:
        pins[f"mimic3/{CLINICAL_LABEL}"] = _trial(clinical_base(mimic3, device), CLINICAL_LABEL)[0]
    return {key: pins[key] for key in keys}


# --- comparison -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Drift:
    """The largest deviation of one stage's numbers from the pins: relative (|a - b| /
    max(|a|, |b|)), absolute, and the number where the relative one occurs."""

    relative: float
    absolute: float
    where: str


def stage_of(path: str) -> str:
    """'step N' for a number of the trace's N-th step, 'eval' for validation numbers."""
    step = re.match(r"trace\[(\d+)\]", path)
    return f"step {step.group(1)}" if step else "eval"


def _numbers(value: object, path: str = "") -> dict[str, object]:
    """Every leaf of a pinned trial's numbers by its path: trace[1]/loss_seg, val/worst, ..."""
    if isinstance(value, dict):
        items = [(f"{path}/{key}" if path else str(key), item) for key, item in value.items()]
    elif isinstance(value, list):
        items = [(f"{path}[{index}]", item) for index, item in enumerate(value)]
    else:
        return {path: value}
    return {leaf: number for key, item in items for leaf, number in _numbers(item, key).items()}


def _deviation(a: object, b: object) -> tuple[float, float]:
    """(relative, absolute) deviation of two numbers; NaN matches only NaN."""
    if not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        return (0.0, 0.0) if a == b else (math.inf, math.inf)
    if math.isnan(a) or math.isnan(b):
        return (0.0, 0.0) if math.isnan(a) and math.isnan(b) else (math.inf, math.inf)
    absolute = abs(a - b)
    return (absolute / max(abs(a), abs(b)) if absolute else 0.0), absolute


def drift(computed: dict, pinned: dict | None = None) -> dict[str, dict[str, Drift]]:
    """Per pinned trial in `computed` and per stage, its largest deviation from `pinned` (the
    pins file by default). Numbers missing on either side (another trace length, a renamed
    metric) are an infinite drift, named in `where`."""
    pinned = json.loads(PINS.read_text()) if pinned is None else pinned
    report: dict[str, dict[str, Drift]] = {}
    for key, numbers in computed.items():
        ours, theirs = _numbers(numbers), _numbers(pinned[key])
        stages: dict[str, Drift] = {}
        for path in sorted(ours.keys() | theirs.keys()):
            if path in ours and path in theirs:
                relative, absolute = _deviation(ours[path], theirs[path])
            else:
                relative = absolute = math.inf
            stage = stage_of(path)
            known = stages.get(stage, Drift(0.0, 0.0, ""))
            stages[stage] = Drift(
                max(known.relative, relative),
                max(known.absolute, absolute),
                path if relative > known.relative else known.where,
            )
        report[key] = stages
    return report


def tolerances(measured: dict | None = None) -> dict[str, dict[str, float]]:
    """Per pinned trial and stage, the relative tolerance: MARGIN x the drift measured across
    kernel sets (`pinned_drift.json` by default), at least MARGIN float32 ulps."""
    measured = json.loads(DRIFT.read_text()) if measured is None else measured
    return {
        key: {stage: MARGIN * max(value, FLOAT32_EPS) for stage, value in stages.items()}
        for key, stages in measured["drift"].items()
    }


def exceeded(computed: dict, pinned: dict | None = None) -> list[str]:
    """One line per (trial, stage) of `computed` whose drift from the pins exceeds its
    tolerance; empty when the numbers match the pins."""
    limits = tolerances()
    lines = []
    for key, stages in drift(computed, pinned).items():
        for stage, found in stages.items():
            limit = limits[key].get(stage, MARGIN * FLOAT32_EPS)
            if not found.relative <= limit:
                lines.append(
                    f"{key} {stage}: relative drift {found.relative:.3g} at {found.where} "
                    f"exceeds the tolerance {limit:.3g}"
                )
    return lines


# --- writing the pins and measuring the drift -------------------------------------------------


def compute_with_kernels(env: dict[str, str], workdir: Path, keys: list[str] | None = None) -> dict:
    """`compute` in a subprocess whose environment selects other CPU kernels (`KERNEL_SETS`),
    on data it writes into `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "numbers.json"
    command = [sys.executable, "-m", "tests.pinned", "--compute", str(out), str(workdir)]
    subprocess.run(
        [*command, *(keys or [])],
        env={**os.environ, **env},
        cwd=Path(__file__).resolve().parents[1],
        check=True,
    )
    return json.loads(out.read_text())


def measure_drift(workdir: Path) -> dict:
    """The pins' drift under every kernel set of `KERNEL_SETS` on this machine, the largest per
    trial and stage, and which machine measured it."""
    per_set = {}
    for name, env in KERNEL_SETS.items():
        print(f"computing the pins with {name} kernels ({env})", flush=True)
        found = drift(compute_with_kernels(env, workdir / name))
        per_set[name] = {
            key: {stage: value.relative for stage, value in stages.items()}
            for key, stages in found.items()
        }
    largest = {
        key: {
            stage: max(per_set[name][key][stage] for name in per_set)
            for stage in per_set[next(iter(per_set))][key]
        }
        for key in KEYS
    }
    return {"drift": largest, "drift_per_kernel_set": per_set}


def record_drift(measured: dict, machine: str, recorded: dict | None = None) -> dict:
    """The drift file with `measured` (`measure_drift`) as `machine`'s record, beside the other
    machines' (a real CPU's own kernels differ from every set one machine can emulate), and
    the largest drift per trial and stage over all machines, which the tolerances use."""
    machines = dict((recorded or {}).get("machines", {}))
    machines[machine] = measured
    largest: dict[str, dict[str, float]] = {}
    for record in machines.values():
        for key, stages in record["drift"].items():
            known = largest.setdefault(key, {})
            for stage, value in stages.items():
                known[stage] = max(value, known.get(stage, 0.0))
    return {"kernel_sets": KERNEL_SETS, "machines": machines, "drift": largest}


def machine_name() -> str:
    """This machine as the drift file names it: CPU, best ATen kernels, AMX, torch."""
    import torch

    amx = " with AMX" if "amx_tile" in _cpu_flags() else ""
    return (
        f"{platform.machine()} {_cpu_name()}{amx}, best ATen kernels "
        f"{torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}"
    )


def _cpuinfo_lines() -> list[str]:
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.read_text().splitlines() if cpuinfo.exists() else []


def _cpu_flags() -> set[str]:
    flags = [line.split(":", 1)[1] for line in _cpuinfo_lines() if line.startswith("flags")]
    return set(flags[0].split()) if flags else set()


def _cpu_name() -> str:
    names = [
        line.split(":", 1)[1].strip() for line in _cpuinfo_lines() if line.startswith("model name")
    ]
    return names[0] if names else platform.processor() or "unknown CPU"


USAGE = "usage: python -m tests.pinned --write | --measure-drift | --compute OUT DIR [--device D]"


def main(argv: list[str]) -> None:
    if argv[:1] == ["--compute"] and len(argv) >= 3:  # OUT WORKDIR [--device D] [KEYS]
        device = argv.pop(argv.index("--device") + 1) if "--device" in argv else "cpu"
        keys = [key for key in argv[3:] if key != "--device"]
        numbers = compute(Path(argv[2]), device, keys or None)
        Path(argv[1]).write_text(json.dumps(numbers))
        return
    if argv not in (["--write"], ["--measure-drift"]):
        sys.exit(USAGE)
    with tempfile.TemporaryDirectory() as workdir:
        recorded = json.loads(DRIFT.read_text()) if DRIFT.exists() else None
        if argv == ["--write"]:
            PINS.write_text(json.dumps(compute(Path(workdir)), indent=1, sort_keys=True) + "\n")
            print(f"wrote {PINS}")
            recorded = None  # new pins: the other machines' drift no longer applies
        record = record_drift(measure_drift(Path(workdir)), machine_name(), recorded)
        DRIFT.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {DRIFT}")


if __name__ == "__main__":
    main(sys.argv[1:])
