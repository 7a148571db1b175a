"""What a sweep leaves for its user, pinned: Tune's stored results of every trial
(`result.json`: every line's keys in their order and their values; `progress.csv`: its header
and rows), each trial's `trial.json` and the text files of `relif report`, for the demo (its
command line with a shorter budget) and a small grid (three labels, validation every second
epoch, test metrics per epoch), both run through the real command line on the session's
local Ray. A change to how a trial reports its results must leave these as they are
(`result_form.json`; regenerate it only for a change that means to alter them, with
RELIF_WRITE_RESULT_FORM=1).

What differs from run to run is masked, by kind: wall-clock times, seconds, process and host
names, Tune's random trial ids (each replaced by its trial's label) and the test's folders.
So is every float (`<float>`; in the report's text every decimal number, `<x>`): float kernels
differ across CPUs, and the trained numbers are guarded, within the measured cross-kernel
drift, by `tests/pinned.py`. So are the sizes of the parquet files (their compression follows
their floats). Every key, its order, every integer, string and flag, and every NaN and None
(what an unvalidated epoch reports) is pinned as written. Of the report's files, whose words
follow the numbers (which mean is in bold, a verdict, a rank, the seeds a planning estimate
names), their form is pinned (`report_form`): the headings, every table's header, each CSV's
header, the lines' count; their wording is held by `tests/test_verdict_wording.py`.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest

from relif_ray.cli import main as relif
from relif_ray.cli.sweep import main as sweep

EXPECTED = Path(__file__).with_name("result_form.json")
RELEASED_TRIAL_JSON = Path(__file__).with_name("trial_record_release.json")
"""The demo's first ERM trial.json as written when the pins were first made, kept as it was (a
regeneration leaves it): what `tests/test_record.py` reads back byte for byte."""

VOLATILE_KEYS = {"timestamp", "date", "pid", "hostname", "node_ip", "started_at", "finished_at"}
"""Keys whose values differ from run to run: wall clock, process and host."""
SECONDS_KEY = re.compile(r"^time_\w+_s$|^time_since_restore$")
"""Keys that hold seconds measured while the trial ran (Tune's and the trial's own)."""
DECIMAL = re.compile(r"-?\d*\.\d+([eE][-+]?\d+)?|-?\d+[eE][-+]?\d+")
"""A decimal number, written as text: a progress.csv cell, or inside a report's text."""


def sweeps(small_data: Path) -> dict[str, list[str]]:
    """The command lines pinned: the demo (its methods, seeds, data, model and settings, 16
    steps instead of 240) and a small grid on the session's small data set (a test split)."""
    return {
        "demo": ["--demo", "--steps", "16"],
        "grid": [
            *("--data-dir", str(small_data), "--methods", "erm,relif,relif-static"),
            *("--seeds", "1", "--epochs", "3", "--batch-size", "6", "--backbone", "resnet18"),
            *("--set", "train.eval_every=2", "--set", "train.epoch_test_metrics=true"),
            *("--checkpoint-interval", "0"),  # a checkpoint after every epoch, as numbered
        ],
    }


def masked(value: Any, key: str = "") -> Any:
    """`value` with what differs from run to run replaced by its kind."""
    if key in VOLATILE_KEYS:
        return "<volatile>"
    if key.endswith(".parquet") and isinstance(value, int):
        return "<bytes>"
    if SECONDS_KEY.match(key):
        number = float(value) if value not in ("", None) else math.nan
        return "<nan>" if math.isnan(number) else "<seconds>"
    if isinstance(value, dict):
        return {name: masked(item, name) for name, item in value.items()}
    if isinstance(value, list):
        return [masked(item) for item in value]
    if isinstance(value, float):
        return "<nan>" if math.isnan(value) else "<float>"
    if isinstance(value, str) and value.lower() == "nan":  # progress.csv's cells
        return "<nan>"
    if isinstance(value, str) and DECIMAL.fullmatch(value):
        return "<float>"
    return value


def masked_text(text: str) -> str:
    """A report file's text with every decimal number masked (`masked`'s floats)."""
    return DECIMAL.sub("<x>", text)


def report_form(text: str, suffix: str) -> dict[str, Any]:
    """What of a report file does not follow its numbers: a CSV's header, a text's headings
    and its tables' headers (the row above a `|---` row), and the count of its lines."""
    lines = masked_text(text).splitlines()
    if suffix == ".csv":
        return {"header": lines[0] if lines else "", "lines": len(lines)}
    kept = [line for line in lines if line.startswith(("#", "\\begin", "\\end"))]
    kept += [above for above, line in itertools.pairwise(lines) if line.startswith("|---")]
    return {"kept": kept, "lines": len(lines)}


