"""The GPU check's last suites: `cuda` (the CUDA-only tests, one row per test, and the pinned
numbers recomputed on the device) and `repeatability` (the same seed twice in two processes)."""

from __future__ import annotations

import json
import math
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from pathlib import Path

from benchmarks.harness import NEEDS_CUDA, OUT_OF_TIME, REPO, Context, Row, trained_on
from benchmarks.targets import TARGETS
from benchmarks.workers import data_root, run_worker, trial_config

PINS = REPO / "tests" / "pinned_numbers.json"


def cuda_suite(ctx: Context) -> None:
    junit = ctx.workdir / "cuda_tests.xml"
    ctx.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda",
             *cuda_test_modules(), f"--junitxml={junit}"])  # fmt: skip
    ctx.add(*pytest_case_rows(junit))
    if not ctx.has_time(20):
        ctx.skip("pinned numbers on CUDA", OUT_OF_TIME)
        return
    with ctx.step("pinned numbers on CUDA"):
        pinned_rows(ctx)


def cuda_test_modules() -> list[str]:
    """The test modules that hold CUDA-only tests (`@needs_cuda`). Only these are collected:
    the others import what the GPU machine need not have (nbformat for the notebook's tests),
    and a module that fails to import would be a failed row that says nothing about CUDA."""
    modules = sorted((REPO / "tests").glob("test_*.py"))
    return [str(m.relative_to(REPO)) for m in modules if "@needs_cuda" in m.read_text()]


def pytest_case_rows(junit: Path) -> list[Row]:
    """One row per test case of a pytest JUnit XML report (no report: one FAIL row)."""
    target = TARGETS["CUDA-only tests"].text
    if not junit.exists():
        return [Row("CUDA-only tests", None, "", target, "FAIL", "pytest wrote no report")]
    rows = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        outcome, detail = "pass", f"{case.get('time', '?')} s"
        for tag, name in (("failure", "FAIL"), ("error", "FAIL"), ("skipped", "skipped")):
            element = case.find(tag)
            if element is not None:
                outcome, detail = name, (element.get("message") or tag).splitlines()[0][:300]
                break
        rows.append(Row(f"test {case.get('name')}", None, "", target, outcome, detail))
    return rows


def pinned_rows(ctx: Context) -> None:
    """The pinned trials run on the suite's device (`python -m tests.pinned --compute`): each
    key's largest relative drift from the pins, and where its largest absolute one is."""
    out = ctx.workdir / "pinned_on_device.json"
    command = [sys.executable, "-m", "tests.pinned", "--compute", str(out),
               str(ctx.workdir / "pins"), "--device", ctx.device.type]  # fmt: skip
    if ctx.run(command) != 0:
        raise RuntimeError(f"{' '.join(command[1:4])} failed (see the log)")
    pins, computed = json.loads(PINS.read_text()), json.loads(out.read_text())
    for key in sorted(pins):
        name = f"pinned numbers drift on {ctx.device.type}, {key}"
        try:
            values = list(drift(pins[key], computed.get(key)))
        except ValueError as exc:
            ctx.row(name, None, "", str(exc), target="same structure", result="FAIL")
            continue
        where, worst, _ = max(values, key=lambda value: value[1])
        ctx.row(name, max(value[2] for value in values), "rel",
                f"max |diff| {worst:.3g} at {where}; {len(values)} numbers compared")  # fmt: skip


def drift(pinned: object, computed: object, path: str = "") -> Iterator[tuple[str, float, float]]:
    """(path, |computed - pinned|, that over |pinned|) of every number of two JSON trees; NaN
    against NaN is no drift, NaN against a number an infinite one; a difference in structure
    raises ValueError naming its path."""
    if isinstance(pinned, dict) and isinstance(computed, dict):
        if pinned.keys() != computed.keys():
            differ = sorted(pinned.keys() ^ computed.keys())
            raise ValueError(f"{path or '/'}: keys {differ} differ")
        for key in pinned:
            yield from drift(pinned[key], computed[key], f"{path}/{key}")
    elif isinstance(pinned, list) and isinstance(computed, list):
        if len(pinned) != len(computed):
            raise ValueError(f"{path}: {len(computed)} entries, {len(pinned)} pinned")
        for index, (a, b) in enumerate(zip(pinned, computed, strict=True)):
            yield from drift(a, b, f"{path}[{index}]")
    elif isinstance(pinned, int | float) and isinstance(computed, int | float):
        a, b = float(pinned), float(computed)
        if math.isnan(a) or math.isnan(b):
            both = math.isnan(a) and math.isnan(b)
            yield (path, 0.0, 0.0) if both else (path, math.inf, math.inf)
            return
        difference = abs(b - a)
        yield path, difference, difference / abs(a) if a != 0 else difference
    elif pinned != computed:
        raise ValueError(f"{path}: {computed!r}, pinned {pinned!r}")


def repeatability_suite(ctx: Context) -> None:
    for benchmark in (True, False):
        name = f"same seed twice, cudnn_benchmark {'on (default)' if benchmark else 'off'}"
        if not ctx.has_time(40):  # two worker processes: 42 s on the H100
            ctx.skip(name, OUT_OF_TIME)
        elif not ctx.cuda and not benchmark:  # cuDNN settings change nothing on a CPU
            ctx.skip(name, NEEDS_CUDA)
        else:
            with ctx.step(name):
                repeat(ctx, name, benchmark)


def repeat(ctx: Context, name: str, benchmark: bool) -> None:
    """ERM + ReLiF twice from one seed, in two worker processes: max |diff| of the traces."""
    config = trial_config(ctx, data_root(ctx, gpu=True), "relif", gpu=True)
    config["train"]["cudnn_benchmark"] = benchmark
    steps = 3 if ctx.toy else 20
    results = [run_worker(config, 0, steps, trace=True) for _ in range(2)]
    devices = trained_on(ctx, [result["device"] for result in results], name)
    values = list(drift(results[0]["trace"], results[1]["trace"]))
    worst = max(value[1] for value in values)
    ctx.row(name, worst, "max |diff|",
            f"ERM + ReLiF bf16 channels-last, {steps} steps from one seed in two processes, "
            f"{devices}: every step's losses, weights and ReLiF state ({len(values)} numbers)",
            result="identical" if worst == 0 else "differs")  # fmt: skip
