"""One training run without Ray: determinism, exact resume, learning, errors."""

import io

import pytest
import torch

from relif_ray.config import ExperimentConfig
from relif_ray.engine import TrainingRun
from relif_ray.errors import UserError
from relif_ray.schedule import epoch_permutation
from tests.conftest import tiny_config, tiny_resnets


def _run(root, **train) -> TrainingRun:
    return TrainingRun(ExperimentConfig.from_dict(tiny_config(root, **train)))


def _tiny_run(root, **train) -> TrainingRun:
    """`_run` on the tiny ResNet encoder (`tests.conftest.tiny_resnet`), for claims
    about steps, budgets and state that hold for any model: ResNet-18's 11M parameters would
    cost each step's gradients and Adam step."""
    with tiny_resnets():
        return _run(root, **train)


@pytest.fixture(scope="module")
def two_epochs(nyuv2_dir) -> TrainingRun:
    """`tiny_config`'s whole run (ResNet-18, 2 epochs), which the determinism and resume
    tests compare against (they read it, never train it further)."""
    run = _run(nyuv2_dir)
    while not run.finished:
        run.train_epoch()
    return run


def _roundtrip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_same_seed_gives_identical_numbers(nyuv2_dir, two_epochs):
    first, second = two_epochs, _run(nyuv2_dir)
    second.train_epoch()
    second.train_epoch()
    assert len(first.trace) == 8 and first.trace == second.trace
    assert first.evaluate("val").metrics == second.evaluate("val").metrics


def test_no_step_reads_memory_it_never_wrote(nyuv2_dir, monkeypatch):
    """The engine switches off torch's NaN fill of new tensors (`use_deterministic_cpu_kernels`):
    with the fill on, a kernel reading unwritten memory would read NaN, with it off whatever
    was there; ERM+ReLiF gives the same numbers both ways."""
    import torch.utils.deterministic as deterministic

    config = {**tiny_config(nyuv2_dir), "relif": {"enabled": True, "squash": "running"}}
    results = []
    for fill in (True, False):
        run = TrainingRun(ExperimentConfig.from_dict(config))
        assert deterministic.fill_uninitialized_memory is False  # the engine's setting
        monkeypatch.setattr(deterministic, "fill_uninitialized_memory", fill)
        assert torch.empty(4).isnan().all() or not fill  # the fill is really on
        run.train_epoch()
        results.append((run.trace, run.evaluate("val").metrics))
    assert results[0] == results[1]


def test_different_seeds_differ(nyuv2_dir):
    config = tiny_config(nyuv2_dir)
    with tiny_resnets():
        other = TrainingRun(ExperimentConfig.from_dict({**config, "seed": 1}))
        base = TrainingRun(ExperimentConfig.from_dict(config))
    base.train_steps(2)
    other.train_steps(2)
    assert base.trace != other.trace


def test_resume_mid_epoch_matches_uninterrupted_run(nyuv2_dir, two_epochs):
    uninterrupted = two_epochs
    interrupted = _run(nyuv2_dir)
    interrupted.train_steps(uninterrupted.steps_per_epoch + 1)  # stop inside epoch 2
    state = _roundtrip(interrupted.state_dict())
    torch.manual_seed(123)  # the resumed process has a different global RNG
    resumed = _run(nyuv2_dir)
    resumed.load_state_dict(state)
    while not resumed.finished:
        resumed.train_epoch()
    assert resumed.step == uninterrupted.step
    assert resumed.trace == uninterrupted.trace
    assert resumed.evaluate("val").metrics == uninterrupted.evaluate("val").metrics


def test_two_runs_loaded_from_one_in_memory_state_train_alike(nyuv2_dir):
    """Loading copies the optimiser's state: training the first loaded run leaves the state it
    came from as it was, so a second run loaded from it trains the same steps."""
    source = _tiny_run(nyuv2_dir)
    source.train_steps(2)
    state = source.state_dict()
    first, second = _tiny_run(nyuv2_dir), _tiny_run(nyuv2_dir)
    first.load_state_dict(state)
    first.train_steps(2)
    second.load_state_dict(state)
    second.train_steps(2)
    assert first.trace == second.trace


