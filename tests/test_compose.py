"""The sweep's base config as a pure function of its layers (`relif_ray.sweep.compose`):
data-set defaults < its GPU fast path < --demo < the controller's budget < --config < --set <
named flags, the demo-budget rule and the controller-budget rule."""

from __future__ import annotations

import pytest

from relif_ray.config import ExperimentConfig, TrainConfig
from relif_ray.errors import UserError
from relif_ray.problems import benchmark
from relif_ray.relif.controller import scale_to_budget
from relif_ray.sweep.compose import compose_config, controller_budget, demo_budget

NYUV2 = benchmark("nyuv2").defaults


def test_each_layer_overrides_the_ones_below_it():
    layers = [
        ("--config c.yaml", {"train.lr": 0.1, "train.batch_size": 5, "train.epochs": 9}),
        ("--set", {"train.lr": 0.2, "train.batch_size": 6}),
        ("flags", {"train.lr": 0.3}),
    ]
    config = compose_config(NYUV2, layers, "/data", use_gpu=False)
    train = config.train
    assert (train.lr, train.batch_size, train.epochs) == (0.3, 6, 9)
    assert config.model.backbone == NYUV2.backbone  # the data set's default
    assert (config.data.dataset, config.data.root) == ("nyuv2", "/data")
    assert config.device == "cpu"
    assert compose_config(NYUV2, [], "/data", use_gpu=True).device == "auto"


def test_demo_sits_between_the_data_set_and_the_config_file():
    demo = demo_budget(NYUV2, epochs=None, steps=None)
    config = compose_config(NYUV2, [], "/d", use_gpu=False, demo=demo)
    assert config.model.backbone == NYUV2.demo_train["backbone"]
    assert config.train.max_steps == NYUV2.demo_train["steps"]
    layered = compose_config(NYUV2, [("--set", {"model.backbone": "resnet34"})], "/d", False, demo)
    assert layered.model.backbone == "resnet34"


@pytest.mark.parametrize(
    ("epochs", "steps", "fields"),
    [
        (None, None, {"train.epochs": None, "train.max_steps": 240}),  # the demo's own
        (None, 7, {}),  # --steps alone: the flag's budget
        (3, None, {}),
    ],
)
def test_the_demo_budget_rule(epochs, steps, fields):
    assert demo_budget(NYUV2, epochs, steps).fields == fields


def train(defaults, **fields) -> TrainConfig:
    values = {"epochs": defaults.epochs, "batch_size": defaults.batch_size, **fields}
    return TrainConfig(**values)


def not_asked() -> int:
    raise AssertionError("the rule asked for the training set's size where none is needed")


@pytest.mark.parametrize(
    ("dataset", "fields", "examples", "eta", "warmup", "steps", "rule"),
    [
        ("nyuv2", {}, not_asked, 1e-3, 100, None, "paper"),  # Table 5 at its 200 epochs
        ("nyuv2", {"epochs": 50}, lambda: 795, 19.8 / 4950, 25, 4950, "scaled"),
        ("nyuv2", {"epochs": None, "max_steps": 240}, not_asked, 19.8 / 240, 1, 240, "scaled"),
        ("eicu", {}, not_asked, 1e-3, 100, None, "paper"),  # the paper's eICU setting
        ("eicu", {"epochs": 10}, lambda: 1000, 19.8 / 150, 1, 150, "scaled"),
        ("mimic3", {}, lambda: 14_681, 19.8 / 22_900, 116, 22_900, "scaled"),
        ("tabular", {}, lambda: 1497, 0.018, 6, 1100, "scaled"),  # ACTG 175's train split
        ("tabular", {"max_steps": 300}, lambda: 1497, 19.8 / 300, 2, 300, "scaled"),  # the cap
        ("tabular", {}, lambda: None, 1e-3, 100, None, "unknown budget"),  # no data yet
    ],
)
def test_the_controller_budget_rule(dataset, fields, examples, eta, warmup, steps, rule):
    """eta x steps = 19.8 and warmup / steps = 100 / 19,800 (the paper's NYUv2 run) at every
    budget, except where the paper fixes eta for the data set and budget at hand."""
    defaults = benchmark(dataset).defaults
    budget = controller_budget(defaults, train(defaults, **fields), examples)
    assert (budget.rule, budget.steps, budget.warmup_steps) == (rule, steps, warmup)
    assert budget.eta == pytest.approx(eta, rel=1e-12)
    if rule == "scaled":
        assert budget.eta * steps == pytest.approx(19.8) and (budget.eta, warmup) == (
            scale_to_budget(steps)
        )
    assert budget.fields() == {"relif.eta": budget.eta, "relif.warmup_steps": warmup}
    assert f"eta {budget.eta:.4g}, warmup {warmup}" in budget.line()