class Renamer:
    """Replaces the test's folders and Tune's trial ids (by their trials' labels) in text."""

    def __init__(self, folders: dict[Path, str], trial_ids: dict[str, str]) -> None:
        pairs = [(str(folder), name) for folder, name in folders.items()]
        pairs += [(trial_id, f"<{label}>") for trial_id, label in trial_ids.items()]
        self.pairs = sorted(pairs, key=lambda pair: -len(pair[0]))  # a folder before its prefix

    def text(self, text: str) -> str:
        for old, new in self.pairs:
            text = text.replace(old, new)
        return text

    def value(self, value: Any) -> Any:
        return json.loads(self.text(json.dumps(value)))


def trial_folders(experiment: Path) -> dict[str, tuple[str, Path]]:
    """The trial folder's name less Tune's id (label, setting, seed) -> (Tune's id, folder)."""
    folders = {}
    trials = sorted(path for path in experiment.iterdir() if (path / "result.json").exists())
    for folder in trials:
        record = sorted(folder.glob("checkpoint_*/outputs/trial.json"))[-1]
        trial_id = json.loads(record.read_text())["trial_id"]
        folders[folder.name.removesuffix(f"_{trial_id}")] = (trial_id, folder)
    return folders


def result_form(experiment: Path, report: Path, data: Path) -> dict[str, Any]:
    """The pinned form of one swept experiment and its report."""
    folders = trial_folders(experiment)
    trial_ids = {trial_id: name for name, (trial_id, _) in folders.items()}
    places = {experiment.parent: "<storage>", report: "<report>", data: "<data>"}
    rename = Renamer(places, trial_ids)
    form: dict[str, Any] = {"results": {}, "progress": {}, "trials": {}, "report": {}}
    for name, (_, folder) in folders.items():
        lines = (folder / "result.json").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        form["results"][name] = [
            [[key, masked(value, key)] for key, value in rename.value(record).items()]
            for record in records
        ]
        rows = list(csv.reader(io.StringIO((folder / "progress.csv").read_text())))
        header = rows[0]
        form["progress"][name] = [header] + [
            [masked(value, key) for key, value in zip(header, rename.value(row), strict=True)]
            for row in rows[1:]
        ]
        (record_path,) = sorted(folder.glob("checkpoint_*/outputs/trial.json"))[-1:]
        text = record_path.read_text()
        assert text == json.dumps(json.loads(text), indent=2, sort_keys=True)  # its text form
        record = rename.value(json.loads(text))
        form["trials"][name] = masked({**record, "trial_id": "<id>"})
    for path in sorted(report.rglob("*")):
        if path.suffix in (".md", ".csv", ".json", ".tex", ".txt"):
            form["report"][str(path.relative_to(report))] = report_form(
                rename.text(path.read_text()), path.suffix
            )
    return form


@pytest.mark.slow
@pytest.mark.parametrize("name", ["demo", "grid"])
def test_a_sweep_leaves_the_pinned_results_records_and_report(
    name: str, ray_session, small_data: Path, sweep_folder: Path
) -> None:
    storage = sweep_folder / name
    argv = [*sweeps(small_data)[name], "--storage", str(storage), "--name", name]
    assert sweep(datasets=("nyuv2",), argv=argv) == 0
    experiment, report = storage / name, sweep_folder / f"{name}-report"
    flags = ["--out", str(report), "--no-figures", "--n-boot", "0"]
    assert relif(["report", str(experiment), *flags]) == 0
    form = result_form(experiment, report, small_data)
    expected = json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}
    if os.environ.get("RELIF_WRITE_RESULT_FORM"):
        expected[name] = form
        if name == "demo" and not RELEASED_TRIAL_JSON.exists():
            first = sorted(experiment.glob("erm_seed0_*/checkpoint_*/outputs/trial.json"))[-1]
            RELEASED_TRIAL_JSON.write_text(first.read_text())
        EXPECTED.write_text(json.dumps(expected, sort_keys=True, indent=1) + "\n")
    assert set(form["trials"]) == set(expected[name]["trials"])
    for part in ("results", "progress", "trials", "report"):
        for key, pinned in expected[name][part].items():
            assert form[part][key] == pinned, (part, key)