def test_batch_order_depends_only_on_seed_and_epoch():
    assert torch.equal(epoch_permutation(10, 3, 1), epoch_permutation(10, 3, 1))
    assert not torch.equal(epoch_permutation(10, 3, 1), epoch_permutation(10, 3, 2))
    assert sorted(epoch_permutation(10, 3, 1).tolist()) == list(range(10))


def test_step_budget_caps_training(nyuv2_dir):
    run = _tiny_run(nyuv2_dir, epochs=5, max_steps=3)
    while not run.finished:
        run.train_epoch()
    assert run.step == 3 and len(run.trace) == 3


def test_evaluation_outputs_one_score_per_task_and_example(nyuv2_dir):
    run = _run(nyuv2_dir)
    result = run.evaluate("val")
    n_val = len(run.problem.splits["val"])
    assert len(result.scores) == 3 * n_val
    assert set(result.scores["task"]) == {"seg", "depth", "normal"}
    assert result.representations.shape == (n_val, 512)
    assert sorted(result.example_ids.tolist()) == list(range(n_val))
    assert 0 <= result.metrics["worst"] <= result.metrics["macro"] <= 1


@pytest.mark.slow
def test_erm_learns_segmentation_well_above_chance(nyuv2_dir):
    """After a short ERM run, mIoU clearly beats predicting from the class prior."""
    run = _run(nyuv2_dir, epochs=12, lr=2e-3)
    before = run.evaluate("val").metrics
    while not run.finished:
        run.train_epoch()
    after = run.evaluate("val").metrics
    labels = run.problem.splits["val"].tensors["seg"]
    counts = torch.bincount(labels[labels >= 0].flatten(), minlength=13).double()
    prior = counts / counts.sum()
    # Expected IoU of a random guess drawn from the class prior: p^2 / (2p - p^2) per class.
    chance_miou = float((prior**2 / (2 * prior - prior**2)).nan_to_num()[counts > 0].mean())
    assert after["seg_miou"] > 2 * chance_miou
    assert after["seg_miou"] > before["seg_miou"]
    first, last = run.trace[0], run.trace[-1]
    assert last["loss_seg"] < first["loss_seg"] and last["loss_depth"] < first["loss_depth"]


def test_missing_data_directory_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does-not-exist"):
        _run(tmp_path / "does-not-exist")


def test_cuda_request_without_gpu_is_a_user_error(nyuv2_dir):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    config = {**tiny_config(nyuv2_dir), "device": "cuda"}
    with pytest.raises(UserError, match="device"):
        TrainingRun(ExperimentConfig.from_dict(config))


def test_max_steps_alone_trains_exactly_that_many_steps_across_epochs(nyuv2_dir):
    run = _tiny_run(nyuv2_dir, epochs=None, max_steps=9)
    assert run.steps_per_epoch == 4  # 24 examples, batch 6: steps 8 and 9 fall in epoch 3
    epochs = 0
    while not run.finished:
        run.train_epoch()
        epochs += 1
    assert run.step == 9 and len(run.trace) == 9 and epochs == 3
    assert [row["step"] for row in run.trace] == list(range(9))


@pytest.mark.parametrize(
    ("epochs", "max_steps", "steps"), [(1, 9, 4), (3, 9, 9), (2, None, 8), (None, 1, 1)]
)
def test_the_smaller_budget_wins(nyuv2_dir, epochs, max_steps, steps):
    run = _run(nyuv2_dir, epochs=epochs, max_steps=max_steps)
    assert run.total_steps == steps


def test_resume_inside_a_steps_only_budget_ends_at_exactly_that_step(nyuv2_dir):
    uninterrupted = _tiny_run(nyuv2_dir, epochs=None, max_steps=6)
    while not uninterrupted.finished:
        uninterrupted.train_epoch()
    interrupted = _tiny_run(nyuv2_dir, epochs=None, max_steps=6)
    interrupted.train_steps(5)  # inside the second, partial epoch
    state = _roundtrip(interrupted.state_dict())
    resumed = _tiny_run(nyuv2_dir, epochs=None, max_steps=6)
    resumed.load_state_dict(state)
    while not resumed.finished:
        resumed.train_epoch()
    assert resumed.step == uninterrupted.step == 6
    assert resumed.trace == uninterrupted.trace