def test_the_controller_layer_sits_under_the_users_layers():
    budget = controller_budget(NYUV2, train(NYUV2, epochs=None, max_steps=240), not_asked)
    config = compose_config(NYUV2, [], "/d", use_gpu=False, controller=budget)
    assert (config.relif.eta, config.relif.warmup_steps) == (budget.eta, 1)
    user = [("flags", {"relif.warmup_steps": 7})]
    assert compose_config(NYUV2, user, "/d", False, controller=budget).relif.warmup_steps == 7


def test_gpu_trials_get_the_fast_path_unless_asked_otherwise():
    """NYUv2's GPU fast path (bf16 forward, channels-last, data on the device) where trials get
    a GPU, under every user layer; `gpu_fast_path=False` (--no-gpu-fast-path) and CPU
    sweeps keep the engine's fp32 NCHW host path."""
    fast = {"precision": "bf16", "channels_last": True, "data_on_device": True}
    plain = {"precision": "fp32", "channels_last": False, "data_on_device": False}

    def path(config: ExperimentConfig) -> dict:
        return {field: getattr(config.train, field) for field in fast}

    assert path(compose_config(NYUV2, [], "/d", use_gpu=True)) == fast
    assert path(compose_config(NYUV2, [], "/d", use_gpu=True, gpu_fast_path=False)) == plain
    assert path(compose_config(NYUV2, [], "/d", use_gpu=False)) == plain
    demo = demo_budget(NYUV2, epochs=None, steps=None)
    assert path(compose_config(NYUV2, [], "/d", use_gpu=True, demo=demo)) == fast
    user = [("--set", {"train.precision": "fp32"})]
    assert path(compose_config(NYUV2, user, "/d", use_gpu=True))["precision"] == "fp32"
    clinical = benchmark("mimic3").defaults
    assert path(compose_config(clinical, [], "/d", use_gpu=True)) == plain


def test_the_plan_says_which_path_gpu_trials_run(tmp_path):
    from relif_ray.cli.sweep import DATASETS, sweep_request
    from relif_ray.sweep.plan import plan_summary

    flags = ["--data-dir", str(tmp_path), "--num-gpus", "2", "--methods", "erm"]
    for extra, shown in (
        ([], "GPU trials run bf16 forward, channels-last, data on the GPU, the step as one "
             "CUDA graph where the method allows"),
        (["--no-gpu-fast-path"], "GPU trials run fp32, NCHW, batches from the host, eager "
                                 "steps"),
    ):  # fmt: skip
        request = sweep_request([*flags, *extra], None, tuple(DATASETS), False)
        plan = plan_summary(request.space, request.search, request.resources)
        assert plan.endswith(f"(1 CPU + 0.5 GPU per trial); {shown}")
    cpu = sweep_request(["--data-dir", str(tmp_path)], None, tuple(DATASETS), False)
    assert "GPU trials" not in plan_summary(cpu.space, cpu.search, cpu.resources)


def test_a_bad_layer_is_named():
    with pytest.raises(UserError, match="^--set: config field train.lr"):
        compose_config(NYUV2, [("--set", {"train.lr": "fast"})], "/d", use_gpu=False)
