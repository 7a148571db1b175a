"""Every architecture against LibMTL 1.1.5's architecture of the same name, executed.

LibMTL's architecture is built on our model's own encoders (its `encoder_class` hands out our
encoders and experts in the order it calls it: `relif_ray.testing.libmtl_reference`), so the two
share those weights, and the parameters LibMTL creates itself (MTAN's attention, the gates,
the cross-stitch units, DSelect-k's logits) get our values. With identity decoders LibMTL's
forward returns each task's head input, which our trunk returns too; the same input then goes
through both, in training mode (batch statistics) and in evaluation mode (running ones).

Tolerance: `TOLERANCE`, in float64 (both models are converted): hard sharing, MTAN and
Cross-stitch run the same operations in the same order; the expert mixtures sum the experts in
another order than LibMTL's einsum, which moves the last bits (in float32 up to 1e-5 after
PLE's five levels of mixtures and batch normalizations).

Where we differ on purpose (docs/architectures.md), the tests below state it:
- Cross-stitch: our units have one row per task (the paper's K x K unit), LibMTL's one row
  shared by all tasks; equal when every task's row is LibMTL's (as here).
- DSelect-k: LibMTL's smooth step ignores `kgamma` (equal at the default gamma = 1) and it
  regularizes only the last task's selectors; ours regularizes every task's. Its experts'
  binary codes are the strings '0'/'1' cast to bool, which NumPy 2 makes all True (every
  expert weighed alike); the comparison gives it the codes (`test_libmtls_dselect_k_codes`).
- The shared parameters of MTAN and Cross-stitch (`assert_shared_parameters`).
- On the LSTM, gates read each time step's input; LibMTL's read the flattened input, which is
  the same for stays of one step (the only length compared).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from relif_ray.config import ModelConfig
from relif_ray.models.architectures import (
    ARCHITECTURES,
    LSTM,
    build_clinical_model,
    build_dense_model,
)
from relif_ray.models.clinical import HeadSpec, Stays
from relif_ray.models.dense import TASK_CHANNELS
from relif_ray.testing import libmtl_reference

TOLERANCE = {"rtol": 1e-9, "atol": 1e-9}
"""How far our forward outputs may be from LibMTL's, both in float64 (rounding of another
summation order)."""
IMAGE = (3, 24, 32)
SMALL_OPTIONS = {
    "mmoe": {"num_experts": 3},
    "cgc": {"num_experts": 2, "task_experts": 1},
    "ple": {"num_experts": 1, "task_experts": 1},
    "dselect_k": {"num_experts": 3, "num_nonzeros": 2},
}
"""Expert counts of the comparisons: small, with DSelect-k at a count that is not a power of
two (its second regularizer term)."""
DENSE = list(ARCHITECTURES)
EXPERTS_ON_LSTM = [name for name, arch in ARCHITECTURES.items() if LSTM in arch.encoders][1:]


@pytest.fixture(scope="module")
def libmtl():
    """LibMTL 1.1.5 as an executable reference (`relif_ray.testing.libmtl_reference`)."""
    return libmtl_reference


def identity_decoders(tasks) -> dict[str, nn.Module]:
    return {task: nn.Identity() for task in tasks}


def randomized(model: nn.Module, seed: int) -> nn.Module:
    """Random running statistics, so that evaluation mode compares something."""
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.copy_(torch.randn(module.num_features, generator=generator))
            module.running_var.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
    return model


def dense_model(architecture: str, backbone: str = "resnet18", **config) -> nn.Module:
    torch.manual_seed(0)
    options = SMALL_OPTIONS.get(architecture, {})
    model_config = ModelConfig(
        **{"head_channels": 8, **config},
        backbone=backbone,
        architecture=architecture,
        architecture_options=options,
    )
    return randomized(build_dense_model(model_config, IMAGE), seed=1)


def trunk_outputs(model: nn.Module, image: torch.Tensor) -> dict[str, torch.Tensor]:
    if model.architecture == "hps":
        return dict.fromkeys(TASK_CHANNELS, model.encoder(image))
    return model.trunk(image).per_task


def assert_same(ours: dict, theirs: dict) -> None:
    assert list(ours) == list(theirs)
    for task in ours:
        torch.testing.assert_close(ours[task], theirs[task], **TOLERANCE)


def libmtl_in_float64(libmtl, model: nn.Module, decoders: dict, input_shape: tuple) -> nn.Module:
    """LibMTL's architecture on `model`, both in float64. LibMTL's DSelect-k gets our binary
    codes (`test_libmtls_dselect_k_codes`)."""
    theirs = libmtl.libmtl_architecture(model, decoders, input_shape)
    if model.architecture == "dselect_k":
        theirs._binary_codes = model.trunk.codes[None]
    model.double()
    return theirs.double()


def compare_in_both_modes(ours, theirs, run_ours, run_theirs) -> None:
    """Training mode (LibMTL's DSelect-k then backpropagates its regularizer: with
    gradients), then evaluation mode."""
    for training in (True, False):
        ours.train(training)
        theirs.train(training)
        assert_same(run_ours(), run_theirs())


@pytest.mark.parametrize("architecture", DENSE)
@pytest.mark.slow
def test_each_architecture_equals_libmtls_on_the_resnet(libmtl, architecture):
    """The forward outputs, and the shared parameters (`assert_shared_parameters`)."""
    model = dense_model(architecture)
    if architecture == "cross_stitch":  # LibMTL's unit: one row per level for every task
        with torch.no_grad():
            for level, unit in enumerate(model.trunk.units):
                for row in unit.values():
                    row.copy_(torch.linspace(0.5, 1.5, len(row)) * (level + 1))
    theirs = libmtl_in_float64(libmtl, model, identity_decoders(TASK_CHANNELS), IMAGE)
    image = torch.randn(2, *IMAGE, generator=torch.Generator().manual_seed(2)).double()
    compare_in_both_modes(model, theirs, lambda: trunk_outputs(model, image), lambda: theirs(image))
    assert_shared_parameters(model, theirs)


def assert_shared_parameters(model: nn.Module, theirs: nn.Module) -> None:
    """Ours are every parameter more than one task's head input depends on
    (`tests/test_architectures.py`); LibMTL's `get_share_params` are the same for hard
    sharing and the expert architectures. MTAN: LibMTL leaves out the attention path's
    residual blocks, which every task's features pass through. Cross-stitch: LibMTL's are the
    whole encoder, with each column's layer4, which only its own task reads (and its
    `cross_unit`, whose fourth row nothing reads)."""
    ours = {id(p) for p in model.shared_parameters()}
    theirs_ids = {id(p) for p in theirs.get_share_params()}
    if model.architecture == "mtan":
        blocks = {id(p) for p in model.trunk.block_attention.parameters()}
        assert ours - theirs_ids == blocks and theirs_ids <= ours
    elif model.architecture == "cross_stitch":
        last_layers = {id(p) for p in model.trunk.stages[4].parameters()}
        ours_modules = ours - {id(p) for p in model.trunk.units.parameters()}
        unit = {id(theirs.encoder.cross_unit)}
        assert theirs_ids - ours_modules == last_layers | unit
    else:
        assert ours == theirs_ids


def test_mtan_equals_libmtls_on_a_bottleneck_resnet(libmtl):
    """ResNet-50's bottleneck blocks: attention widths, and the attention path's residual
    blocks of four times fewer planes than channels."""
    model = dense_model("mtan", backbone="resnet50")
    theirs = libmtl_in_float64(libmtl, model, identity_decoders(TASK_CHANNELS), IMAGE)
    image = torch.randn(2, *IMAGE, generator=torch.Generator().manual_seed(3)).double()
    compare_in_both_modes(model, theirs, lambda: trunk_outputs(model, image), lambda: theirs(image))
    assert model.trunk.block_attention[0].conv3.out_channels == 512


CLINICAL_HEADS = {
    "mortality": HeadSpec(out_features=1, readout="last_step"),
    "length_of_stay": HeadSpec(out_features=3, readout="every_step"),
}


def clinical_model(architecture: str, num_layers: int = 2) -> nn.Module:
    torch.manual_seed(0)
    config = ModelConfig(
        hidden_size=6,
        num_layers=num_layers,
        dropout=0.0,
        architecture=architecture,
        architecture_options=SMALL_OPTIONS[architecture],
    )
    return build_clinical_model(config, input_size=5, heads=CLINICAL_HEADS)


@pytest.mark.parametrize("architecture", EXPERTS_ON_LSTM)
def test_each_expert_architecture_equals_libmtls_on_stays_of_one_step(libmtl, architecture):
    """LibMTL's gates read the flattened input, ours each step's: one step makes them one.
    PLE's LibMTL builds five levels (a ResNet's stages): our LSTM has five layers there."""
    model = clinical_model(architecture, num_layers=5 if architecture == "ple" else 2)
    theirs = libmtl_in_float64(libmtl, model, identity_decoders(CLINICAL_HEADS), (1, 5))
    inputs = torch.randn(4, 1, 5, generator=torch.Generator().manual_seed(4)).double()
    stays = Stays(inputs, torch.ones(4, dtype=torch.long))
    compare_in_both_modes(
        model, theirs, lambda: model.trunk(inputs, stays).per_task, lambda: theirs(inputs)
    )


def test_lstm_gates_weigh_the_experts_at_every_step():
    """Over stays of several steps, task t's head input at step s is sum_e g_t(x_s)_e h_e,s:
    each expert LSTM's output at s weighted by the gate of that step's input."""
    model = clinical_model("mmoe").eval().double()
    inputs = torch.randn(3, 7, 5, generator=torch.Generator().manual_seed(5)).double()
    lengths = torch.tensor([7, 2, 5])
    per_task = model.trunk(inputs, Stays(inputs, lengths)).per_task
    for b, length in enumerate(lengths.tolist()):
        outputs = torch.stack([e(inputs[b : b + 1, :length])[0][0] for e in model.trunk.experts])
        for task, gate in model.trunk.gates.items():
            weights = gate(inputs[b, :length])  # (steps, E)
            expected = (weights.T[:, :, None] * outputs).sum(0)
            torch.testing.assert_close(per_task[task][b, :length], expected, **TOLERANCE)
            assert per_task[task][b, length:].abs().max() == 0 if length < 7 else True


def libmtl_deeplab_head(in_channels: int, out_channels: int, size: tuple[int, int]) -> nn.Module:
    """LibMTL's `DeepLabHead` (`LibMTL/model/decoder/DeepLabHead.py` at commit 9c68e54, before
    that `examples/nyu/aspp.py`): DeepLabV3's head as torchvision's `DeepLabHead` is (ASPP at
    dilations 12/24/36 and 256 channels with image pooling, conv3x3-BN-ReLU, conv1x1), then
    a bilinear resize to the image with align_corners=True."""
    from torchvision.models.segmentation.deeplabv3 import DeepLabHead

    class Resized(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = DeepLabHead(in_channels, out_channels)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.interpolate(
                self.head(x), size, mode="bilinear", align_corners=True
            )

    return Resized()


@pytest.mark.parametrize("architecture", ["hps", "mtan"])
def test_the_aspp_head_equals_libmtls_deeplab_head(libmtl, architecture):
    """Whole models with `model.head: aspp` (width 256, LibMTL's) against LibMTL's
    architecture with its DeepLab heads, our head weights copied into them: the predictions
    (LibMTL normalizes normals in its loss and metric, we in the model)."""
    model = dense_model(architecture, head="aspp", head_channels=256)
    decoders = {
        task: libmtl_deeplab_head(512, out, IMAGE[1:]) for task, out in TASK_CHANNELS.items()
    }
    for task, decoder in decoders.items():
        ours = model.heads[task]
        predict = {f"4.{key}": value for key, value in ours.predict.state_dict().items()}
        decoder.head.load_state_dict({**ours.decoder.state_dict(), **predict})
    theirs = libmtl_in_float64(libmtl, model, decoders, IMAGE)
    image = torch.randn(2, *IMAGE, generator=torch.Generator().manual_seed(6)).double()

    def ours_predictions() -> dict:
        return model({"input": image}).predictions

    def theirs_predictions() -> dict:
        out = theirs(image)
        return {**out, "normal": nn.functional.normalize(out["normal"], dim=1)}

    model.eval()  # ASPP's dropout: compared without it
    theirs.eval()
    with torch.no_grad():
        assert_same(ours_predictions(), theirs_predictions())


def test_dselect_k_regularizes_every_tasks_gate_where_libmtl_regularizes_the_last(libmtl):
    """LibMTL's forward backpropagates its regularizer of the LAST task's selectors at once;
    the gradient it leaves on that task's selector logits is the gradient of our regularizer
    there, and ours also reaches the other tasks' (its loss term, `auxiliary_loss`)."""
    model = dense_model("dselect_k").train()
    theirs = libmtl_in_float64(libmtl, model, identity_decoders(TASK_CHANNELS), IMAGE).train()
    image = torch.randn(2, *IMAGE, generator=torch.Generator().manual_seed(7)).double()
    theirs(image)  # calls backward on its regularizer
    penalty = model.trunk(image).auxiliary_loss
    tasks = list(TASK_CHANNELS)
    ours = {
        task: torch.autograd.grad(penalty, list(model.trunk.selector_logits[task].parameters()))
        for task in tasks
    }
    theirs_grads = [p.grad for p in theirs._z_logits[tasks[-1]].parameters()]
    for mine, reference in zip(ours[tasks[-1]], theirs_grads, strict=True):
        torch.testing.assert_close(mine, reference, **TOLERANCE)
    assert all(p.grad is None for t in tasks[:-1] for p in theirs._z_logits[t].parameters())
    assert all(grad.abs().sum() > 0 for t in tasks[:-1] for grad in ours[t])
    assert model.eval().trunk(image).auxiliary_loss is None  # training only, as LibMTL's


def test_libmtls_dselect_k_codes(libmtl):
    """LibMTL 1.1.5 makes expert e's binary code by casting the characters of
    `np.binary_repr(e)` to bool; under NumPy 2 every non-empty string is True, so all its
    codes are all ones and every expert gets the same weight from a selector. Ours are the
    binary codes, most significant bit first (the comparisons give LibMTL ours)."""
    model = dense_model("dselect_k")
    theirs = libmtl.libmtl_architecture(model, identity_decoders(TASK_CHANNELS), IMAGE)
    assert model.trunk.codes.tolist() == [[False, False], [False, True], [True, False]]
    if int(np.__version__.split(".")[0]) >= 2:
        assert theirs._binary_codes.all()
