"""Every bad input is one line: plug-ins that cannot be used, damaged experiment files,
non-finite numbers, unsupported storage and empty values, each refused at the one place that
owns its kind of mistake (the plug-in loader, the experiment file reader, the config's type
check and the flags' types, the storage module, the flag parser), so a case listed here
stands for every other one of its kind.

Each command runs in this process (the sweep's `main` with the `no_sweep` fixture, so a
refused sweep never reaches Ray, and `relif`'s console `main`) and is checked for: exit
status 2, one line on stderr that names the flag, field or file and what is wrong, no
traceback, nothing written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from relif_ray.cli.console import main as relif
from relif_ray.cli.sweep import NYUV2, build_parser, main
from relif_ray.config import ExperimentConfig
from relif_ray.errors import UserError
from relif_ray.experiment.layout import PARETO_FILE, SELECTION_FILE, SQUASH_CONSTANTS_FILE
from relif_ray.methods import build_method, methods
from relif_ray.methods.registry import missing_requirements
from relif_ray.plugins import METHODS_PATH, PROBLEMS_PATH
from relif_ray.reference import write_squash_constants
from relif_ray.testing.synthetic_experiment import write_synthetic_experiment
from tests.conftest import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[1]
TASKS = ["seg", "depth", "normal"]


def one_line(status: int, capsys: pytest.CaptureFixture, *fragments: str) -> str:
    """The command's one error line, checked: exit 2, no traceback, every fragment in it."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert all(fragment in lines[0] for fragment in fragments), (fragments, lines[0])
    return lines[0]


def sweep(argv: list[str], **options) -> int:
    return main(argv, **{"datasets": ("nyuv2",), **options})


@pytest.fixture
def flags(nyuv2_dir: Path, tmp_path: Path) -> list[str]:
    """A sweep that passes every check (with `no_sweep`, reaching the driver would fail the
    test), on storage that must stay unwritten."""
    return [
        *("--data-dir", str(nyuv2_dir), "--methods", "erm", "--seeds", "1", "--epochs", "1"),
        *("--backbone", "resnet18", "--storage", str(tmp_path / "results")),
    ]


# Plug-ins: relif_ray.plugins.import_plugins, for methods and benchmarks alike ---------------

BROKEN_PLUGINS = {
    "syntax": ("def broken(:\n", "does not import: SyntaxError: invalid syntax"),
    "raises": ("raise RuntimeError('no GPU here')\n", "does not import: RuntimeError: no GPU"),
    "missing module": (
        "import nosuch_solver_xyz\n",
        "does not import: ModuleNotFoundError: No module named 'nosuch_solver_xyz'",
    ),
}
SLASHED_METHOD = """
from relif_ray.methods import MTLMethod, register

@register
class Slashed(MTLMethod):
    name = "my/method"
"""


def plugin_folder(tmp_path: Path, module: str, source: str) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir(exist_ok=True)
    (folder / f"{module}.py").write_text(source)
    return folder


@pytest.mark.parametrize("variable", [METHODS_PATH, PROBLEMS_PATH])
@pytest.mark.parametrize("case", list(BROKEN_PLUGINS))
def test_a_plugin_that_does_not_import_is_one_line_for_every_command(
    variable, case, tmp_path, flags, monkeypatch, capsys, no_sweep, isolated_registry
):
    """The command that lists the registry (`relif methods`, `relif make-data`) and a sweep
    that does not name the plug-in all stop at it."""
    source, reason = BROKEN_PLUGINS[case]
    module = f"broken_{case.replace(' ', '_')}_{variable[6:13].lower()}"
    folder = plugin_folder(tmp_path, module, source)
    monkeypatch.setenv(variable, str(folder))
    expected = (f"{variable}: {folder / module}.py", reason)
    listing = ["methods"] if variable == METHODS_PATH else ["make-data", "--help"]
    one_line(relif(listing), capsys, *expected)
    one_line(sweep(flags), capsys, *expected)
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("variable", [METHODS_PATH, PROBLEMS_PATH])
def test_a_plugin_directory_that_does_not_exist_is_refused(
    variable, tmp_path, flags, monkeypatch, capsys, no_sweep, isolated_registry
):
    monkeypatch.setenv(variable, str(tmp_path / "nowhere"))
    one_line(sweep(flags), capsys, f"{variable}: {tmp_path / 'nowhere'} is not a directory")


