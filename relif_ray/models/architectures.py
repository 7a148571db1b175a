"""The multi-task architectures (`model.architecture`): their registry and the model factories.

One module per architecture in this package: hard parameter sharing (`dense.DenseMTLModel`,
`clinical.ClinicalMTLModel`), `mtan`, `cross_stitch`, `mmoe`, `cgc`, `ple`, `dselect_k`
(each a `TaskTrunk` that the dense or clinical model puts the heads on). `ARCHITECTURES`
describes each: its citation, LibMTL 1.1.5's class of the same architecture (the tests
compare forward outputs with it), the encoders it applies to, its options with their
defaults (`model.architecture_options`), and what its shared parameters and its
representation are (`relif_ray.models.base`). `relif architectures` prints it, and the model
factories (`build_dense_model`, `build_clinical_model`) check a config against it with one-line
errors before any trial starts (the sweep builds every trial's model on PyTorch's meta
device first).

The defaults of the expert counts are ours (LibMTL's `--num_experts` has none): every expert
is a whole encoder, as in LibMTL, so a step costs about as many encoders as there are experts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from relif_ray.config import HARD_SHARING, ModelConfig
from relif_ray.errors import UserError
from relif_ray.models.base import MultiTaskModel, TaskTrunk
from relif_ray.models.cgc import CGC
from relif_ray.models.clinical import ClinicalArchitectureModel, ClinicalMTLModel, HeadSpec
from relif_ray.models.cross_stitch import CrossStitch
from relif_ray.models.dense import TASK_CHANNELS, DenseArchitectureModel, DenseMTLModel
from relif_ray.models.dselect_k import DSelectK
from relif_ray.models.experts import ExpertFamily, LSTMExperts, ResNetExperts
from relif_ray.models.mmoe import MMoE
from relif_ray.models.mtan import MTAN
from relif_ray.models.ple import PLE

RESNET, LSTM = "resnet", "lstm"
ENCODERS = {RESNET: "NYUv2's ResNet", LSTM: "the clinical LSTM"}
"""Encoder kind -> how errors and listings name it."""

NYUV2_IMAGE_SHAPE = (3, 288, 384)
"""The NYUv2 image (C, H, W) the gates of a model built without data are sized for (the
sweep's meta-device check); a trial sizes them for its data."""


@dataclass(frozen=True)
class Architecture:
    """One architecture as `relif architectures` lists it and the factories build it."""

    name: str
    title: str
    citation: str
    libmtl: str
    encoders: tuple[str, ...]
    shared: str
    representation: str
    options: Mapping[str, Any] = field(default_factory=dict)
    trunk: Callable[..., TaskTrunk] | None = None
    """(family, tasks, **options) -> the trunk; None for hard sharing (the plain models)."""


PER_TASK_REPRESENTATION = "the tasks' head inputs, each GAP (LSTM: last step), concatenated"
ARCHITECTURES: dict[str, Architecture] = {
    arch.name: arch
    for arch in (
        Architecture(
            HARD_SHARING,
            "HPS",
            "Caruana, ICML 1993",
            "HPS",
            (RESNET, LSTM),
            "the encoder",
            "GAP of the encoder map (LSTM: last-step state)",
        ),
        Architecture(
            "mtan",
            "MTAN",
            "Liu, Johns & Davison, CVPR 2019",
            "MTAN",
            (RESNET,),
            "the global ResNet and the attention path's residual blocks",
            PER_TASK_REPRESENTATION,
            trunk=MTAN,
        ),
        Architecture(
            "cross_stitch",
            "Cross-stitch",
            "Misra et al., CVPR 2016",
            "Cross_stitch",
            (RESNET,),
            "every column's stem..layer3 and the first two units",
            PER_TASK_REPRESENTATION,
            trunk=CrossStitch,
        ),
        Architecture(
            "mmoe",
            "MMoE",
            "Ma et al., KDD 2018",
            "MMoE",
            (RESNET, LSTM),
            "the experts",
            PER_TASK_REPRESENTATION,
            {"num_experts": 4},
            MMoE,
        ),
        Architecture(
            "cgc",
            "CGC",
            "Tang et al., RecSys 2020",
            "CGC",
            (RESNET, LSTM),
            "the shared experts",
            PER_TASK_REPRESENTATION,
            {"num_experts": 2, "task_experts": 1},
            CGC,
        ),
        Architecture(
            "ple",
            "PLE",
            "Tang et al., RecSys 2020",
            "PLE",
            (RESNET, LSTM),
            "the shared experts of every level",
            PER_TASK_REPRESENTATION,
            {"num_experts": 2, "task_experts": 1},
            PLE,
        ),
        Architecture(
            "dselect_k",
            "DSelect-k",
            "Hazimeh et al., NeurIPS 2021",
            "DSelect_k",
            (RESNET, LSTM),
            "the experts",
            PER_TASK_REPRESENTATION,
            {"num_experts": 4, "num_nonzeros": 2, "gamma": 1.0, "entropy_reg": 1e-6},
            DSelectK,
        ),
    )
}
"""Architecture name -> its description, in the order `relif architectures` lists them."""


def known_architecture(name: str, where: str = "config field model.architecture") -> Architecture:
    """The architecture called `name`; a one-line error naming `where` and the choices."""
    if name not in ARCHITECTURES:
        raise UserError(
            f"{where}: unknown architecture '{name}' (choices: {', '.join(ARCHITECTURES)})"
        )
    return ARCHITECTURES[name]


def architecture_options(config: ModelConfig, encoder: str) -> dict[str, Any]:
    """The options of `config.architecture` (its defaults, overridden by
    `config.architecture_options`), after checking that it exists, applies to `encoder`
    (RESNET or LSTM) and that every option is known and in range; one-line errors."""
    name = config.architecture
    described = known_architecture(name)
    if encoder not in described.encoders:
        here = [arch for arch, spec in ARCHITECTURES.items() if encoder in spec.encoders]
        raise UserError(
            f"config field model.architecture: {name} does not apply to {ENCODERS[encoder]} "
            f"(choices there: {', '.join(here)})"
        )
    for key in config.architecture_options:
        if key not in described.options:
            known = ", ".join(described.options) or "none"
            raise UserError(
                f"config field model.architecture_options.{key}: {name} has no option "
                f"'{key}' (its options: {known})"
            )
    options = {**described.options, **config.architecture_options}
    _check_options(name, options)
    return options


def _check_options(name: str, options: dict[str, Any]) -> None:
    """Counts are integers (at least 2 experts for DSelect-k, whose selectors need a bit;
    at most E of them selected), gamma > 0, entropy_reg >= 0."""
    least = {"num_experts": 2 if name == "dselect_k" else 1, "task_experts": 1, "num_nonzeros": 1}
    for key, value in options.items():
        field_name = f"config field model.architecture_options.{key}"
        if key in least and (not isinstance(value, int) or isinstance(value, bool)):
            raise UserError(f"{field_name}: expected an integer, got {value!r}")
        if key in least and value < least[key]:
            raise UserError(f"{field_name}: must be >= {least[key]}, got {value}")
        if key in ("gamma", "entropy_reg"):
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise UserError(f"{field_name}: expected a number, got {value!r}")
            if value < 0 or (key == "gamma" and value == 0):
                raise UserError(f"{field_name}: must be {'> 0' if key == 'gamma' else '>= 0'}")
    if options.get("num_nonzeros", 0) > options.get("num_experts", 0):
        raise UserError(
            "config field model.architecture_options.num_nonzeros: must be <= num_experts "
            f"({options['num_experts']}), got {options['num_nonzeros']}"
        )


def build_dense_model(
    config: ModelConfig, image_shape: tuple[int, int, int] = NYUV2_IMAGE_SHAPE
) -> MultiTaskModel:
    """NYUv2's model of `config.architecture` with `config.head` heads; the gates of the
    expert architectures read images of `image_shape` (C, H, W)."""
    options = architecture_options(config, RESNET)
    if config.architecture == HARD_SHARING:
        return DenseMTLModel(config)
    family = ResNetExperts(config.backbone, config.pretrained, image_shape)
    trunk = _trunk(config.architecture, family, list(TASK_CHANNELS), options)
    return DenseArchitectureModel(config, trunk, family.out_features)


def build_clinical_model(
    config: ModelConfig, input_size: int, heads: dict[str, HeadSpec]
) -> MultiTaskModel:
    """The clinical model of `config.architecture` over `input_size` features per hour."""
    if config.head != "simple":
        raise UserError(
            f"config field model.head: {config.head} applies to NYUv2's dense heads only (the "
            "clinical heads are linear readouts; use simple)"
        )
    options = architecture_options(config, LSTM)
    if config.architecture == HARD_SHARING:
        return ClinicalMTLModel(config, input_size, heads)
    family = LSTMExperts(input_size, config.hidden_size, config.num_layers, config.dropout)
    trunk = _trunk(config.architecture, family, list(heads), options)
    return ClinicalArchitectureModel(config, heads, trunk)


def _trunk(name: str, family: ExpertFamily, tasks: list[str], options: dict[str, Any]) -> TaskTrunk:
    build = ARCHITECTURES[name].trunk
    assert build is not None  # only hard sharing has none, and it has its own models
    return build(family, tasks, **options)
