"""The `cuda` section of the GPU check: the CUDA-only tests (`pytest -m cuda tests/`, one row per
test case) and the pinned numbers recomputed with every run on CUDA (max abs/rel
drift per key)."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from gpu_common import OUT_OF_TIME, REPO, Check, drift, run_command
from rows import Row


def cuda_section(check: Check) -> None:
    junit = check.workdir / "cuda_tests.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["-m", "cuda", "tests/", f"--junitxml={junit}"]
    run_command(check, command)
    check.add(*pytest_case_rows(junit))
    if not check.has_time(20):
        check.skip("pinned numbers on CUDA", OUT_OF_TIME)
        return
    with check.step("pinned numbers on CUDA"):
        pinned_rows(check)


def pytest_case_rows(junit: Path) -> list[Row]:
    """One row per test case of a pytest JUnit XML report (no report: one FAIL row)."""
    if not junit.exists():
        return [Row("cuda", "CUDA-only tests", None, "", "pass", "FAIL", "pytest wrote no report")]
    rows = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        outcome, detail = "pass", f"{case.get('time', '?')} s"
        for tag, name in (("failure", "FAIL"), ("error", "FAIL"), ("skipped", "skipped")):
            element = case.find(tag)
            if element is not None:
                outcome, detail = name, (element.get("message") or tag).splitlines()[0][:300]
                break
        rows.append(Row("cuda", f"test {case.get('name')}", None, "", "pass", outcome, detail))
    return rows


def pinned_rows(check: Check) -> None:
    """The pinned trials run on the check's device (`python -m tests.pinned --compute`): each
    key's max absolute and relative drift from `tests/pinned_numbers.json`."""
    out = check.workdir / "pinned_on_device.json"
    command = [sys.executable, "-m", "tests.pinned", "--compute", str(out)]
    command += [str(check.workdir / "pins"), "--device", check.device.type]
    if run_command(check, command) != 0:
        raise RuntimeError("python -m tests.pinned --compute failed (see the log)")
    pins = json.loads((REPO / "tests" / "pinned_numbers.json").read_text())
    computed = json.loads(out.read_text())
    for key in sorted(pins):
        name = f"pinned numbers drift on {check.device.type}, {key}"
        try:
            values = list(drift(pins[key], computed.get(key)))
        except ValueError as exc:
            check.row(name, None, "", str(exc), target="same structure", result="FAIL")
            continue
        where, worst, _ = max(values, key=lambda value: value[1])
        detail = f"max |diff| {worst:.3g} at {where}; {len(values)} numbers compared"
        check.row(name, max(value[2] for value in values), "rel", detail)
