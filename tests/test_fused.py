"""Seeds fused into one trial (`relif_ray.fused`): each fused seed trains bit for bit as its own
unfused trial (every fusable method, every ReLiF label, each tabular benchmark), continues
exactly from a checkpoint, and what cannot be fused is refused in one line before Ray."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from relif_ray.cli.sweep import main, sweep_request
from relif_ray.cli.tabular import DATASETS, SOURCE
from relif_ray.config import ExperimentConfig
from relif_ray.engine import TrainingRun
from relif_ray.errors import UserError
from relif_ray.experiment.outputs import read_trial_record
from relif_ray.fused import FusedTrainingRun
from relif_ray.fusion import fused_form, fusion_refusal
from relif_ray.models.clinical import lstm_weights, packing_plan, unrolled_lstm
from relif_ray.problems import Problem, load_problem
from relif_ray.problems.mimic3 import CLINICAL_DEMO
from relif_ray.sweep.labels import RELIF_LABELS, variant
from relif_ray.sweep.trial_config import TuneKeys, with_fields
from tests.conftest import tiny_config
from tests.test_bad_inputs import one_line

SEEDS = (3, 7)
LOSS_WEIGHTINGS = ("erm", "uncertainty", "dwa", "rlw", "famo")
AGGREGATIONS = ("pcgrad", "fairgrad")
RELIF = tuple(f"erm+{name}" if name != "relif" else name for name in RELIF_LABELS)


def preset_base(folder: Path, preset: str, epochs: int = 2) -> ExperimentConfig:
    """The base config a `--preset` sweep plans (its table written as the sweep would)."""
    argv = ["--preset", preset, "--storage", str(folder), "--epochs", str(epochs)]
    request = sweep_request(argv, "relif sweep", DATASETS, False, SOURCE)
    request.prepare_data()
    return request.space.base


@pytest.fixture(scope="module")
def actg175(tmp_path_factory) -> tuple[ExperimentConfig, Problem]:
    base = preset_base(tmp_path_factory.mktemp("actg175"), "actg175")
    return base, load_problem(base.data)


def seed_configs(
    base: ExperimentConfig, problem: Problem, label: str, **fields: object
) -> list[ExperimentConfig]:
    """`label`'s config for each of SEEDS, each with squash constants of its own (as its
    same-seed ERM reference would give it)."""
    squashed = [task.name for task in problem.tasks if not task.score_is_probability]
    configs = []
    for seed in SEEDS:
        overrides = {**variant(label)["overrides"], **fields, "seed": seed}
        config = with_fields(base, overrides)
        if config.relif.enabled and config.relif.squash == "erm":
            constants = {name: [-1.0 + 0.1 * seed, 0.8 + 0.05 * seed] for name in squashed}
            config = with_fields(config, {"relif.squash_constants": constants})
        configs.append(config)
    return configs


def without_nan(trace: list[dict[str, float]]) -> list[dict[str, float | None]]:
    """A trace with NaN (never equal to itself) as None, so equal traces compare equal."""
    return [{k: None if math.isnan(v) else v for k, v in row.items()} for row in trace]


def assert_fused_equals_unfused(
    configs: list[ExperimentConfig], problem: Problem, form: str | None = None
) -> None:
    """Every seed of the fused run (in `form` where given, else its own) ends with its own
    run's trace, parameters, method and ReLiF state and validation numbers, bit for bit."""
    fused = FusedTrainingRun(configs, problem)
    fused.form = form or fused.form
    while not fused.finished:
        fused.train_epoch()
    fused_state = fused.state_dict()
    for index, config in enumerate(configs):
        alone = TrainingRun(config, problem)
        while not alone.finished:
            alone.train_epoch()
        member = fused.members[index]
        assert without_nan(member.trace) == without_nan(alone.trace)
        assert len(alone.trace) == alone.total_steps > 0
        for name, value in alone.state_dict()["model"].items():
            assert torch.equal(fused_state["members"][index]["model"][name], value), name
        if alone.regularizer is not None:
            own = fused_state["members"][index]["regularizer"]
            for name, value in alone.regularizer.state_dict().items():
                torch.testing.assert_close(own[name], value, rtol=0, atol=0, equal_nan=True)
        fused_val, alone_val = member.evaluate("val").metrics, alone.evaluate("val").metrics
        assert without_nan([fused_val]) == without_nan([alone_val])


