"""The architectures compose with everything else: every registered method, with and without
ReLiF, trains through the engine on every NYUv2 architecture and every expert architecture of
the clinical LSTM; which parameters are shared follows one rule; the representation-gradient
mode works where there is one encoder output and is a one-line error where there is none;
checkpoints resume with identical numbers; bad combinations are one-line errors before Ray.

Size: 350 short trials must fit the suite's budget, so the NYUv2 encoder here is a narrow
ResNet of torchvision's own blocks (`tests.conftest.tiny_resnet`, ~30k parameters, patched in for
torchvision's ResNet builder), its images 8x8, two steps each. The architectures' code is
the same as on ResNet-18 and ResNet-50, which `tests/test_architectures_libmtl.py` runs
against LibMTL.
"""

from __future__ import annotations

import copy
import io
import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from relif_ray.config import ExperimentConfig, ModelConfig
from relif_ray.data.eicu import MORTALITY_HOURS
from relif_ray.data.sequences import SequenceSplit
from relif_ray.engine import TrainingRun
from relif_ray.errors import UserError
from relif_ray.methods import METHODS
from relif_ray.methods.registry import missing_requirements
from relif_ray.models import dense
from relif_ray.models.architectures import ARCHITECTURES, LSTM
from relif_ray.problems import Problem, load_problem
from relif_ray.sweep.preflight import check_trial_configs

NYUV2_ARCHITECTURES = list(ARCHITECTURES)
LSTM_ARCHITECTURES = [name for name, arch in ARCHITECTURES.items() if LSTM in arch.encoders]
METHOD_NAMES = sorted(name for name, cls in METHODS.items() if not missing_requirements(cls))
SMALL_OPTIONS = {
    "mmoe": {"num_experts": 2},
    "cgc": {"num_experts": 1, "task_experts": 1},
    "ple": {"num_experts": 1, "task_experts": 1},
    "dselect_k": {"num_experts": 2, "num_nonzeros": 1},
}
"""The fewest experts of each kind (DSelect-k's second regularizer term, for expert counts
that are not powers of two, is compared with LibMTL's in `tests/test_architectures_libmtl.py`)."""
METHOD_OPTIONS = {"nashmtl": {"optim_niter": 1}}
"""Nash-MTL's solver iterations per step (20 by default): one, for time."""
RELIF = {"enabled": True, "warmup_steps": 0}
SQUASH = {"depth": [0.5, 1.5], "normal": [0.5, 1.5]}
"""Squash constants of the tiny models' depth/normal scores (any band: ReLiF only needs one)."""


@pytest.fixture(scope="module")
def nyuv2_tiny(tmp_path_factory) -> Path:
    from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2

    root = tmp_path_factory.mktemp("nyuv2-8") / "data"
    return write_synthetic_nyuv2(root, seed=0, train=2, val=2, height=8, width=8)


@pytest.fixture(scope="module")
def eicu_tiny(tmp_path_factory) -> Path:
    from relif_ray.data.synthetic_eicu import write_synthetic_eicu

    return write_synthetic_eicu(tmp_path_factory.mktemp("eicu") / "data", patients=20, seed=0)


def short_stays(split: SequenceSplit, count: int = 2) -> SequenceSplit:
    """The `count` shortest stays of `split` that reach the mortality hour (so that every
    task has a label, and ReLiF pairs): an LSTM step costs per hour of the longest stay."""
    long_enough = torch.nonzero(split.lengths >= MORTALITY_HOURS).flatten()
    chosen = long_enough[torch.argsort(split.lengths[long_enough], stable=True)[:count]]
    rows = torch.cat([torch.arange(split.offsets[i], split.offsets[i + 1]) for i in chosen])
    offsets = torch.zeros(count + 1, dtype=torch.long)
    offsets[1:] = split.lengths[chosen].cumsum(0)
    return SequenceSplit(
        features=split.features[rows],
        offsets=offsets,
        stay_targets={name: target[chosen] for name, target in split.stay_targets.items()},
        step_targets={name: target[rows] for name, target in split.step_targets.items()},
        names=[split.names[i] for i in chosen],
    )


