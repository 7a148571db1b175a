import pytest

from relif_ray.config import ExperimentConfig
from relif_ray.errors import UserError
from relif_ray.problems import load_problem


def test_round_trip_preserves_every_field():
    config = ExperimentConfig.from_dict({"train": {"lr": 3e-4}, "relif": {"enabled": True}})
    assert ExperimentConfig.from_dict(config.to_dict()) == config
    assert config.train.lr == 3e-4 and config.relif.enabled


def test_int_is_accepted_where_float_expected():
    assert ExperimentConfig.from_dict({"train": {"lr": 1}}).train.lr == 1.0


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"train": {"lrr": 1}}, "train.lrr: unknown field"),
        ({"train": {"lr": -1.0}}, "train.lr: must be > 0"),
        ({"train": {"batch_size": "8"}}, "train.batch_size: expected int"),
        ({"train": {"optimizer": "lion"}}, "train.optimizer: must be one of"),
        ({"relif": {"enabled": 1}}, "relif.enabled: expected true/false"),
        ({"relif": {"lambda0": 2.0}}, "relif.lambda0"),
        ({"relif": {"r_star": 1.5}}, "relif.r_star: must be in [0.0, 1.0]"),
        (
            {"relif": {"squash_gradient": "identity"}},
            "relif.squash_gradient: must be one of ['clip', 'straight_through'], got 'identity'",
        ),
        ({"model": "resnet"}, "model: expected a mapping"),
        ({"model": {"pretrained": True}}, "model.pretrained: expected str"),
        ({"model": {"pretrained": " "}}, "model.pretrained: expected none, imagenet or a path"),
        ({"train": {"epochs": None}}, "train.epochs: set epochs, max_steps or both"),
        ({"train": {"epochs": None, "max_steps": 0}}, "train.max_steps: must be > 0"),
    ],
)
def test_bad_values_name_the_field(values, message):
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ExperimentConfig.from_dict(values)


def test_unknown_data_set_is_checked_against_the_registry():
    config = ExperimentConfig.from_dict({"data": {"dataset": "cifar", "root": "/data"}})
    with pytest.raises(UserError) as error:
        load_problem(config.data)
    message = str(error.value)
    assert message.startswith("config field data.dataset: must be one of eicu, mimic3, nyuv2,")
    assert "got 'cifar'" in message and "\n" not in message