@pytest.mark.parametrize("label", LOSS_WEIGHTINGS + AGGREGATIONS + RELIF + ("pcgrad+relif",))
def test_each_fused_seed_trains_bit_for_bit_as_its_own_trial(actg175, label):
    base, problem = actg175
    assert_fused_equals_unfused(seed_configs(base, problem, label), problem)


@pytest.mark.parametrize("preset", ["support2", "compas"])
def test_the_other_cohorts_fuse_bit_for_bit(preset, tmp_path):
    base = preset_base(tmp_path, preset, epochs=1)
    problem = load_problem(base.data)
    for label in ("relif", "fairgrad"):
        assert_fused_equals_unfused(seed_configs(base, problem, label), problem)


def test_the_torchjd_aggregations_fuse_bit_for_bit(actg175):
    pytest.importorskip("torchjd")
    base, problem = actg175
    for label in ("mgda", "upgrad"):
        assert_fused_equals_unfused(seed_configs(base, problem, label), problem)


@pytest.mark.parametrize(
    ("cohort", "budget"), [("actg175", "train.epochs"), ("eicu", "train.max_steps")]
)
def test_a_fused_run_resumed_from_its_state_ends_with_the_same_numbers(cohort, budget, request):
    """Stacked (ACTG 175) and looped (the clinical LSTM, with dropout) alike."""
    base, problem = request.getfixturevalue(cohort)
    configs = seed_configs(base, problem, "relif", **{budget: 3 if cohort == "actg175" else 8})
    straight = FusedTrainingRun(configs, problem)
    while not straight.finished:
        straight.train_epoch()
    first = FusedTrainingRun(configs, problem)
    first.train_epoch()
    first.train_steps(1)  # mid-epoch
    assert first.step % first.steps_per_epoch > 0
    state = first.state_dict()
    torch.manual_seed(12345)  # the global stream is not a fused seed's
    resumed = FusedTrainingRun(configs, problem)
    resumed.load_state_dict(state)
    while not resumed.finished:
        resumed.train_epoch()
    for done, again in zip(straight.members, resumed.members, strict=True):
        assert without_nan(again.trace) == without_nan(done.trace)
        for mine, theirs in zip(again.model.parameters(), done.model.parameters(), strict=True):
            assert torch.equal(mine, theirs)


def test_dropout_masks_are_each_seeds_own(actg175):
    """With dropout on (the preset's 0.1) two seeds draw different masks, each its own trial's:
    equal traces above are not a coincidence of shared masks."""
    base, problem = actg175
    assert base.model.dropout > 0
    fused = FusedTrainingRun(seed_configs(base, problem, "erm"), problem)
    fused.template.train()
    masks = fused._noise({})
    assert masks and all(not torch.equal(mask[0], mask[1]) for mask in masks)


@pytest.mark.parametrize(
    ("fields", "form"),
    [
        ({}, "stacked"),
        ({"method.name": "pcgrad"}, "stacked"),
        ({"method.name": "gradnorm"}, "looped"),
        ({"method.name": "dbmtl"}, "looped"),
        ({"method.gradient_source": "representation", "method.name": "pcgrad"}, "looped"),
        ({"train.compile_relif": True}, "looped"),
        ({"train.precision": "bf16"}, "looped"),
        ({"data.dataset": "eicu", "data.spec": {}}, "stacked"),
        ({"data.dataset": "eicu", "data.spec": {}, "model.architecture": "mmoe"}, "looped"),
        ({"data.dataset": "nyuv2", "data.spec": {}}, "looped"),
    ],
)
def test_what_cannot_be_stacked_is_looped(actg175, fields, form):
    base, _ = actg175
    assert fused_form(with_fields(base, fields)) == form


