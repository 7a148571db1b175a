"""The clinical LSTM: packing makes outputs independent of padding; training lowers the loss."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from relif_ray.config import ModelConfig
from relif_ray.data.mimic3 import NUM_FEATURES
from relif_ray.data.synthetic_mimic3 import write_synthetic_mimic3
from relif_ray.errors import UserError
from relif_ray.models.clinical import ClinicalMTLModel, Stays, packing_plan
from relif_ray.problems.mimic3 import HEADS, load_mimic3

CONFIG = ModelConfig(hidden_size=8, num_layers=2, dropout=0.3)


def _model(seed: int = 0) -> ClinicalMTLModel:
    torch.manual_seed(seed)
    return ClinicalMTLModel(CONFIG, input_size=NUM_FEATURES, heads=HEADS).eval()


def _batch(inputs: torch.Tensor, lengths: list[int]) -> dict[str, torch.Tensor]:
    return {"input": inputs, "lengths": torch.tensor(lengths)}


def test_output_shapes_follow_the_head_readouts() -> None:
    output = _model()(_batch(torch.randn(3, 50, NUM_FEATURES), [50, 12, 49]))
    assert output.predictions["mortality"].shape == (3,)
    assert output.predictions["decompensation"].shape == (3, 50)
    assert output.predictions["length_of_stay"].shape == (3, 50, 10)
    assert output.predictions["phenotype"].shape == (3, 25)
    assert output.representation.shape == (3, CONFIG.hidden_size)


def test_padding_and_batch_mates_do_not_change_a_stays_outputs() -> None:
    model = _model()
    short = torch.randn(1, 20, NUM_FEATURES)
    alone = model(_batch(short, [20]))
    padded = torch.cat([short, torch.full((1, 40, NUM_FEATURES), 7.0)], dim=1)
    together = model(_batch(torch.cat([padded, torch.randn(1, 60, NUM_FEATURES)]), [20, 60]))
    for name in ("mortality", "phenotype"):
        assert torch.allclose(alone.predictions[name][0], together.predictions[name][0], atol=1e-6)
    for name in ("decompensation", "length_of_stay"):
        assert torch.allclose(
            alone.predictions[name][0], together.predictions[name][0, :20], atol=1e-6
        )
    assert torch.allclose(alone.representation[0], together.representation[0], atol=1e-6)


def test_representation_is_the_last_valid_top_layer_state() -> None:
    model = _model()
    inputs = torch.randn(2, 30, NUM_FEATURES)
    output = model(_batch(inputs, [30, 11]))
    states, _ = model.lstm(inputs[1:, :11])
    assert torch.allclose(output.representation[1], states[0, -1], atol=1e-6)


def test_mortality_reads_hour_48_and_phenotype_the_last_step() -> None:
    model = _model()
    inputs = torch.randn(1, 60, NUM_FEATURES)
    states, _ = model.lstm(inputs)
    output = model(_batch(inputs, [60]))
    expected_mortality = model.heads["mortality"](states[0, 47]).squeeze(-1)
    expected_phenotype = model.heads["phenotype"](states[0, 59])
    assert torch.allclose(output.predictions["mortality"][0], expected_mortality, atol=1e-6)
    assert torch.allclose(output.predictions["phenotype"][0], expected_phenotype, atol=1e-6)


def test_shared_and_last_shared_parameters() -> None:
    model = _model()
    shared = {id(p) for p in model.shared_parameters()}
    assert shared == {id(p) for p in model.lstm.parameters()}
    last = model.last_shared_parameters()
    assert len(last) == 4 and {id(p) for p in last} <= shared
    assert all(p.shape[-1] == CONFIG.hidden_size for p in last[:2])
    assert {id(p) for p in model.heads.parameters()}.isdisjoint(shared)


def test_a_few_training_steps_reduce_the_loss(tmp_path: Path) -> None:
    problem = load_mimic3(str(write_synthetic_mimic3(tmp_path / "m", patients=8, seed=0)))
    torch.manual_seed(0)
    model = problem.build_model(ModelConfig(hidden_size=16, num_layers=2, dropout=0.0))
    split = problem.splits["train"]
    batch = split.batch(torch.arange(len(split)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    def total_loss() -> torch.Tensor:
        output = model(batch)
        return sum(
            task.loss(output.predictions[task.name], batch[task.name]) for task in problem.tasks
        )

    first = float(total_loss().detach())
    for _ in range(30):
        optimizer.zero_grad()
        loss = total_loss()
        loss.backward()
        optimizer.step()
    assert float(total_loss().detach()) < 0.8 * first


@pytest.mark.parametrize("num_layers", [1, 3])
def test_layer_count_comes_from_the_config(num_layers: int) -> None:
    config = ModelConfig(hidden_size=4, num_layers=num_layers, dropout=0.3)
    model = ClinicalMTLModel(config, input_size=NUM_FEATURES, heads=HEADS)
    assert model.lstm.num_layers == num_layers
    assert model.lstm.dropout == (0.3 if num_layers > 1 else 0.0)


def test_pretrained_weights_are_refused_for_the_lstm() -> None:
    config = ModelConfig(hidden_size=4, pretrained="imagenet")
    with pytest.raises(UserError, match="model.pretrained: the clinical LSTM has no pretrained"):
        ClinicalMTLModel(config, NUM_FEATURES, HEADS)


def test_packing_is_torchs_pack_and_pad_bit_for_bit() -> None:
    """The one-gather packing and one-scatter unpacking give exactly the packed data and batch
    sizes of `pack_padded_sequence` (stays sorted by length, ties in batch order) and the
    outputs, last states and gradients of `pad_packed_sequence` put back in batch order, on a
    batch padded beyond its longest stay, in training mode (dropout between the layers)."""
    lengths = torch.tensor([5, 9, 3, 9, 1, 7])
    inputs = torch.randn(6, 11, NUM_FEATURES, generator=torch.Generator().manual_seed(0))
    order = torch.argsort(lengths, descending=True, stable=True)
    reference = pack_padded_sequence(inputs[order], lengths[order], batch_first=True)
    plan = packing_plan(lengths, steps=11)
    packed_rows = plan.indices[: plan.packed]
    assert torch.equal(inputs.reshape(6 * 11, -1)[packed_rows], reference.data)
    assert torch.equal(plan.batch_sizes, reference.batch_sizes)
    assert plan.indices[plan.packed + 6 :].tolist() == [4, 8, 2, 8, 0, 6]  # each last step

    model = _model().train()
    upstream = torch.randn(6, 11, CONFIG.hidden_size)
    results = []
    for packing in ("ours", "torch's"):
        model.zero_grad()
        torch.manual_seed(1)
        if packing == "ours":
            outputs, last_hidden = Stays(inputs, lengths).run(model.lstm, inputs)
        else:
            packed, (last_hidden, _) = model.lstm(reference)
            outputs, _ = pad_packed_sequence(packed, batch_first=True, total_length=11)
            restore = torch.argsort(order)
            outputs, last_hidden = outputs[restore], last_hidden[:, restore]
        ((outputs * upstream).sum() + last_hidden[-1].sum()).backward()
        results.append((outputs, last_hidden, [p.grad.clone() for p in model.lstm.parameters()]))
    (ours, ours_last, ours_grads), (theirs, theirs_last, theirs_grads) = results
    assert torch.equal(ours, theirs) and torch.equal(ours_last, theirs_last)
    assert all(torch.equal(a, b) for a, b in zip(ours_grads, theirs_grads, strict=True))
    with pytest.raises(ValueError, match="at least one time step"):
        packing_plan(torch.tensor([3, 0]), steps=3)
