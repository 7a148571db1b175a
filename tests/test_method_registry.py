"""The method registry: descriptions, one-line errors before Ray starts, the engine's hooks,
and plug-in methods on RELIF_METHODS_PATH (docs/examples/my_method.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import Tensor

from relif_ray import cli
from relif_ray.cli.methods import COLUMNS, method_listing
from relif_ray.cli.sweep import NYUV2
from relif_ray.cli.sweep import main as sweep_main
from relif_ray.cli.sweep_flags import build_parser
from relif_ray.config import ExperimentConfig
from relif_ray.engine import TrainingRun
from relif_ray.errors import UserError
from relif_ray.methods import METHODS, MTLMethod, StepContext, build_method, methods, registry
from relif_ray.methods.base import GRADIENT_AGGREGATION, LOSS_WEIGHTING
from relif_ray.plugins import METHODS_PATH
from relif_ray.sweep.overrides import yaml_scalar
from relif_ray.sweep.preflight import check_trial_configs
from tests.conftest import tiny_config

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "examples" / "my_method.py"
TASKS = ["a", "b", "c"]


def one_line_error(call, match: str) -> str:
    with pytest.raises(UserError, match=match) as error:
        call()
    assert "\n" not in str(error.value)
    return str(error.value)


# --- descriptions and errors ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_describes_itself(name: str):
    cls = METHODS[name]
    assert cls.kind in (LOSS_WEIGHTING, GRADIENT_AGGREGATION)
    assert cls.citation
    assert set(cls.gradient_sources) <= {"parameters", "representation"}
    assert "parameters" in cls.gradient_sources
    # the described defaults are the options the method takes
    method = build_method(name, TASKS, 0, **cls.option_defaults())
    assert isinstance(method, MTLMethod)


def test_unknown_method_lists_the_known_ones_in_one_line():
    message = one_line_error(lambda: build_method("cats", TASKS, 0), "unknown method 'cats'")
    assert all(name in message for name in METHODS)


@pytest.mark.parametrize(
    ("name", "options", "listed"),
    [
        ("famo", {"alpha": 1.0}, "w_lr, gamma"),
        ("upgrad", {"c": 0.4}, "pref_vector, norm_eps, reg_eps"),
        ("erm", {"alpha": 1.0}, "none"),
    ],
)
def test_an_option_a_method_does_not_take_names_its_options(name, options, listed):
    message = one_line_error(lambda: build_method(name, TASKS, 0, **options), "method.options")
    assert f"{name} takes no option '{next(iter(options))}' (its options: {listed})" in message


@pytest.mark.parametrize(
    ("name", "options", "field"),
    [
        ("dwa", {"temperature": 0.0}, "method.options.temperature"),
        ("famo", {"gamma": -1.0}, "method.options.gamma"),
        ("dbmtl", {"beta": 1.0}, "method.options.beta"),
        ("cagrad", {"c": -0.1}, "method.options: cagrad: c must be non-negative"),
        ("alignedmtl", {"scale_mode": "max"}, "method.options: alignedmtl: Invalid scale_mode"),
        ("upgrad", {"pref_vector": [1.0, 2.0]}, "method.options.pref_vector: upgrad needs"),
        ("nashmtl", {"optim_niter": 0}, "method.options: nashmtl: optim_niter"),
    ],
)
def test_bad_option_values_are_one_line_errors(name, options, field):
    one_line_error(lambda: build_method(name, TASKS, 0, **options), field)


def pretend_missing(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    real = registry.find_spec
    monkeypatch.setattr(registry, "find_spec", lambda n: None if n == module else real(n))


def test_a_missing_solver_names_the_install_extra(monkeypatch):
    pretend_missing(monkeypatch, "ecos")
    message = one_line_error(lambda: build_method("nashmtl", TASKS, 0), "method.name: nashmtl")
    hint = 'pip install -e ".[mtl]" (in the relif-ray checkout)'  # as the README installs
    assert "needs ecos" in message and message.endswith(hint)
    build_method("upgrad", TASKS, 0)  # the others still build


def test_the_sweep_preflight_finds_a_missing_extra_before_ray_starts(monkeypatch, tmp_path):
    pretend_missing(monkeypatch, "torchjd")
    config = tiny_config(tmp_path)
    config["method"] = {"name": "upgrad"}
    with pytest.raises(UserError, match="method.name: upgrad needs torchjd"):
        check_trial_configs([ExperimentConfig.from_dict(config)])


# --- the engine's hooks ---------------------------------------------------------------------


class Recorder(MTLMethod):
    """ERM that records what the engine's hooks give it."""

    name = "recorder"
    citation = "test double"

    def __init__(self, task_names, seed=0, gradient_source="parameters") -> None:
        super().__init__(task_names, seed=seed, gradient_source=gradient_source)
        self.events: list[tuple[str, dict[str, float]]] = []

    def backward(
        self, task_losses: dict[str, Tensor], ctx: StepContext, extra_loss: Tensor | None = None
    ) -> dict[str, Tensor]:
        self.events.append(("backward", {k: float(v.detach()) for k, v in task_losses.items()}))
        torch.stack(list(task_losses.values())).sum().backward()
        return {k: torch.ones(()) for k in task_losses}

    def after_step(self, batch_losses) -> None:
        self.events.append(("after_step", {k: float(v) for k, v in batch_losses().items()}))

    def end_epoch(self) -> None:
        self.events.append(("end_epoch", {}))


