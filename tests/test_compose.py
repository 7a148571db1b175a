"""The sweep's base config as a pure function of its layers (`relif_ray.sweep.compose`):
data-set defaults < its GPU fast path < --demo < --config < --set < named flags, and the
demo-budget rule."""

from __future__ import annotations

import pytest

from relif_ray.config import ExperimentConfig
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
