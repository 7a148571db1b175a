"""The Python API of sweeps (`relif_ray.sweep_api`): a `SweepSpec` is the command line's flags,
so it makes the sweep the command of the same flags makes; a mistake is the command's one-line
`UserError`; and the example notebook (docs/examples/sweep_from_python.ipynb) launches a table
demo, resumes it and reads its trials, which are those of the same command."""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from relif_ray import analysis
from relif_ray.cli.parsing import parse_floats
from relif_ray.cli.sweep import DATASETS, build_parser, main, sweep_request
from relif_ray.cli.tabular import DATASETS as TABLE
from relif_ray.cli.tabular import SOURCE
from relif_ray.errors import UserError
from relif_ray.sweep.overrides import parse_set
from relif_ray.sweep_api import NEGATABLE, REPEATED, SweepSpec, run_sweep
from tests.conftest import ONE_TRIAL_AT_A_TIME

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "docs" / "examples" / "sweep_from_python.ipynb"


def sweep_parsers() -> list[argparse.ArgumentParser]:
    """Every parser a sweep reads its flags with: the grid's and the controller checks' (both
    offering --dataset), and the table sweep's."""
    defaults = DATASETS["nyuv2"]
    parsers = [
        build_parser(defaults, tuple(DATASETS), checks=checks, offer_checks=True)
        for checks in (False, True)
    ]
    table = build_parser(DATASETS["tabular"], TABLE, offer_checks=True)
    SOURCE.add(table)
    return [*parsers, table]


def test_the_spec_has_a_field_for_every_flag_of_a_sweep():
    actions = [
        action for parser in sweep_parsers() for action in parser._actions if action.dest != "help"
    ]
    assert {field.name for field in fields(SweepSpec)} == {action.dest for action in actions}
    assert {a.dest for a in actions if isinstance(a, argparse.BooleanOptionalAction)} == NEGATABLE
    assert {a.dest for a in actions if isinstance(a, argparse._AppendAction)} == REPEATED


def test_a_spec_parses_as_the_command_of_the_same_flags():
    spec = SweepSpec(
        dataset="eicu",
        demo=True,
        seeds=[3],
        methods=["erm", "relif"],
        r_star=[0.16, 0.2],
        eta=[1e-05],
        set={"train.precision": "bf16", "train.grad_clip": 1.0, "model.pretrained": "none"},
        channels_last=False,
        compile=True,
        max_failures=0,
        storage="somewhere",
    )
    command = [
        "--dataset", "eicu", "--demo", "--seeds", "3,", "--methods", "erm,relif",
        "--r-star", "0.16,0.2", "--eta", "1e-5", "--set", "train.precision=bf16",
        "--set", "train.grad_clip=1.0", "--set", "model.pretrained=none",
        "--no-channels-last", "--compile", "--max-failures", "0", "--storage", "somewhere",
    ]  # fmt: skip
    parser = build_parser(DATASETS["eicu"], tuple(DATASETS), offer_checks=True)
    from_spec, typed = parser.parse_args(spec.arguments()), parser.parse_args(command)
    differing = {key for key, value in vars(from_spec).items() if vars(typed)[key] != value}
    assert differing == {"eta", "set"}  # the same values, spelled 1e-05 and as JSON
    assert parse_floats(from_spec.eta, "--eta") == parse_floats(typed.eta, "--eta")
    assert parse_set(from_spec.set) == parse_set(typed.set)
    assert from_spec.seeds == "3," and from_spec.channels_last is False
    requests = [
        sweep_request(words, None, tuple(DATASETS), None) for words in (spec.arguments(), command)
    ]
    assert requests[0] == requests[1] and len(requests[0].space.trials) == 3  # erm, 2 relif


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (SweepSpec(demo=True, seeds=0), "--seeds: a count must be positive, got '0'"),
        (SweepSpec(demo=True, set={"train.nope": 1}), "--set train.nope: unknown config field"),
        (SweepSpec(dataset="tabular"), "--data FILE with --task, --spec FILE.yaml or --preset"),
        (SweepSpec(dataset="nyuv2"), "--data-dir is required (or use --demo for synthetic data)"),
    ],
)
def test_a_mistake_is_the_commands_one_line_error_before_anything_runs(
    spec, message, tmp_path, no_sweep
):
    storage = tmp_path / "results"
    with pytest.raises(UserError) as raised:
        run_sweep(replace(spec, storage=str(storage)))
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)
    assert not storage.exists()  # nothing written


@pytest.mark.slow
def test_the_api_keeps_ray_out_until_a_sweep_runs():
    """Importing the API (and building a spec's flags) imports no Ray: the Tune layer is
    imported when a sweep runs."""
    code = (
        "import sys\n"
        "from relif_ray.sweep_api import SweepSpec\n"
        "SweepSpec(demo=True, methods=['erm']).arguments()\n"
        "assert 'ray' not in sys.modules, 'ray imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=300)


def notebook_cells() -> list[str]:
    return [cell.source for cell in nbformat.read(NOTEBOOK, 4).cells if cell.cell_type == "code"]


def trial_names(trials: pd.DataFrame) -> list[str]:
    """Each trial's name: its folder's in the experiment, without the trial id."""
    folders = [Path(row.path).relative_to(row.experiment).parts[0] for row in trials.itertuples()]
    return sorted(folder.rsplit("_", 1)[0] for folder in folders)


@pytest.mark.slow
def test_the_notebook_launches_resumes_and_reads_the_sweep_the_command_makes(
    ray_session, sweep_folder, monkeypatch
):
    """The notebook's code cells, run in this process (on the session's Ray) as a kernel runs
    them, against `sweeps/tabular.py` with the same flags: the same trials on disk (names and
    configs), the frame of each is the experiment's, and the resume trains nothing."""
    monkeypatch.setenv("RELIF_STORAGE", str(sweep_folder))
    first, resume = notebook_cells()
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(first, str(NOTEBOOK), "exec"), namespace)
    result = namespace["result"]
    experiment = sweep_folder / "tabular-from-python"
    assert result.experiment_dir == str(experiment)
    assert f"experiment: {experiment}" in out.getvalue()
    assert "plan: 2 trials (2 settings x 1 seeds); labels erm, relif" in out.getvalue()

    command = [
        "--demo", "--methods", "erm,relif", "--seeds", "1", "--epochs", "1",
        "--storage", str(sweep_folder), "--name", "tabular-cli", *ONE_TRIAL_AT_A_TIME,
    ]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()) as cli_out:
        status = main(command, datasets=TABLE, controller_checks=None, source=SOURCE)
    assert status == 0, cli_out.getvalue()[-3000:]
    by_command = analysis.load(str(sweep_folder / "tabular-cli")).trials
    trials = result.trials
    assert (
        trial_names(trials) == trial_names(by_command) == ["erm_seed0", "relif_r0.16_eta3.3_seed0"]
    )
    assert list(trials.sort_values("label")["config"]) == list(
        by_command.sort_values("label")["config"]
    )
    on_disk = analysis.load(str(experiment)).trials
    pd.testing.assert_frame_equal(trials, on_disk)
    assert list(trials["status"]) == ["completed", "completed"]
    assert (trials["steps"] > 0).all() and trials["val_worst"].between(0, 1).all()

    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(resume, str(NOTEBOOK), "exec"), namespace)
    resumed = namespace["resumed"]
    assert resumed.experiment_dir == result.experiment_dir
    pd.testing.assert_frame_equal(resumed.trials, trials)  # kept, not trained again