def test_a_plugin_name_that_cannot_be_a_label_or_folder_is_refused(
    tmp_path, flags, monkeypatch, capsys, no_sweep, isolated_registry
):
    folder = plugin_folder(tmp_path, "slashed", SLASHED_METHOD)
    monkeypatch.setenv(METHODS_PATH, str(folder))
    one_line(sweep(flags), capsys, f"{folder / 'slashed.py'}: method name 'my/method' must be")


def test_a_plugin_method_that_cannot_be_built_is_one_line_before_ray(
    tmp_path, flags, monkeypatch, capsys, no_sweep, isolated_registry
):
    source = SLASHED_METHOD.replace("my/method", "fragile") + (
        "\n    def __init__(self, task_names, seed=0, gradient_source='parameters'):\n"
        "        raise RuntimeError('needs two GPUs')\n"
    )
    folder = plugin_folder(tmp_path, "fragile", source)
    monkeypatch.setenv(METHODS_PATH, str(folder))
    status = sweep([*flags[:3], "fragile", *flags[4:]])
    one_line(status, capsys, f"method.name: fragile (plug-in {folder / 'fragile.py'}) cannot be")
    assert not (tmp_path / "results").exists()


def test_a_plugin_benchmark_named_like_a_built_in_module_is_refused(
    tmp_path, monkeypatch, capsys, isolated_registry
):
    folder = plugin_folder(tmp_path, "nyuv2", "BENCHMARK = None\n")
    monkeypatch.setenv(PROBLEMS_PATH, str(folder))
    status = relif(["make-data", "--help"])
    one_line(status, capsys, f"{PROBLEMS_PATH}: {folder / 'nyuv2.py'} has the name")