@pytest.fixture(scope="module")
def two_images(tmp_path_factory) -> Path:
    from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2

    root = tmp_path_factory.mktemp("two") / "data"
    return write_synthetic_nyuv2(root, train=2, val=2, height=16, width=16, seed=0)


def recorder_run(root: Path, monkeypatch: pytest.MonkeyPatch, batch_size: int) -> TrainingRun:
    monkeypatch.setitem(METHODS, "recorder", Recorder)
    config = tiny_config(root, batch_size=batch_size, epochs=None, max_steps=3)
    config["method"] = {"name": "recorder"}
    run = TrainingRun(ExperimentConfig.from_dict(config))
    run.train_steps(3)
    return run


def test_the_engine_calls_after_step_every_step_and_end_epoch_after_full_epochs(
    two_images, monkeypatch
):
    run = recorder_run(two_images, monkeypatch, batch_size=1)  # two steps per epoch
    kinds = [kind for kind, _ in run.method.events]
    assert kinds == ["backward", "after_step"] * 2 + ["end_epoch", "backward", "after_step"]


def test_after_step_gives_the_losses_of_the_same_batch_after_the_update(two_images, monkeypatch):
    """With one batch per epoch, the next step sees the same batch at the updated parameters:
    its losses are the ones `after_step` was given."""
    run = recorder_run(two_images, monkeypatch, batch_size=2)
    backward = [losses for kind, losses in run.method.events if kind == "backward"]
    after = [losses for kind, losses in run.method.events if kind == "after_step"]
    for given, next_step in zip(after, backward[1:], strict=False):
        assert given == pytest.approx(next_step, rel=1e-5)
    assert after[0] != pytest.approx(backward[0], rel=1e-3)  # the parameters did move


# --- plug-ins ---------------------------------------------------------------------------------


def plugin_folder(tmp_path: Path, name: str, source: str) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return folder


def test_a_plugin_module_named_like_a_built_in_one_is_refused(
    isolated_registry, monkeypatch, tmp_path
):
    monkeypatch.setenv(METHODS_PATH, str(plugin_folder(tmp_path, "erm", "X = 1\n")))
    one_line_error(methods, "RELIF_METHODS_PATH: .*erm.py has the name of a built-in")


def test_a_plugin_method_named_like_a_registered_one_is_refused(
    isolated_registry, monkeypatch, tmp_path
):
    source = """
        from relif_ray.methods import MTLMethod, register

        @register
        class Again(MTLMethod):
            name = "famo"
    """
    monkeypatch.setenv(METHODS_PATH, str(plugin_folder(tmp_path, "again_famo", source)))
    one_line_error(methods, "a method 'famo' already exists")


