"""The sweep's base config as a pure function of its layers (`relif_ray.sweep.compose`):
data-set defaults < --demo < --config < --set < named flags, and the demo-budget rule."""

from __future__ import annotations

import pytest

from relif_ray.errors import UserError
from relif_ray.problems import benchmark
from relif_ray.relif.controller import scale_to_budget
from relif_ray.sweep.compose import compose_config, demo_budget

NYUV2 = benchmark("nyuv2").defaults


def test_each_layer_overrides_the_ones_below_it():
    layers = [
        ("--config c.yaml", {"train.lr": 0.1, "train.batch_size": 5, "train.epochs": 9}),
        ("--set", {"train.lr": 0.2, "train.batch_size": 6}),
        ("flags", {"train.lr": 0.3}),
    ]
    config = compose_config(NYUV2, layers, "/data", use_gpu=False)
    train = config["train"]
    assert (train["lr"], train["batch_size"], train["epochs"]) == (0.3, 6, 9)
    assert config["model"]["backbone"] == NYUV2.backbone  # the data set's default
    assert config["data"] == {"dataset": "nyuv2", "root": "/data"}
    assert config["device"] == "cpu"
    assert compose_config(NYUV2, [], "/data", use_gpu=True)["device"] == "auto"


def test_demo_sits_between_the_data_set_and_the_config_file():
    demo = demo_budget(NYUV2, epochs=None, steps=None)
    config = compose_config(NYUV2, [], "/d", use_gpu=False, demo=demo)
    assert config["model"]["backbone"] == NYUV2.demo_train["backbone"]
    assert config["train"]["max_steps"] == NYUV2.demo_train["steps"]
    layered = compose_config(NYUV2, [("--set", {"model.backbone": "resnet34"})], "/d", False, demo)
    assert layered["model"]["backbone"] == "resnet34"


@pytest.mark.parametrize(
    ("epochs", "steps", "fields", "scaled_steps"),
    [
        (None, None, {"train.epochs": None, "train.max_steps": 240}, 240),  # the demo's own
        (None, 7, {}, 7),  # --steps alone: that step budget
        (3, None, {}, None),  # an epoch budget: nothing to scale to
        (2, 160, {}, None),
    ],
)
def test_the_demo_budget_rule(epochs, steps, fields, scaled_steps):
    budget = demo_budget(NYUV2, epochs, steps)
    if scaled_steps is None:
        assert budget.fields == fields and budget.eta is None
        return
    eta, warmup = scale_to_budget(scaled_steps, NYUV2.eta)
    assert budget.fields == {**fields, "relif.warmup_steps": warmup} and budget.eta == eta


def test_a_bad_layer_is_named():
    with pytest.raises(UserError, match="^--set: config field train.lr"):
        compose_config(NYUV2, [("--set", {"train.lr": "fast"})], "/d", use_gpu=False)
