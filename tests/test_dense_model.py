"""The dense multi-task model: shapes, output stride, parameter groups, pretrained errors."""

import pytest
import torch

from relif_ray.config import ModelConfig
from relif_ray.errors import UserError
from relif_ray.models.dense import DenseMTLModel


@pytest.fixture(scope="module")
def model() -> DenseMTLModel:
    torch.manual_seed(0)
    return DenseMTLModel(ModelConfig(backbone="resnet18", head_channels=8)).eval()


def test_heads_predict_at_input_size_with_unit_normals(model):
    output = model({"input": torch.rand(2, 3, 32, 40)})
    assert output.predictions["seg"].shape == (2, 13, 32, 40)
    assert output.predictions["depth"].shape == (2, 1, 32, 40)
    norms = output.predictions["normal"].norm(dim=1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)
    assert output.representation.shape == (2, 512)


def test_encoder_runs_at_output_stride_8(model):
    output = model({"input": torch.rand(1, 3, 64, 80)})
    assert output.features["depth"].shape[-2:] == (8, 10)
    assert output.features["normal"].shape[1] == 8


def test_parameter_groups(model):
    shared = {id(p) for p in model.shared_parameters()}
    heads = {id(p) for p in model.heads.parameters()}
    last = {id(p) for p in model.last_shared_parameters()}
    assert shared.isdisjoint(heads)
    assert last and last <= shared
    assert shared | heads == {id(p) for p in model.parameters()}


def test_unknown_backbone_is_a_user_error():
    with pytest.raises(UserError, match="model.backbone"):
        DenseMTLModel(ModelConfig(backbone="vgg16"))