def config(root: Path, dataset: str, architecture: str, **sections) -> ExperimentConfig:
    model = {
        "architecture": architecture,
        "architecture_options": SMALL_OPTIONS.get(architecture, {}),
    }
    if dataset == "nyuv2":
        model["head_channels"] = 4
    else:  # one LSTM layer per expert, two levels for PLE
        model.update(hidden_size=4, num_layers=2 if architecture == "ple" else 1)
    values = {
        "seed": 0,
        "data": {"dataset": dataset, "root": str(root)},
        "model": {**model, **sections.pop("model", {})},
        "train": {"epochs": None, "max_steps": 2, "batch_size": 2, "lr": 1e-2},
        "relif": {"squash_constants": SQUASH},
        **sections,
    }
    return ExperimentConfig.from_dict(values)


def trains(config: ExperimentConfig, problem: Problem) -> list[dict[str, float]]:
    run = TrainingRun(config, problem)
    run.train_steps(2)
    return run.trace


def sharing_one_model(problem: Problem, model: nn.Module) -> Problem:
    """`problem` whose factory hands out one built model, put back to its initial state each
    time: many trials of one architecture, one after the other, without rebuilding it."""
    initial = copy.deepcopy(model.state_dict())

    def initial_model(_: ModelConfig) -> nn.Module:
        model.load_state_dict(initial)
        return model

    return Problem(problem.name, problem.tasks, problem.splits, initial_model)


def failures_of_every_method(root: Path, dataset: str, architecture: str) -> list[str]:
    """Every method with and without ReLiF for two steps; the runs whose trace is not two
    rows of finite losses and weights (and ReLiF's lambda where it is on)."""
    base = config(root, dataset, architecture)
    problem = load_problem(base.data)
    if dataset == "eicu":
        splits = {**problem.splits, "train": short_stays(problem.splits["train"])}
        problem = Problem(problem.name, problem.tasks, splits, problem.model_factory)
    torch.manual_seed(0)
    shared = sharing_one_model(problem, problem.build_model(base.model))
    failed = []
    for name in METHOD_NAMES:
        for relif in (False, True):
            method = {"name": name, "options": METHOD_OPTIONS.get(name, {})}
            sections = {"method": method, "relif": {**RELIF, "squash_constants": SQUASH}}
            run_config = config(root, dataset, architecture, **sections)
            if not relif:
                run_config.relif.enabled = False
            trace = trains(run_config, shared)
            values = [
                v for row in trace for k, v in row.items() if k.startswith(("loss", "weight"))
            ]
            if len(trace) != 2 or not all(math.isfinite(v) for v in values):
                failed.append(f"{name}{'+relif' if relif else ''}")
            elif relif and not all(math.isfinite(row["lambda"]) for row in trace):
                failed.append(f"{name}+relif (lambda)")
    return failed


@pytest.mark.parametrize("architecture", NYUV2_ARCHITECTURES)
@pytest.mark.slow
def test_every_method_with_and_without_relif_trains_on_each_nyuv2_architecture(
    tiny_encoders, nyuv2_tiny, architecture
):
    assert failures_of_every_method(nyuv2_tiny, "nyuv2", architecture) == []


@pytest.mark.parametrize("architecture", LSTM_ARCHITECTURES[1:])
@pytest.mark.slow
def test_every_method_with_and_without_relif_trains_on_each_expert_lstm(eicu_tiny, architecture):
    assert failures_of_every_method(eicu_tiny, "eicu", architecture) == []


def built_model(root: Path, dataset: str, architecture: str) -> tuple[nn.Module, dict]:
    """A model of `architecture` for `dataset` and one training batch of its data."""
    problem = load_problem(config(root, dataset, architecture).data)
    torch.manual_seed(0)
    model = problem.build_model(config(root, dataset, architecture).model).train()
    split = problem.splits["train"]
    if dataset == "eicu":
        split = short_stays(split)
    return model, split.batch(torch.arange(2))