def test_a_cuda_device_and_configs_that_differ_are_refused(actg175):
    base, problem = actg175
    assert fusion_refusal(base) is None
    for device in ("cuda", "auto"):
        refusal = fusion_refusal(with_fields(base, {"device": device}))
        assert "fused trials of tabular run on the CPU" in refusal
    first, second = seed_configs(base, problem, "erm")
    with pytest.raises(UserError, match="differ beyond their seed"):
        FusedTrainingRun([first, with_fields(second, {"train.lr": 0.5})], problem)
    with pytest.raises(UserError, match="a seed repeats"):
        FusedTrainingRun([first, first], problem)


@pytest.mark.parametrize("label", ["gradnorm", "dbmtl", "gradnorm+relif"])
def test_the_looped_methods_fuse_bit_for_bit(actg175, label):
    base, problem = actg175
    configs = seed_configs(base, problem, label)
    assert fused_form(configs[0]) == "looped"
    assert_fused_equals_unfused(configs, problem)


@pytest.fixture(scope="module")
def eicu(tmp_path_factory) -> tuple[ExperimentConfig, Problem]:
    """eICU-shaped stays on the clinical LSTM: two layers (dropout between them and before
    the heads, each seed's own stream), a few steps."""
    from relif_ray.data.synthetic_eicu import write_synthetic_eicu

    root = write_synthetic_eicu(tmp_path_factory.mktemp("eicu") / "data", patients=24, seed=0)
    base = ExperimentConfig.from_dict(
        {
            "data": {"dataset": "eicu", "root": str(root)},
            "model": {"hidden_size": 8, "num_layers": 2, "dropout": 0.3},
            "train": {"epochs": None, "max_steps": 4, "batch_size": 4, "lr": 1e-2,
                      "optimizer": "adamw", "grad_clip": 1.0},
        }
    )  # fmt: skip
    return base, load_problem(base.data)


def assert_fused_close_to_unfused(configs: list[ExperimentConfig], problem: Problem) -> None:
    """Every seed of the fused run trains as its own run up to the rounding of the stacked
    LSTM: each step's losses (before a step, the same parameters and dropout masks) within
    float32's few ulps of the recursion's length, and each parameter within a hundredth of
    the largest move Adam can make over the run (lr per step)."""
    fused = FusedTrainingRun(configs, problem)
    while not fused.finished:
        fused.train_epoch()
    lr = configs[0].train.lr
    for index, config in enumerate(configs):
        alone = TrainingRun(config, problem)
        while not alone.finished:
            alone.train_epoch()
        member = fused.members[index]
        assert len(member.trace) == len(alone.trace) == alone.total_steps > 0
        for mine, theirs in zip(member.trace, alone.trace, strict=True):
            for key in ("loss_mortality", "loss_length_of_stay"):
                assert mine[key] == pytest.approx(theirs[key], rel=1e-5), key
        parameters = zip(member.model.parameters(), alone.model.parameters(), strict=True)
        for mine, theirs in parameters:
            torch.testing.assert_close(mine, theirs, rtol=0, atol=0.01 * lr * alone.step)


@pytest.mark.parametrize("label", ["erm", "relif", "pcgrad"])
def test_the_clinical_lstm_stacked_trains_as_its_own_trial_up_to_rounding(eicu, label):
    """The unrolled LSTM of all seeds against each seed's `nn.LSTM` over its packed stays,
    with dropout between the layers and on the outputs (each seed's own masks)."""
    base, problem = eicu
    configs = seed_configs(base, problem, label)
    assert fused_form(configs[0]) == "stacked"
    assert_fused_close_to_unfused(configs, problem)


def test_the_clinical_lstm_looped_fuses_bit_for_bit(eicu):
    base, problem = eicu
    configs = seed_configs(base, problem, "gradnorm")
    assert fused_form(configs[0]) == "looped"
    assert_fused_equals_unfused(configs, problem)


