"""The LibMTL preset `configs/nyuv2-libmtl.yaml`: through the sweep's real config composition
it resolves to LibMTL's ResNet-50 NYUv2 training setting, Tune's trial config carries it, and
its schedule halves the rate for the second 100 of the 200 epochs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from relif_ray.cli.sweep import NYUV2, base_config, build_parser
from relif_ray.config import ExperimentConfig
from relif_ray.schedule import build_lr_scheduler
from relif_ray.sweep.trial_config import tune_constants

REPO = Path(__file__).resolve().parents[1]
PRESET = REPO / "configs" / "nyuv2-libmtl.yaml"

LIBMTL_NYUV2 = {
    "model.backbone": "resnet50",
    "model.pretrained": "imagenet",
    "model.architecture": "hps",
    "model.head": "aspp",
    "model.head_channels": 256,
    "train.optimizer": "adam",
    "train.lr": 1e-4,
    "train.weight_decay": 1e-5,
    "train.scheduler": "step",
    "train.scheduler_step_size": 100,
    "train.scheduler_gamma": 0.5,
    "train.batch_size": 8,
    "train.epochs": 200,
    "train.max_steps": None,
}
"""LibMTL's NYUv2 setting (docs/nyuv2_setting.md): `examples/nyu/main.py` (batch 8, 200 epochs,
dilated ResNet-50 with ImageNet weights, one DeepLabV3 head of 256 channels per task, hard
parameter sharing as in its published table) and `LibMTL/config.py` (Adam 1e-4, weight decay
1e-5, StepLR step 100, gamma 0.5)."""


@pytest.fixture(scope="module")
def resolved(tmp_path_factory: pytest.TempPathFactory) -> ExperimentConfig:
    args = build_parser(NYUV2).parse_args(["--config", str(PRESET)])
    return base_config(args, NYUV2, str(tmp_path_factory.mktemp("data")))


def test_the_preset_resolves_to_libmtls_nyuv2_setting(resolved):
    tune_config = tune_constants(resolved, NYUV2.delta)  # what every trial's config holds
    assert {field: tune_config[field] for field in LIBMTL_NYUV2} == LIBMTL_NYUV2


def test_later_layers_still_override_the_preset(tmp_path):
    argv = ["--config", str(PRESET), "--set", "train.scheduler_gamma=0.1", "--epochs", "2"]
    train = base_config(build_parser(NYUV2).parse_args(argv), NYUV2, str(tmp_path)).train
    assert (train.scheduler_gamma, train.epochs, train.scheduler) == (0.1, 2, "step")


def test_the_presets_schedule_halves_the_rate_after_100_epochs(resolved):
    train = resolved.train
    optimizer = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=train.lr)
    schedule = build_lr_scheduler(optimizer, train, epochs=train.epochs)
    rates = []
    for _ in range(train.epochs):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()  # an epoch's training (no gradients: changes nothing)
        schedule.step()
    assert rates == [1e-4] * 100 + [5e-5] * 100


def test_the_nyuv2_setting_doc_names_the_preset():
    doc = (REPO / "docs" / "nyuv2_setting.md").read_text()
    assert "configs/nyuv2-libmtl.yaml" in doc


def test_the_presets_model_has_libmtls_deeplab_heads(resolved):
    """Built (on the meta device, as the sweep checks it) from the preset: hard sharing on the
    dilated ResNet-50 with an ASPP head of 256 channels per task (the head's equality with
    LibMTL's is `tests/test_architectures_libmtl.py`)."""
    from relif_ray.models.architectures import build_dense_model
    from relif_ray.models.aspp import AsppHead

    model_config = replace(resolved.model, pretrained="none")
    with torch.device("meta"):  # pretrained "none": the layout, without ImageNet's file
        model = build_dense_model(model_config)
    assert model.architecture == "hps"
    assert all(isinstance(head, AsppHead) for head in model.heads.values())
    assert [head.decoder[0].project[0].out_channels for head in model.heads.values()] == [256] * 3