def tasks_reaching(model: nn.Module, batch: dict) -> dict[int, int]:
    """Parameter id -> how many tasks' predictions depend on it (autograd reaches it)."""
    predictions = model(batch).predictions
    parameters = list(model.parameters())
    counts = dict.fromkeys((id(p) for p in parameters), 0)
    for prediction in predictions.values():
        grads = torch.autograd.grad(
            prediction.sum(), parameters, retain_graph=True, allow_unused=True
        )
        for param, grad in zip(parameters, grads, strict=True):
            counts[id(param)] += grad is not None
    return counts


@pytest.mark.parametrize(
    ("dataset", "architecture"),
    [("nyuv2", name) for name in NYUV2_ARCHITECTURES]
    + [("eicu", name) for name in LSTM_ARCHITECTURES],
)
def test_the_shared_parameters_are_those_several_tasks_depend_on(
    tiny_encoders, nyuv2_tiny, eicu_tiny, dataset, architecture
):
    """`shared_parameters()` is exactly the set of parameters that more than one task's
    prediction depends on (the rule of `relif_ray.models.base`), every parameter reaches some
    task, and the last shared layer is shared."""
    root = nyuv2_tiny if dataset == "nyuv2" else eicu_tiny
    model, batch = built_model(root, dataset, architecture)
    counts = tasks_reaching(model, batch)
    shared = {id(p) for p in model.shared_parameters()}
    assert shared == {param for param, count in counts.items() if count > 1}
    assert min(counts.values()) >= 1
    assert {id(p) for p in model.last_shared_parameters()} <= shared
    assert model.architecture == architecture


@pytest.mark.parametrize(
    ("dataset", "architecture"),
    [("nyuv2", name) for name in NYUV2_ARCHITECTURES]
    + [("eicu", name) for name in LSTM_ARCHITECTURES[1:]],
)
@pytest.mark.slow
def test_a_run_resumed_from_its_checkpoint_ends_with_the_same_numbers(
    tiny_encoders, nyuv2_tiny, eicu_tiny, dataset, architecture
):
    """PCGrad + ReLiF (per-task gradients on the shared parameters, the ReLiF term, DSelect-k's
    regularizer): three steps straight, or one step, a checkpoint through a file
    (`weights_only=True`), a new run from it and two more steps: the same trace and weights."""
    root = nyuv2_tiny if dataset == "nyuv2" else eicu_tiny
    values = {"method": {"name": "pcgrad"}, "relif": {**RELIF, "squash_constants": SQUASH}}
    run_config = config(root, dataset, architecture, **values)
    run_config.train.max_steps = 3
    problem = load_problem(run_config.data)
    if dataset == "eicu":
        splits = {**problem.splits, "train": short_stays(problem.splits["train"], count=4)}
        problem = Problem(problem.name, problem.tasks, splits, problem.model_factory)
    straight = TrainingRun(run_config, problem)
    straight.train_steps(3)
    first = TrainingRun(run_config, problem)
    first.train_steps(1)
    file = io.BytesIO()
    torch.save(first.state_dict(), file)
    file.seek(0)
    resumed = TrainingRun(run_config, problem)
    resumed.load_state_dict(torch.load(file, weights_only=True))
    resumed.train_steps(2)
    assert without_nan(resumed.trace) == without_nan(straight.trace)
    for (name, ours), theirs in zip(
        resumed.model.state_dict().items(), straight.model.state_dict().values(), strict=True
    ):
        assert torch.equal(ours, theirs), name


def without_nan(trace: list[dict[str, float]]) -> list[dict[str, float | None]]:
    """A trace with NaN (ReLiF's clipped share where nothing is squashed) as None, which
    compares equal to itself."""
    return [{key: None if math.isnan(v) else v for key, v in row.items()} for row in trace]


