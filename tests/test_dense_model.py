"""The dense multi-task model: shapes, output stride, parameter groups, initial weights."""

import urllib.error

import pytest
import torch
import torchvision

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


ENCODER_LAYERS = ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4"]


def _torchvision_key(encoder_key: str) -> str:
    """`4.0.conv1.weight` of our encoder is `layer1.0.conv1.weight` of the torchvision ResNet."""
    index, rest = encoder_key.split(".", 1)
    return f"{ENCODER_LAYERS[int(index)]}.{rest}"


def _saved_resnet18(path, drop=()) -> dict:
    torch.manual_seed(7)
    state = torchvision.models.resnet18().state_dict()
    state = {key: value for key, value in state.items() if not key.startswith(drop)}
    torch.save(state, path)
    return state


def _assert_encoder_holds(model: DenseMTLModel, state: dict) -> None:
    encoder_state = model.encoder.state_dict()
    assert len(encoder_state) == len([key for key in state if not key.startswith("fc.")])
    for key, value in encoder_state.items():
        assert torch.equal(value, state[_torchvision_key(key)]), key


@pytest.mark.parametrize("drop", [(), ("fc.",)], ids=["with-fc", "without-fc"])
def test_a_local_state_dict_file_initialises_the_backbone(tmp_path, drop):
    state = _saved_resnet18(tmp_path / "resnet18.pt", drop)
    config = ModelConfig(
        backbone="resnet18", head_channels=8, pretrained=str(tmp_path / "resnet18.pt")
    )
    _assert_encoder_holds(DenseMTLModel(config), state)


def _bad_file(tmp_path, kind: str) -> str:
    path = tmp_path / f"{kind}.pt"
    if kind == "garbage":
        path.write_bytes(b"not a checkpoint")
    elif kind == "list":
        torch.save([torch.zeros(1)], path)
    elif kind == "resnet34":
        torch.save(torchvision.models.resnet34().state_dict(), path)
    elif kind == "missing-key":
        _saved_resnet18(path, drop=("layer4.1.bn2.weight",))
    elif kind == "wrong-shape":
        state = _saved_resnet18(path)
        state["conv1.weight"] = torch.zeros(64, 3, 3, 3)
        torch.save(state, path)
    return str(path)


@pytest.mark.parametrize(
    ("kind", "fragment"),
    [
        ("absent", "no such file"),
        ("garbage", "is not a torch state_dict file"),
        ("list", "holds a list, not a state_dict"),
        ("resnet34", "has a tensor 'layer1.2.bn1.bias' that resnet18 does not have"),
        ("missing-key", "lacks 1 tensors of resnet18, e.g. 'layer4.1.bn2.weight'"),
        ("wrong-shape", "'conv1.weight' has shape (64, 3, 3, 3), resnet18 needs (64, 3, 7, 7)"),
    ],
)
def test_unusable_weight_files_are_one_line_errors(tmp_path, kind, fragment):
    path = _bad_file(tmp_path, kind)
    with pytest.raises(UserError, match="model.pretrained") as error:
        DenseMTLModel(ModelConfig(backbone="resnet18", head_channels=8, pretrained=path))
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_imagenet_weights_come_from_torchvisions_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "hub"))
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    state = _saved_resnet18(tmp_path / "hub" / "checkpoints" / "resnet18-f37072fd.pth")
    model = DenseMTLModel(ModelConfig(backbone="resnet18", head_channels=8, pretrained="imagenet"))
    _assert_encoder_holds(model, state)


def test_uncached_imagenet_weights_offline_say_where_to_put_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "hub"))

    def offline(url, *args, **kwargs):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    with pytest.raises(UserError) as error:
        DenseMTLModel(ModelConfig(backbone="resnet18", pretrained="imagenet"))
    target = tmp_path / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    message = str(error.value)
    assert message.startswith("config field model.pretrained: ImageNet weights of resnet18")
    assert f"put https://download.pytorch.org/models/resnet18-f37072fd.pth at {target}" in message
