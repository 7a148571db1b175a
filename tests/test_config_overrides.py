"""Config fields from the command line: --config FILE.yaml, --set section.field=value and the
short flags, their precedence (data-set defaults < --demo < --config < --set < named flags) and
their one-line errors, on every sweep script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relif_ray.cli.sweep import NYUV2, base_config, build_parser
from relif_ray.sweep.overrides import parse_set, read_config_file, yaml_scalar
from tests.conftest import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = ["nyuv2.py", "clinical.py", "run.py", "controller_sensitivity.py"]


def resolved(argv: list[str], root: Path) -> dict:
    """The sweep's base config of `argv`, as a nested dict."""
    args = build_parser(NYUV2).parse_args(argv)
    return base_config(args, NYUV2, str(root)).to_dict()


def test_each_layer_overrides_the_ones_below(tmp_path):
    """train.lr and train.precision set at every layer: each layer beats the one below it."""
    file = tmp_path / "c.yaml"
    file.write_text("train:\n  lr: 2e-3\n  precision: bf16\nmodel.head_channels: 64\n")
    layers = [
        ([], 1e-4, "fp32"),  # NYUv2's defaults (LibMTL's Adam 1e-4)
        (["--demo"], 1e-3, "fp32"),
        (["--demo", "--config", str(file)], 2e-3, "bf16"),
        (["--demo", "--config", str(file), "--set", "train.lr=3e-3", "--set",
          "train.precision=fp32"], 3e-3, "fp32"),
        (["--demo", "--config", str(file), "--set", "train.lr=3e-3", "--set",
          "train.precision=fp32", "--lr", "4e-3", "--precision", "bf16"], 4e-3, "bf16"),
    ]  # fmt: skip
    for argv, lr, precision in layers:
        config = resolved(argv, tmp_path)
        assert (config["train"]["lr"], config["train"]["precision"]) == (lr, precision), argv
    config = resolved(layers[-1][0], tmp_path)
    assert config["model"]["head_channels"] == 64  # dotted key in the file; nothing above it
    assert config["model"]["backbone"] == "resnet18"  # --demo's, untouched by later layers


def test_short_flags_set_their_fields(tmp_path):
    weights = tmp_path / "resnet18.pt"
    torch.save({}, weights)
    config = resolved(
        ["--channels-last", "--compile", "--precision", "bf16", "--pretrained", str(weights)],
        tmp_path,
    )
    assert config["train"]["channels_last"] is True and config["train"]["compile"] is True
    assert config["train"]["precision"] == "bf16"
    assert config["model"]["pretrained"] == str(weights.resolve())
    assert resolved(["--pretrained", "imagenet"], tmp_path)["model"]["pretrained"] == "imagenet"
    unset = resolved(["--set", "train.channels_last=true", "--no-channels-last"], tmp_path)
    assert unset["train"]["channels_last"] is False
    assert resolved([], tmp_path)["model"]["pretrained"] == "none"


def test_steps_flag_clears_an_epoch_budget_from_below(tmp_path):
    config = resolved(["--set", "train.epochs=5", "--steps", "7"], tmp_path)
    assert (config["train"]["epochs"], config["train"]["max_steps"]) == (None, 7)
    config = resolved(["--set", "train.max_steps=9", "--epochs", "2"], tmp_path)
    assert (config["train"]["epochs"], config["train"]["max_steps"]) == (2, 9)


def test_values_are_yaml_scalars_and_files_may_nest_or_dot(tmp_path):
    assert [yaml_scalar(t) for t in ["1e-3", "3", "true", "null", "bf16", "0.5"]] == [
        1e-3, 3, True, None, "bf16", 0.5,
    ]  # fmt: skip
    assert parse_set(["train.grad_clip=1.0", "method.options.alpha=1.5"]) == {
        "train.grad_clip": 1.0,
        "method.options.alpha": 1.5,
    }
    nested, dotted = tmp_path / "n.yaml", tmp_path / "d.yaml"
    nested.write_text("train:\n  lr: 1e-3\nrelif:\n  warmup_steps: 3\n")
    dotted.write_text("train.lr: 1e-3\nrelif.warmup_steps: 3\n")
    assert read_config_file(str(nested)) == read_config_file(str(dotted))
    assert read_config_file(str(dotted)) == {"train.lr": 1e-3, "relif.warmup_steps": 3}


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("train: [1, 2\n", "not valid YAML (line 2)"),
        ("- 1\n", "expected a mapping of config fields"),
        ("seed: 3\n", "seed: set by --seeds"),
        ("train:\n  lr: fast\n", "config field train.lr: expected float"),
    ],
)
def test_bad_config_files_are_one_line_errors(content, fragment, tmp_path, capsys):
    from relif_ray.cli.sweep import main

    file = tmp_path / "c.yaml"
    file.write_text(content)
    status = main(
        datasets=("nyuv2",), argv=["--demo", "--config", str(file), "--storage", str(tmp_path)]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, err
    assert fragment in err[0] and str(file) in err[0]


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_every_sweep_script_takes_set_and_refuses_fields_of_the_grid(script, tmp_path):
    run = subprocess.run(
        [sys.executable, f"sweeps/{script}", "--demo", "--storage", str(tmp_path),
         "--set", "train.precision=bf16", "--set", "seed=1"],
        cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert run.returncode == 2 and run.stderr.strip() == (
        f"{script}: error: --set seed: set by --seeds, not by a config override"
    )