@pytest.mark.parametrize("architecture", NYUV2_ARCHITECTURES[1:])
def test_the_representation_gradient_mode_needs_one_encoder_output(
    tiny_encoders, nyuv2_tiny, architecture
):
    """Every architecture but hard sharing gives each task its own head input: the mode is a
    one-line error in the sweep's check before Ray and in the engine; on hard sharing it
    trains (`tests/test_methods.py` tests what it computes)."""
    method = {"name": "pcgrad", "gradient_source": "representation"}
    run_config = config(nyuv2_tiny, "nyuv2", architecture, method=method)
    expected = f"method.gradient_source: 'representation' .*{architecture} gives each task"
    with pytest.raises(UserError, match=expected) as raised:
        check_trial_configs([run_config])
    assert "\n" not in str(raised.value)
    with pytest.raises(UserError, match=expected):
        TrainingRun(run_config)
    hps = TrainingRun(config(nyuv2_tiny, "nyuv2", "hps", method=method))
    hps.train_steps(1)
    assert math.isfinite(hps.trace[0]["loss_seg"])


@pytest.mark.parametrize(
    ("dataset", "model", "message"),
    [
        ("nyuv2", {"architecture": "ltb"}, "model.architecture: unknown architecture 'ltb' "
         "(choices: hps, mtan, cross_stitch, mmoe, cgc, ple, dselect_k)"),
        ("eicu", {"architecture": "mtan"}, "model.architecture: mtan does not apply to the "
         "clinical LSTM (choices there: hps, mmoe, cgc, ple, dselect_k)"),
        ("eicu", {"head": "aspp"}, "model.head: aspp applies to NYUv2's dense heads only"),
        ("nyuv2", {"architecture": "mmoe", "architecture_options": {"experts": 2}},
         "model.architecture_options.experts: mmoe has no option 'experts' (its options: "
         "num_experts)"),
        ("nyuv2", {"architecture_options": {"num_experts": 2}},
         "model.architecture_options.num_experts: hps has no option"),
        ("nyuv2", {"architecture": "cgc", "architecture_options": {"task_experts": 0}},
         "model.architecture_options.task_experts: must be >= 1, got 0"),
        ("nyuv2", {"architecture": "mmoe", "architecture_options": {"num_experts": 1.5}},
         "model.architecture_options.num_experts: expected an integer"),
        ("nyuv2", {"architecture": "dselect_k", "architecture_options": {"num_experts": 1}},
         "model.architecture_options.num_experts: must be >= 2"),
        ("nyuv2", {"architecture": "dselect_k", "architecture_options": {"num_nonzeros": 5}},
         "model.architecture_options.num_nonzeros: must be <= num_experts"),
        ("nyuv2", {"architecture": "dselect_k", "architecture_options": {"gamma": 0}},
         "model.architecture_options.gamma: must be > 0"),
    ],
)  # fmt: skip
def test_a_combination_that_does_not_apply_is_a_one_line_error_before_ray(
    nyuv2_tiny, eicu_tiny, dataset, model, message
):
    """The sweep's check of every trial config (before Ray starts) builds the model on the
    meta device, and says what is wrong in one line."""
    root = nyuv2_tiny if dataset == "nyuv2" else eicu_tiny
    values = {
        "data": {"dataset": dataset, "root": str(root)},
        "model": {"backbone": "resnet18", **model},
    }
    with pytest.raises(UserError) as raised:
        check_trial_configs([ExperimentConfig.from_dict(values)])
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_benchmark_whose_model_has_no_architectures_refuses_another(nyuv2_tiny):
    """A plug-in benchmark's model (a `MultiTaskModel` that knows only itself, hard sharing)
    with `model.architecture: mtan`: a one-line error, not a silent hard-sharing run."""
    problem = load_problem(config(nyuv2_tiny, "nyuv2", "hps").data)
    plain = Problem(problem.name, problem.tasks, problem.splits, dense.DenseMTLModel)
    with pytest.raises(UserError, match="this benchmark's model .DenseMTLModel. is hps, not mtan"):
        plain.build_model(ModelConfig(backbone="resnet18", architecture="mtan"))