@pytest.mark.slow
def test_a_broken_plugin_is_one_line_from_a_sweep_script(tmp_path):
    """The scripts import the sweep (and with it the registries and their plug-ins) inside
    the one-line error handling."""
    folder = plugin_folder(tmp_path, "broken", "def broken(:\n")
    result = subprocess.run(
        [sys.executable, "sweeps/run.py", "--dataset", "nyuv2", "--demo"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PATH": "", PROBLEMS_PATH: str(folder), "RAY_USAGE_STATS_ENABLED": "0"},
        timeout=HANG_GUARD_S,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip() == (
        f"run.py: error: {PROBLEMS_PATH}: {folder / 'broken.py'} does not import: "
        "SyntaxError: invalid syntax (broken.py, line 1)"
    )


def test_a_plugins_missing_requirement_is_not_answered_with_our_extra(
    tmp_path, monkeypatch, isolated_registry
):
    source = SLASHED_METHOD.replace("my/method", "needy") + '    requires = ("nosuch_xyz",)\n'
    folder = plugin_folder(tmp_path, "needy", source)
    monkeypatch.setenv(METHODS_PATH, str(folder))
    with pytest.raises(UserError) as error:
        build_method("needy", TASKS, 0)
    assert str(error.value) == (
        "method.name: needy needs nosuch_xyz, which are not installed: install them for the "
        f"plug-in {folder / 'needy.py'}"
    )


# Non-finite numbers: the config's type check, the flags' float type, the options' check -----


def float_fields() -> list[str]:
    """Every config field of type float (or float | None), dotted."""
    found = []
    for section, section_type in typing.get_type_hints(ExperimentConfig).items():
        if not dataclasses.is_dataclass(section_type):
            continue
        for name, hint in typing.get_type_hints(section_type).items():
            if hint is float or float in typing.get_args(hint):
                found.append(f"{section}.{name}")
    return found


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_no_float_config_field_takes_nan_or_infinity(value):
    fields = float_fields()
    assert {"train.lr", "train.weight_decay", "relif.r_star", "model.dropout"} <= set(fields)
    for field in fields:
        section, name = field.split(".")
        with pytest.raises(UserError) as error:
            ExperimentConfig.from_dict({section: {name: value}})
        assert str(error.value) == f"config field {field}: must be a finite number, got {value}"


@pytest.mark.parametrize(
    "setting", ["train.lr=.inf", "train.weight_decay=.nan", "relif.beta=-.inf"]
)
def test_a_non_finite_set_value_is_refused_before_ray(setting, flags, capsys, no_sweep):
    field, _, value = setting.partition("=")
    number = value.replace(".", "")
    status = sweep([*flags, "--set", setting])
    one_line(status, capsys, f"--set: config field {field}: must be a finite number, got {number}")


def float_flags(parser: argparse.ArgumentParser) -> list[str]:
    return [a.option_strings[0] for a in parser._actions if a.type is float and a.option_strings]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_no_float_flag_takes_nan_or_infinity(value, flags, capsys, no_sweep):
    grid = float_flags(build_parser(NYUV2))
    checks = float_flags(build_parser(NYUV2, checks=True))
    assert {"--lr", "--num-gpus", "--delta", "--cpus-per-trial"} <= set(grid)
    for flag in grid:
        one_line(sweep([*flags, f"{flag}={value}"]), capsys, f"argument {flag}: value must be")
    for flag in set(checks) - set(grid):
        status = sweep([*flags[2:], f"{flag}={value}"], controller_checks=True)
        one_line(status, capsys, f"argument {flag}: value must be finite")
    one_line(relif(["audit", "s.csv", f"--delta={value}"]), capsys, "argument --delta")
    one_line(relif(["report", "exp", "--out", "r", f"--ci-level={value}"]), capsys, "--ci-level")


def test_no_float_method_option_takes_nan_or_infinity():
    checked = 0
    for name, cls in methods().items():
        if missing_requirements(cls):
            continue
        for option, default in cls.option_defaults().items():
            if isinstance(default, float):
                for value in (math.nan, math.inf):
                    with pytest.raises(UserError, match=f"method.options.{option}: must be"):
                        build_method(name, TASKS, 0, **{option: value})
                checked += 1
    assert checked >= 10


def test_a_method_option_of_the_wrong_kind_names_the_option():
    with pytest.raises(UserError) as error:
        build_method("dwa", TASKS, 0, temperature="hot")
    assert str(error.value) == "method.options.temperature: expected a number, got 'hot'"
    with pytest.raises(UserError, match="method.options.max_iters: expected a whole number"):
        build_method("mgda", TASKS, 0, max_iters=2.5)


# Empty values and lists: the flag parser's types, comma_list --------------------------------


def value_flags(parser: argparse.ArgumentParser) -> list[str]:
    """Every flag that takes a value."""
    return [a.option_strings[0] for a in parser._actions if a.option_strings and a.nargs != 0]


@pytest.mark.parametrize("checks", [False, True], ids=["grid", "controller checks"])
def test_an_empty_value_is_an_error_for_every_flag_never_the_default(
    checks, flags, tmp_path, capsys, no_sweep
):
    parser_flags = value_flags(build_parser(NYUV2, ("nyuv2", "eicu"), checks=checks))
    assert {"--seeds", "--storage", "--name", "--set"} <= set(parser_flags)
    for flag in parser_flags:
        status = main([*flags[2:], flag, ""], controller_checks=checks)
        one_line(status, capsys, f"argument {flag}: ")
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    "flag", ["--seeds", "--methods", "--r-star", "--eta", "--callbacks", "--eta-range"]
)
def test_a_list_without_items_is_an_error(flag, flags, capsys, no_sweep):
    extra = ["--search", "optuna", "--methods", "relif"] if flag == "--eta-range" else []
    one_line(sweep([*flags, *extra, flag, " , "]), capsys, f"{flag}: expected ")


def test_relif_commands_refuse_empty_values(capsys):
    one_line(relif(["report", "", "--out", "r"]), capsys, "argument experiments: expected a value")
    one_line(relif(["export", "exp", ""]), capsys, "argument DEST: expected a value, got ''")
    one_line(relif(["make-data", "nyuv2", "--out", ""]), capsys, "argument --out: expected")


# Storage: relif_ray.experiment.storage -------------------------------------------------------


@pytest.mark.parametrize(
    ("storage", "fragment"),
    [
        ("ftp://host/results", "--storage ftp://host/results: unsupported storage 'ftp://'"),
        ("hdfs://node/results", "unsupported storage 'hdfs://' (use a local path, file://,"),
        ("s3:///results", "--storage s3:///results: no bucket named"),
    ],
)
def test_unsupported_storage_is_refused_before_ray(storage, fragment, flags, capsys, no_sweep):
    one_line(sweep([*flags, "--storage", storage]), capsys, fragment)
    one_line(sweep([*flags, "--storage", storage, "--resume"]), capsys, fragment)


def test_export_checks_its_destination_like_the_storage(tmp_path, capsys):
    experiment = write_synthetic_experiment(tmp_path / "exp", seeds=1, n_examples=8)
    (tmp_path / "file").write_text("")
    status = relif(["export", str(experiment), str(tmp_path / "file" / "copy")])
    one_line(status, capsys, f"DEST {tmp_path / 'file' / 'copy'}: {tmp_path / 'file'} is not a")
    one_line(relif(["export", str(experiment), "s3://bucket/x"]), capsys, "DEST s3://bucket/x:")
    one_line(relif(["export", "ftp://h/exp", str(tmp_path / "c")]), capsys, "EXP ftp://h/exp:")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["exp", "file"]


def test_resume_of_an_experiment_that_does_not_exist_is_refused_before_ray(
    flags, tmp_path, capsys, no_sweep
):
    status = sweep([*flags, "--resume", "--name", "nosuch"])
    one_line(status, capsys, f"--resume: no sweep to resume at {tmp_path / 'results' / 'nosuch'}")
    assert not (tmp_path / "results").exists()


# Damaged experiment files: relif_ray.experiment.storage.reading -----------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """An experiment (ERM and ReLiF, four seeds) with its own experiment-level files."""
    root = write_synthetic_experiment(
        tmp_path_factory.mktemp("pristine") / "exp", seeds=4, n_examples=16, trace_steps=4
    )
    write_squash_constants(root, {"0": {"depth": [1.0, 2.0], "normal": [0.5, 1.5]}})
    (root / PARETO_FILE).write_text("study,label\n")
    (root / SELECTION_FILE).write_text("label,seed\nrelif,0\n")
    return root


@pytest.fixture
def experiment(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "exp"))