def test_the_unrolled_lstm_is_nn_lstms_recursion(eicu):
    """`unrolled_lstm` against `nn.LSTM` on one padded batch, with the dropout masks that
    `nn.LSTM` draws between its layers (on the packed sequence) laid out in the padding."""
    torch.manual_seed(0)
    lstm = nn.LSTM(3, 5, num_layers=3, batch_first=True, dropout=0.4)
    inputs, lengths = torch.randn(4, 6, 3), torch.tensor([6, 2, 5, 1])
    plan = packing_plan(lengths, 6)
    packed = PackedSequence(inputs.reshape(24, 3)[plan.indices[: plan.packed]], plan.batch_sizes)
    torch.manual_seed(1)
    expected, _ = lstm(packed)
    torch.manual_seed(1)
    between = torch.zeros(2, 24, 5)
    for gap in range(2):
        mask = torch.empty(plan.packed, 5).bernoulli_(0.6).div_(0.6)
        between[gap].index_copy_(0, plan.indices[: plan.packed], mask)
    weights = [weight[None] for weight in lstm_weights(lstm)]
    outputs = unrolled_lstm(inputs[None], weights, between.view(1, 2, 4, 6, 5))[0]
    packed_outputs = outputs.reshape(24, 5)[plan.indices[: plan.packed]]
    torch.testing.assert_close(packed_outputs, expected.data, rtol=0, atol=1e-6)
    assert not torch.equal(between[0], between[1])


def test_nyuv2_fuses_bit_for_bit(nyuv2_dir, tiny_encoders):
    """A ResNet with BatchNorm: each seed's running statistics its own."""
    base = ExperimentConfig.from_dict(tiny_config(nyuv2_dir, epochs=None, max_steps=2))
    problem = load_problem(base.data)
    for label in ("erm", "relif"):
        assert_fused_equals_unfused(seed_configs(base, problem, label), problem)


def test_the_streamed_form_trains_each_seed_as_its_own_trial(nyuv2_dir, tiny_encoders):
    """A GPU's fused NYUv2 trial runs each seed's own step on its own CUDA stream: the same
    steps, here without the streams, bit for bit; a CUDA device is not refused for NYUv2."""
    base = ExperimentConfig.from_dict(tiny_config(nyuv2_dir, epochs=None, max_steps=2))
    assert fusion_refusal(with_fields(base, {"device": "cuda"})) is None
    problem = load_problem(base.data)
    for label in ("erm", "relif", "pcgrad"):
        assert_fused_equals_unfused(seed_configs(base, problem, label), problem, "streamed")


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--scheduler", "asha"), "--fused-seeds: ASHA stops trials"),
        (("--search", "optuna", "--methods", "relif"), "--fused-seeds: --search optuna"),
        (("--num-gpus", "1"), "--fused-seeds: fused trials of tabular run on the CPU"),
    ],
)
def test_a_sweep_that_cannot_fuse_is_refused_before_ray(flags, says, tmp_path, capsys, no_sweep):
    storage = tmp_path / "results"
    argv = ["--demo", "--fused-seeds", "2", "--storage", str(storage), *flags]
    status = main(argv, datasets=DATASETS, controller_checks=False, source=SOURCE)
    one_line(status, capsys, says)
    assert not storage.exists()


@pytest.mark.slow
def test_a_fused_sweep_retried_after_a_fault_gives_each_seed_its_own_trials_numbers(
    ray_session, tmp_path
):
    """The ACTG 175 preset with `--fused-seeds 2`: the fused ERM trial provides each seed's
    squash constants, the fused ReLiF trial trains on them, a fault in the second epoch is
    retried from the first epoch's checkpoint and says which seeds the trial held, and every
    seed is its own trial row whose numbers are those of an unfused run of its recorded
    config."""
    from relif_ray import analysis
    from relif_ray.tuning import run_sweep_request

    argv = [
        *("--preset", "actg175", "--methods", "erm,relif", "--seeds", "2", "--epochs", "2"),
        *("--fused-seeds", "2", "--storage", str(tmp_path), "--name", "fused"),
    ]
    request = sweep_request(argv, "relif sweep", DATASETS, False, SOURCE)
    request.prepare_data()
    steps_per_epoch = len(load_problem(request.space.base.data).splits["train"]) // 128
    space = dataclasses.replace(
        request.space, shared=TuneKeys(fault_injection_step=steps_per_epoch + 3)
    )
    experiment = Path(
        run_sweep_request(
            dataclasses.replace(
                request, space=space, max_failures=1, checkpoint_interval_s=0.0, checkpoint_every=1
            )
        )
    )
    names = sorted(path.name.rsplit("_", 1)[0] for path in experiment.glob("*_seeds0-1_*"))
    assert names == ["erm_seeds0-1", "relif_r0.16_eta0.9_seeds0-1"]  # 19.8 / 22 steps
    errors = [path.read_text() for path in experiment.glob("*/error.txt")]
    assert errors and all("a fused trial of seeds 0, 1" in text for text in errors)
    trials = analysis.load(str(experiment)).trials
    assert sorted(zip(trials["label"], trials["seed"], strict=True)) == [
        ("erm", 0), ("erm", 1), ("relif", 0), ("relif", 1)
    ]  # fmt: skip
    for _, row in trials.iterrows():
        alone = TrainingRun(ExperimentConfig.from_dict(row["config"]))
        while not alone.finished:
            alone.train_epoch()
        metrics = alone.evaluate("val").metrics
        assert {name: row[f"val_{name}"] for name in metrics} == metrics, (row.label, row.seed)
    records = [
        read_trial_record(str(path)) for path in experiment.glob("*/checkpoint_*/outputs/seed*")
    ]
    assert len(records) == 4 and all(record.restored_from_checkpoint for record in records)