@pytest.mark.slow
def test_the_example_plugin_method_is_found_in_a_new_process_and_trains(two_images, tmp_path):
    """docs/examples/my_method.py in a folder named by RELIF_METHODS_PATH: a fresh process
    (as a Ray worker started with the variable) finds `gls` at import, and a ReLiF trial of
    it trains; the weights are d L / d L_k of the geometric mean."""
    assert len(EXAMPLE.read_text().splitlines()) < 40
    folder = tmp_path / "my_methods"
    folder.mkdir()
    shutil.copy(EXAMPLE, folder)
    config = tiny_config(two_images, batch_size=2, epochs=None, max_steps=2, lr=2e-3)
    config["method"] = {"name": "gls"}
    config["relif"] = {**config["relif"], "enabled": True, "warmup_steps": 0}
    script = textwrap.dedent(
        f"""
        import json, torch
        from relif_ray.config import ExperimentConfig
        from relif_ray.engine import TrainingRun
        from relif_ray.methods import METHODS
        torch.set_num_threads(1)
        run = TrainingRun(ExperimentConfig.from_dict(json.loads({json.dumps(config)!r})))
        run.train_steps(2)
        print(json.dumps({{"kind": METHODS["gls"].kind, "trace": run.trace}}))
        """
    )
    env = {**_environment(), METHODS_PATH: str(folder)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["kind"] == LOSS_WEIGHTING
    first, last = result["trace"]
    losses = {task: first[f"loss_{task}"] for task in ("seg", "depth", "normal")}
    geometric_mean = (losses["seg"] * losses["depth"] * losses["normal"]) ** (1 / 3)
    for task, loss in losses.items():
        assert first[f"weight_{task}"] == pytest.approx(geometric_mean / (3 * loss), rel=1e-5)
    assert "lambda" in first
    total = sum(last[f"loss_{task}"] for task in losses) < sum(losses.values())
    assert total


def _environment() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


# --- `relif methods` and the sweep's --methods ------------------------------------------------


@pytest.fixture
def example_plugin(isolated_registry, monkeypatch, tmp_path) -> Path:
    """docs/examples/my_method.py (`gls`) on RELIF_METHODS_PATH, imported into the isolated
    registry."""
    folder = tmp_path / "my_methods"
    folder.mkdir()
    shutil.copy(EXAMPLE, folder)
    monkeypatch.setenv(METHODS_PATH, str(folder))
    methods()
    return folder / EXAMPLE.name


def listed_rows(text: str) -> dict[str, list[str]]:
    """The rows of the `relif methods` table (columns are two or more spaces apart), by name."""
    table = text.split("\n\n")[0].splitlines()
    rows = [re.split(r"\s{2,}", line.strip()) for line in table]
    assert rows[0] == list(COLUMNS)
    return {row[0]: row for row in rows[1:]}


def test_relif_methods_lists_every_method_and_the_plugins(example_plugin, capsys):
    assert cli.main(["methods"]) == 0
    text = capsys.readouterr().out
    rows = listed_rows(text)
    assert set(rows) == set(registry.METHODS) and "gls" in rows
    assert list(rows)[:5] == ["erm", "uncertainty", "gradnorm", "pcgrad", "fairgrad"]
    assert list(rows)[-1] == "gls"  # plug-ins last
    assert rows["cagrad"] == [
        "cagrad", "added", "gradient aggregation", "yes", "-", "c=0.4, norm_eps=0.0001",
        "Liu et al., NeurIPS 2021",
    ]  # fmt: skip
    assert rows["pcgrad"][1:5] == ["paper", "gradient aggregation", "yes", "yes"]
    citation = "Chennupati et al., CVPR Workshops 2019"
    assert rows["gls"] == ["gls", "plug-in", "loss weighting", "yes", "-", "-", citation]
    assert {name for name, row in rows.items() if row[4] == "yes"} == {
        name for name, cls in registry.METHODS.items() if "representation" in cls.gradient_sources
    }
    for name, row in rows.items():  # the listed defaults read back as --set reads them
        listed = dict(item.split("=") for item in row[5].split(", ")) if row[5] != "-" else {}
        defaults = registry.METHODS[name].option_defaults()
        assert {key: yaml_scalar(value) for key, value in listed.items()} == defaults, name
    assert f"gls: plug-in {example_plugin.resolve()}" in text
    assert "Default --methods: the paper's erm,uncertainty,gradnorm,pcgrad,fairgrad,relif" in text
    # equations by the paper's number (its Eq. 1 is the MTL loss), never by a LaTeX label
    assert rows["erm"][-1] == "equal-weight sum of the task losses (paper Eq. 1)"
    assert not [row[-1] for row in rows.values() if re.search(r"Eq\. ?\(?[a-z]", row[-1])]


def test_relif_methods_names_the_extra_a_method_misses(monkeypatch):
    pretend_missing(monkeypatch, "torchjd")
    lines = method_listing()
    hint = 'pip install -e ".[mtl]" (in the relif-ray checkout)'
    assert f"upgrad: needs torchjd, not installed: {hint}" in lines
    assert not any(line.startswith("famo: needs") for line in lines)


def sweep(tmp_path: Path, data: Path, *flags: str) -> int:
    """`relif sweep` on the tiny NYUv2 data, storage in tmp_path/out."""
    argv = ["sweep", "--dataset", "nyuv2", "--data-dir", str(data), "--storage"]
    return cli.main([*argv, str(tmp_path / "out"), "--seeds", "1", *flags])


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--methods", "erm,gls+relif,cats"], "--methods: unknown method 'cats' (known: "),
        (
            ["--methods", "gls,famo", "--set", "method.options.alpha=1"],
            "method.options: gls takes no option 'alpha' (its options: none)",
        ),
        (
            ["--methods", "famo+relif", "--set", "method.options.alpha=1"],
            "method.options: famo takes no option 'alpha' (its options: w_lr, gamma)",
        ),
    ],
)
def test_the_sweep_refuses_unknown_methods_and_options_before_ray_starts(
    flags, fragment, example_plugin, nyuv2_dir, tmp_path, capsys, no_sweep
):
    assert sweep(tmp_path, nyuv2_dir, *flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err
    if "unknown method" in fragment:  # every registered method is named, the plug-in too
        assert all(f" {name}," in err[0] for name in registry.METHODS)
    assert not (tmp_path / "out").exists()


@pytest.fixture
def planned(monkeypatch) -> list:
    """The trial spaces the driver hands to Ray Tune, recorded instead of run."""
    from relif_ray.tuning import launch

    spaces: list = []
    monkeypatch.setattr(
        launch, "run_sweep", lambda request, **_: spaces.append(request.space) or ""
    )
    return spaces


def test_the_default_grid_is_the_papers_and_plugins_are_asked_for_by_name(
    example_plugin, nyuv2_dir, tmp_path, planned
):
    assert sweep(tmp_path, nyuv2_dir) == 0
    assert sweep(tmp_path, nyuv2_dir, "--methods", "erm,upgrad+relif,gls,gls+relif") == 0
    default, chosen = ([trial.label for trial in space.trials] for space in planned)
    assert default == ["erm", "uncertainty", "gradnorm", "pcgrad", "fairgrad", "relif"]
    assert chosen == ["erm", "upgrad+relif", "gls", "gls+relif"]
    help_text = " ".join(build_parser(NYUV2).format_help().split())
    assert "default: the paper's erm,uncertainty,gradnorm,pcgrad,fairgrad,relif" in help_text
    assert "`relif methods` lists every method" in help_text


def readme_methods_section() -> str:
    readme = (REPO / "README.md").read_text()
    return readme.split("## Methods\n", 1)[1].split("\n## ", 1)[0]


README_ARCHITECTURES = "| **architectures**"
"""The row after which the README's method table lists the architectures
(`tests/test_architectures.py`)."""


def test_the_readme_method_table_is_the_registry():
    """Every built-in method once, with its kind and whether it has the representation mode."""
    listed = {}
    methods_part = readme_methods_section().split(README_ARCHITECTURES, 1)[0]
    for line in methods_part.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        for name in re.findall(r"`(\w+)`", cells[0]) if line.startswith("| `") else []:
            assert name not in listed, name
            listed[name] = (cells[1].removesuffix(" (TorchJD)"), cells[-1] == "yes")
    built_in = {n: c for n, c in registry.METHODS.items() if registry.plugin_file(c) is None}
    assert listed == {
        name: (cls.kind, "representation" in cls.gradient_sources) for name, cls in built_in.items()
    }


def test_the_readme_sweep_of_several_methods_plans_with_the_real_command(
    nyuv2_dir, tmp_path, planned
):
    readme = (REPO / "README.md").read_text()  # the Sweeps section's example
    (command,) = re.findall(r"^python (sweeps/nyuv2\.py --demo --methods .*)$", readme, re.M)
    argv = command.split()[1:] + ["--data-dir", str(nyuv2_dir), "--storage", str(tmp_path)]
    assert sweep_main(argv, datasets=("nyuv2",)) == 0
    (space,) = planned
    labels = command.split("--methods ")[1].split(",")
    assert {trial.label for trial in space.trials} == set(labels)
    assert {name.partition("+")[0] for name in labels} > {"upgrad", "famo"}  # added methods
    assert {"upgrad+relif", "upgrad"} <= set(labels)  # with and without ReLiF