def cut(path: Path) -> Path:
    """Cut the file off in the middle, as a killed copy leaves it (a CSV file at its start: cut
    between its lines, it would be a shorter whole file)."""
    data = path.read_bytes()
    path.write_bytes(b"" if path.suffix == ".csv" else data[: len(data) // 2])
    return path


def garble(path: Path) -> Path:
    """Overwrite the end of a parquet file (its footer's magic bytes), keeping its size: a file
    that the size its trial.json lists does not tell from a whole one."""
    data = path.read_bytes()
    path.write_bytes(data[:-4] + b"\0" * 4)
    return path


OUTPUT_FILES = [
    "checkpoint_000000/outputs/trial.json",
    "checkpoint_000000/outputs/scores.parquet",
    "checkpoint_000000/outputs/trace.parquet",
    "checkpoint_000000/outputs/representations.parquet",
]
RELIF_TRIALS = [f"ReLiFTrainable_{index:05d}" for index in range(4, 8)]  # relif, seeds 0-3
RELIF_TRIAL = RELIF_TRIALS[0]
REPORT = ["--no-figures", "--n-boot", "0", "--pool-size", "16", "--pairs", "64"]


def test_the_report_skips_each_trial_whose_record_or_scores_are_damaged(
    experiment, tmp_path, capsys
):
    """The files read when an experiment is loaded, and any output file cut off (not the size
    that trial.json lists): one warning per trial left out, each listed as damaged, and the
    report of the others."""
    damaged = [cut(experiment / RELIF_TRIALS[0] / OUTPUT_FILES[0])]
    damaged.append(cut(experiment / RELIF_TRIALS[1] / OUTPUT_FILES[1]))
    damaged.append(cut(experiment / RELIF_TRIALS[2] / OUTPUT_FILES[2]))
    out = tmp_path / "report"
    assert relif(["report", str(experiment), "--out", str(out), *REPORT]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == len(damaged), err
    report = (out / "report.md").read_text()
    for line, trial, path in zip(err, RELIF_TRIALS[:3], damaged, strict=True):
        assert line.startswith(f"relif: warning: skipped trial {trial}: {path}: damaged file (")
        assert f"- damaged: `{experiment / trial}` {path}: damaged file (" in report
    assert "| ReLiF |" in report  # from the ReLiF trial left


@pytest.mark.parametrize(
    "trial, name", [(RELIF_TRIAL, OUTPUT_FILES[2]), ("ReLiFTrainable_00000", OUTPUT_FILES[3])]
)
def test_a_damaged_trace_or_representation_stops_the_report_that_reads_it(
    trial, name, experiment, tmp_path, capsys
):
    """The controller table reads the ReLiF trials' traces, the calibration of delta_ref the
    ERM trials' representations, when the report needs them."""
    damaged = garble(experiment / trial / name)
    status = relif(["report", str(experiment), "--out", str(tmp_path / "report"), *REPORT])
    one_line(status, capsys, f"relif: error: {damaged}: damaged file (")
    assert not (tmp_path / "report").exists()


def test_damaged_per_epoch_records_and_traces_are_skipped_with_a_warning(experiment):
    from relif_ray import analysis
    from relif_ray.analysis.experiment import SkippedFile

    records = cut(experiment / RELIF_TRIAL / "result.json")
    trace = garble(experiment / RELIF_TRIALS[1] / OUTPUT_FILES[2])
    loaded = analysis.load(experiment)
    with pytest.warns(SkippedFile, match=f"records of .*{RELIF_TRIAL}: {records}: damaged file"):
        epochs = loaded.epochs
    with pytest.warns(SkippedFile, match=f"trace of trial exp_00005: {trace}: damaged file"):
        traces = loaded.traces
    assert sorted(set(epochs["trial"])) == sorted(set(loaded.trials["trial"]) - {"exp_00004"})
    assert sorted(set(traces["trial"])) == sorted(set(loaded.trials["trial"]) - {"exp_00005"})


def test_epochs_missing_from_the_per_epoch_records_are_one_warning_line(
    experiment, tmp_path, capsys
):
    """Ray Tune restarts a trial with the copy of its result.json last put into storage, which
    can lack the records written since: a restarted trial whose records of epochs 1 and 2 were
    lost keeps its epochs 3 and 4, and the report says which epochs are missing."""
    from relif_ray import analysis
    from relif_ray.analysis.experiment import SkippedFile

    records = experiment / RELIF_TRIAL / "result.json"
    records.write_text("\n".join(records.read_text().splitlines()[2:]) + "\n")
    loaded = analysis.load(experiment)
    with pytest.warns(
        SkippedFile, match=f"epoch.s. 1, 2 of the per-epoch records of .*{RELIF_TRIAL}"
    ):
        epochs = loaded.epochs
    assert list(epochs.loc[epochs["trial"] == "exp_00004", "epoch"]) == [3, 4]  # RELIF_TRIAL
    assert set(epochs.groupby("trial").size()) == {2, 4}
    flags = ["--delta-m-epochs", "best"]
    status = relif(["report", str(experiment), "--out", str(tmp_path / "report"), *REPORT, *flags])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert status == 0 and line == (
        f"relif: warning: skipped epoch(s) 1, 2 of the per-epoch records of "
        f"{experiment / RELIF_TRIAL}: {records}: damaged file (no record of epoch(s) 1, 2: Ray "
        "Tune restarts a trial with its stored copy)"
    )


@pytest.mark.parametrize(
    "name",
    [
        *(f"{RELIF_TRIAL}/{name}" for name in OUTPUT_FILES),
        f"{RELIF_TRIAL}/result.json",
        f"{RELIF_TRIAL}/params.json",
        SQUASH_CONSTANTS_FILE,
        SELECTION_FILE,
    ],
    ids=lambda name: name.rpartition("/")[2],
)
def test_export_refuses_a_damaged_file_and_writes_nothing(name, experiment, tmp_path, capsys):
    damaged = cut(experiment / name)
    status = relif(["export", str(experiment), str(tmp_path / "copy")])
    one_line(status, capsys, f"relif: error: {damaged}: damaged file (", "nothing was exported")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["exp"]


@pytest.mark.parametrize("name", [SQUASH_CONSTANTS_FILE, SELECTION_FILE])
def test_a_damaged_experiment_file_stops_the_report(name, experiment, tmp_path, capsys):
    damaged = experiment / name
    damaged.write_text('{"seeds": {"0": {"depth": [2.0, 1.0]}}}' if name.endswith("n") else "")
    status = relif(["report", str(experiment), "--out", str(tmp_path / "report"), *REPORT])
    one_line(status, capsys, f"relif: error: {damaged}: damaged file (")
    assert not (tmp_path / "report").exists()


def test_a_damaged_reference_and_pareto_file_stop_the_sweep_before_ray(
    experiment, flags, tmp_path, capsys, no_sweep
):
    cut(experiment / SQUASH_CONSTANTS_FILE)
    status = sweep([*flags, "--reference", str(experiment)])
    line = one_line(status, capsys, f"--reference {experiment}: {experiment}/squash_constants")
    assert "damaged file (" in line
    (experiment / PARETO_FILE).write_text("")
    status = sweep([*flags, "--methods", "relif", "--select-from", str(experiment)])
    one_line(status, capsys, f"--select-from: {experiment / PARETO_FILE}: damaged file (No col")
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("damage", ["squash constants", "trial list"], ids=lambda case: case)
def test_a_damaged_file_of_a_resumed_experiment_stops_the_resume_before_ray(
    damage, experiment, flags, capsys, no_sweep
):
    """Tune's trial list (a whole JSON file that is not one; a cut-off one is put back once Ray
    is up, `relif_ray.tuning.resume`) and the squash constants are read before Ray starts."""
    state = experiment / "experiment_state-2026-01-01_00-00-00.json"
    state.write_text(json.dumps({"trial_data": []}))
    if damage == "squash constants":
        damaged = cut(experiment / SQUASH_CONSTANTS_FILE)
        fragment = f"{damaged}: damaged file ("
    else:
        state.write_text(json.dumps({"trials": []}))
        fragment = f"{state}: damaged file (no entry 'trial_data')"
    status = sweep([*flags[:-1], str(experiment.parent), "--resume", "--name", "exp"])
    one_line(status, capsys, fragment)


def test_an_empty_config_file_is_an_error_not_the_defaults(tmp_path, flags, capsys, no_sweep):
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    status = sweep([*flags, "--config", str(tmp_path / "empty.yaml")])
    one_line(status, capsys, f"--config {tmp_path / 'empty.yaml'}: no config fields in it")