def test_the_plan_puts_each_settings_seeds_in_fused_trials_with_a_reference_key_per_seed(actg175):
    from relif_ray.sweep.plan import param_space, trial_order

    base, _ = actg175
    fused = with_fields(base, {"train.fused_seeds": 2})
    space = param_space(fused, [variant("relif")], [0, 1, 2], 0.2)
    assert [trial.seeds for trial in space.trials] == [(0, 1), (2,)]
    order = trial_order(space, None, set())
    rows = [(item["config"].label, item["config"].seeds, item["needs"], item["provides"])
            for item in order.items]  # fmt: skip
    assert rows == [
        ("erm", (0, 1), None, ["0", "1"]),  # the references the sweep adds, fused as well
        ("erm", (2,), None, "2"),
        ("relif", (0, 1), ["0", "1"], None),
        ("relif", (2,), "2", None),
    ]
    assert order.added_references == ("0", "1", "2")


def test_the_readme_and_the_docs_quote_the_fused_records():
    """The README's and docs/benchmarks.md's figures are the committed records': the fused
    rows, and what the saving buys the eICU demo (twice its seeds, fused, on the wall clock)."""
    import json
    import re

    repo = Path(__file__).resolve().parents[1]
    record = json.loads((repo / "docs/results/2026-12-03-cpu-fused.json").read_text())
    rows = {row["name"].split(" trial-seconds")[0]: row for row in record["rows"]}
    readme, benchmarks = (repo / "README.md").read_text(), (repo / "docs/benchmarks.md").read_text()
    actg, clinical = rows["ACTG 175"], rows["clinical LSTM"]
    assert f"{actg['value']:.2f}x on ACTG 175" in readme
    assert f"missed at {actg['value']:.2f}x" in benchmarks
    assert actg["result"] == "FAIL" and actg["target"] == ">= 4"
    assert f"{clinical['value']:.2f}x fewer trial-seconds" in readme
    assert f"**The clinical LSTM: {clinical['value']:.2f}x** against 2x (pass)" in benchmarks
    assert clinical["result"] == "pass" and clinical["target"] == ">= 2"
    assert f"**NYUv2's demo: {rows['NYUv2 demo']['value']:.2f}x**" in benchmarks
    demo = json.loads((repo / "docs/results/2026-12-03-cpu-fused-demo.json").read_text())
    (row,) = demo["rows"]
    seeds, separate, fused_seeds, fused = re.search(
        r"(\d+) seeds x erm,relif separate: (\d+) s; (\d+) seeds fused: (\d+) s", row["detail"]
    ).groups()
    assert int(fused_seeds) == 2 * int(seeds) == 2 * CLINICAL_DEMO["seeds"]
    assert row["value"] < 2  # twice the seeds in less than twice the time: a saving per seed
    assert (
        f"--seeds {fused_seeds} --fused-seeds {fused_seeds}` trains twice the eICU demo's "
        f"{seeds} seeds in {row['value']:.1f}x its wall time ({fused} s against {separate} s)"
    ) in readme