def test_relif_architectures_lists_the_registry_with_its_options(capsys):
    """Every architecture once, with the encoders it applies to, its options and defaults as
    `--set model.architecture_options.NAME=VALUE` reads them back, LibMTL's class."""
    from relif_ray import cli
    from relif_ray.cli.architectures import COLUMNS
    from relif_ray.sweep.overrides import yaml_scalar

    assert cli.main(["architectures"]) == 0
    table = capsys.readouterr().out.split("\n\n")[0].splitlines()
    rows = [re.split(r"\s{2,}", line.strip()) for line in table]
    assert rows[0] == list(COLUMNS)
    listed = {row[0]: row for row in rows[1:]}
    assert list(listed) == list(ARCHITECTURES)
    for name, (_, encoders, options, representation, libmtl, citation) in listed.items():
        described = ARCHITECTURES[name]
        assert encoders.split(", ") == list(described.encoders)
        pairs = dict(item.split("=") for item in options.split(", ")) if options != "-" else {}
        assert {key: yaml_scalar(value) for key, value in pairs.items()} == described.options
        assert (representation == "yes") == (name == "hps")
        assert (libmtl, citation) == (described.libmtl, described.citation)


def test_the_readme_architecture_table_is_the_registry():
    """The architecture rows of the README's method table: every architecture once, where it
    applies, its citation and whether the representation-gradient mode applies."""
    from tests.test_method_registry import README_ARCHITECTURES, readme_methods_section

    rows = readme_methods_section().split(README_ARCHITECTURES, 1)[1].splitlines()[1:]
    applies = {"NYUv2": "resnet", "clinical": "lstm"}
    listed = {}
    for line in (row for row in rows if row.startswith("| `")):
        names, kind, citations, representation = (c.strip() for c in line.strip("|").split("|"))
        encoders = tuple(applies[a] for a in kind.removeprefix("architecture: ").split(", "))
        for name in re.findall(r"`(\w+)`", names):
            assert name not in listed, name
            listed[name] = (encoders, representation == "yes")
            assert f"[{ARCHITECTURES[name].citation}](" in citations, name
    assert listed == {name: (arch.encoders, name == "hps") for name, arch in ARCHITECTURES.items()}


@pytest.mark.parametrize("architecture", NYUV2_ARCHITECTURES[1:])
def test_each_architectures_step_can_be_a_cuda_graph(
    tiny_encoders, nyuv2_tiny, monkeypatch, architecture
):
    """What a CUDA graph of the whole step needs (`relif_ray.cuda_graph`), checked on the CPU:
    ERM + ReLiF steps never wait for the device (nothing read back, no data-dependent shape),
    and the static-index step of the graph, run without capturing, gives the eager step's
    trace and weights bit for bit (DSelect-k's regularizer included)."""
    from tests.host_sync import no_host_sync

    values = {"relif": {**RELIF, "squash_constants": SQUASH}}

    def graph_ready() -> TrainingRun:  # a graphed trial's data and optimiser, on the CPU
        run_config = config(nyuv2_tiny, "nyuv2", architecture, **values)
        run_config.train.data_on_device = True
        run = TrainingRun(run_config)
        run.optimizer = run._build_optimizer(graph=True)
        return run

    eager = graph_ready()
    eager.train_steps(1)
    with no_host_sync(monkeypatch):
        eager._backward(eager._train_batch())
    eager = graph_ready()
    eager.train_steps(2)
    graphed = graph_ready()
    graphed.graphed = graphed.graphed_step(capture=False)
    graphed.train_steps(2)
    assert without_nan(graphed.trace) == without_nan(eager.trace)
    for ours, theirs in zip(graphed.model.parameters(), eager.model.parameters(), strict=True):
        assert torch.equal(ours, theirs)
