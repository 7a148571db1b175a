"""One validated experiment config: everything a single training run needs.

The config is a tree of dataclasses. `ExperimentConfig.from_dict` builds it from the nested
dict that Ray Tune passes to a trial (and that trials store as `config.json`), rejecting
unknown fields, wrong types and out-of-range values with a one-line `UserError` that names the
dotted field, e.g. `config field train.lr: must be > 0, got -1.0`. No float field takes NaN or
infinity (YAML's `.nan`, `.inf`): each is refused where values are checked against their type
hints (`_coerce`), before any range check could let one through. `flat_config` and
`nested_config` turn it into flat dotted keys (`relif.enabled`, `seed`) and back: the form Ray
Tune stores and shows as a trial's config, and the form of `--set section.field=value`.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from relif_ray.errors import UserError

HARD_SHARING = "hps"
"""Hard parameter sharing (one shared encoder, one head per task): the default
`model.architecture` (`relif_ray.models.architectures` lists the others)."""


@dataclass
class DataConfig:
    """Which data set and where it lives on disk. `dataset` names a benchmark of
    `relif_ray.problems`; loading the problem checks it against the registry.

    spec: the data spec of a benchmark that a spec defines rather than its files (the tabular
        benchmark: tasks, kinds, groups, features, split fractions and data seed,
        `relif_ray.data.tabular.TableSpec`, with the summary of the data the sweep recorded);
        empty for the others. Every trial gets it with its config, and the experiment records
        it with each trial's config.
    """

    dataset: str = "nyuv2"
    root: str = ""
    spec: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelConfig:
    """The shared-backbone model.

    backbone: torchvision ResNet name for the dense model (resnet50 in the paper; resnet18 for
        demos and tests).
    pretrained: the backbone's initial weights. "none": random (seeded); "imagenet":
        torchvision's ImageNet weights (IMAGENET1K_V1), from torchvision's cache or downloaded;
        any other value: the path of a local state_dict file of the torchvision ResNet named by
        `backbone`. Weights that cannot be loaded are an error, never a silent fall-back.
    head_channels: width of each task head's decoder feature map (the depth/normal audit score
        is the channel-wise L2 norm of this map); with `head: aspp` also the ASPP's width
        (DeepLabV3's and LibMTL's is 256).
    architecture: the multi-task architecture (`relif architectures` lists them; one module
        each in `relif_ray/models/`): "hps" (hard parameter sharing: one shared encoder, one
        head per task), "mtan", "cross_stitch" (NYUv2's ResNet only), "mmoe", "cgc", "ple",
        "dselect_k" (ResNet experts on NYUv2, LSTM experts on the clinical data sets).
    architecture_options: the architecture's options (numbers of experts, DSelect-k's k, ...),
        checked against its defaults where the model is built (`relif_ray.models.architectures`).
    head: NYUv2's task heads. "simple": conv3x3-BN-ReLU-conv1x1; "aspp": LibMTL's DeepLabV3
        head (ASPP, then conv3x3-BN-ReLU-conv1x1). The clinical heads are linear readouts.
    """

    backbone: str = "resnet50"
    pretrained: str = "none"
    head_channels: int = 128
    architecture: str = HARD_SHARING
    architecture_options: dict[str, Any] = field(default_factory=dict)
    head: Literal["simple", "aspp"] = "simple"
    hidden_size: int = 256
    num_layers: int = 2
    dropout: float = 0.3

    def validate(self) -> None:
        if not self.pretrained.strip():
            raise UserError("config field model.pretrained: expected none, imagenet or a path")
        _positive("model.head_channels", self.head_channels)
        _positive("model.hidden_size", self.hidden_size)
        _positive("model.num_layers", self.num_layers)
        _in_range("model.dropout", self.dropout, 0.0, 1.0)


@dataclass
class TrainConfig:
    """Optimisation budget, optimiser and the fast GPU path.

    Budget and optimiser defaults follow LibMTL's NYUv2 setting (Adam 1e-4). The speed fields
    (precision, channels_last, compile, cudnn_benchmark, data_on_device: the GPU fast path of
    docs/benchmarks.md) default to the exact fp32 path, so a CPU run is deterministic and
    unchanged by them:

    precision: "bf16" runs the model forward under bfloat16 autocast; the predictions, features
        and representation are cast back to fp32 before the task losses, the audit scores and
        the ReLiF regularizer (its statistics and controller), and evaluation scores are fp32.
        Weights, gradients and optimiser state stay fp32 (no loss scaling is needed for bf16).
    channels_last: model weights and image batches in NHWC memory order (faster convolutions
        on tensor-core GPUs); numbers differ from the default layout only by float rounding.
    epochs, max_steps: the training budget. Both given: the smaller wins. epochs None: exactly
        max_steps steps, over as many epochs as they need (the last one partial). At least one
        must be set.
    compile: run the model forward through `torch.compile` (first steps are slow while it
        compiles; checkpoints are unaffected).
    compile_relif: run the ReLiF regularizer's step through `torch.compile` as one graph
        (`relif_ray.relif.regularizer.compiled_regularizer`): its chain of small kernels fused,
        also inside the graphed step; the same numbers up to fused kernels' float rounding.
        No effect without ReLiF; off until the GPU's rows decide a default.
    cudnn_benchmark: on CUDA only, let cuDNN time its convolution algorithms and keep the
        fastest (a speed choice; the chosen kernels may differ between runs). CUDA runs are
        not bitwise repeatable either way: some CUDA backward kernels add atomically in a
        varying order (on an H100 the same seed differed by 2.4e-7 after 6 steps with this on
        and off; docs/benchmarks.md, GPU run 2). CPU runs use deterministic algorithms.
    data_on_device: hold every split on the training device: its tensors are copied there
        once per process (except `relif_ray.transfer.HOST_KEYS`); each training step's batch
        is gathered there from the epoch's permutation, itself copied there once per epoch,
        and each evaluation batch from a range of indices made there, so neither does host
        gathering, pinning or copying. The same batches in the same order, so the same
        numbers, as without it (on a CPU it changes nothing). It costs device memory for the
        whole data set: NYUv2's 795 train and 654 val images at 288x384 (image, depth and
        normals in float32, labels in int8) take about 4.6 GB. Splits of tensors only
        (NYUv2); the clinical data sets' variable-length stays are refused.
    cuda_graph: "auto" captures the whole training step (batch gather, forward, losses, ReLiF,
        backward, the optimiser's step) as one CUDA graph and replays it, on CUDA trials whose
        method declares itself capturable and whose data are on the device; a method that
        solves for its weights on the host (PCGrad, FairGrad, the TorchJD methods) gets two
        graphs around that solve. The others, and every CPU trial, run eager steps, and a CUDA
        trial's log says why in one line (`relif_ray.cuda_graph`). "off": always eager.
    eval_cuda_graph: replay the evaluation forward from CUDA graphs, one per batch size
        (`relif_ray.cuda_graph.GraphedForward`), on CUDA trials whose data are on the device
        and whose forward is not compiled; elsewhere it changes nothing. The eager forward's
        kernels, replayed: the same numbers. Off until the breakdown's rows on a GPU decide a
        default.
    scheduler: the learning-rate schedule over epochs (the paper states none; LibMTL's NYUv2
        setting uses "step"). "none": `lr` throughout. "step": torch's StepLR, `lr` times
        `scheduler_gamma` every `scheduler_step_size` epochs. "cosine": torch's
        CosineAnnealingLR from `lr` down to `scheduler_min_lr` over `scheduler_epochs` epochs
        (None: the epochs of the run's budget; past its horizon torch's cosine rises again).
        The rate changes at the end of each complete epoch only (see
        `relif_ray.schedule.build_lr_scheduler`). Not to be confused with the sweeps'
        `--scheduler` flag (Ray Tune's trial scheduler, ASHA), which stops trials early.
    eval_every: validate (the validation pass and the live audit of a sweep's trial,
        `relif_ray.tuning.trainable.evaluates_after`) every `eval_every` epochs, and always
        after the last epoch and at every epoch where a scheduler decides (ASHA's rungs). An
        epoch without validation reports its metrics as NaN (`evaluated: false`), never the last
        ones. 1 (every epoch) keeps the CPU's and the GPU's behaviour until the GPU's
        per-epoch breakdown decides a GPU default; validation changes no trained number.
    eval_batch_size: the batch of the validation and test passes (no gradients, so it may
        exceed `batch_size`); 16 on both devices until the breakdown decides a GPU default.
    epoch_test_metrics: also evaluate the test split (where the data set has one) after every
        validated epoch and record its metrics (`test_<metric>`) in its result, as the NYUv2
        literature's tables average test metrics over the last epochs (Nash-MTL, FAMO) or take
        them at the best validation epoch (LibMTL). What `relif report --delta-m-epochs best`
        and `last:K` read on the test split; off by default (a test pass per epoch costs about
        a validation pass).
    """

    epochs: int | None = 1
    max_steps: int | None = None
    batch_size: int = 8
    eval_batch_size: int = 16
    eval_every: int = 1
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    lr: float = 1e-4
    weight_decay: float = 1e-5
    grad_clip: float | None = None
    precision: Literal["fp32", "bf16"] = "fp32"
    channels_last: bool = False
    compile: bool = False
    compile_relif: bool = False
    cudnn_benchmark: bool = True
    data_on_device: bool = False
    cuda_graph: Literal["auto", "off"] = "auto"
    eval_cuda_graph: bool = False
    scheduler: Literal["none", "step", "cosine"] = "none"
    scheduler_step_size: int = 100
    scheduler_gamma: float = 0.5
    scheduler_epochs: int | None = None
    scheduler_min_lr: float = 0.0
    epoch_test_metrics: bool = False

    def validate(self) -> None:
        if self.epochs is None and self.max_steps is None:
            raise UserError("config field train.epochs: set epochs, max_steps or both")
        if self.epochs is not None:
            _positive("train.epochs", self.epochs)
        if self.max_steps is not None:
            _positive("train.max_steps", self.max_steps)
        _positive("train.batch_size", self.batch_size)
        _positive("train.eval_batch_size", self.eval_batch_size)
        _positive("train.eval_every", self.eval_every)
        _positive("train.lr", self.lr)
        if self.weight_decay < 0:
            raise UserError(
                f"config field train.weight_decay: must be >= 0, got {self.weight_decay}"
            )
        if self.grad_clip is not None:
            _positive("train.grad_clip", self.grad_clip)
        _positive("train.scheduler_step_size", self.scheduler_step_size)
        _positive("train.scheduler_gamma", self.scheduler_gamma)
        if self.scheduler_epochs is not None:
            _positive("train.scheduler_epochs", self.scheduler_epochs)
        _in_range("train.scheduler_min_lr", self.scheduler_min_lr, 0.0, self.lr)


GradientSource = Literal["parameters", "representation"]

SquashGradient = Literal["clip", "straight_through"]

SurrogateScore = Literal["audit", "logistic"]


@dataclass
class MethodConfig:
    """The MTL method by registry name, and its options (keyword arguments of its class).

    gradient_source: where a gradient-based method takes the per-task gradients: "parameters"
        (exact) or "representation" (the encoder output; an approximation, for the methods
        that list it in `gradient_sources`; see `relif_ray.methods.gradients`).
    """

    name: str = "erm"
    options: dict[str, Any] = field(default_factory=dict)
    gradient_source: GradientSource = "parameters"


@dataclass
class ReLiFConfig:
    """The ReLiF regularizer and its violation-rate controller (paper section 4, Table 7).

    enabled switches ReLiF on for ANY method; ERM + ReLiF is the paper's "ReLiF".
    prototypes_per_task, prototype_pairing: the pair set P_t (our choice; the paper only says
        "high-confidence prototypes"): each task's `prototypes_per_task` highest-scoring valid
        examples of the batch; "cross" pairs all of task i's with all of task j's, "rank" pairs
        them by confidence rank. See `relif_ray.relif.surrogate.prototype_pairs`.
    squash: how non-probability audit scores (NYUv2 depth/normal feature norms) are squashed
        into [0, 1] in the training surrogate. "erm" (the paper's, section 3 and appendix A.3:
        "the same scalar score is used to form both the fixed-audit gaps and the training-time
        surrogate gaps"): the squash of `relif_ray.reference` with the fixed q10/q90 of the
        same-seed ERM validation run, given in `squash_constants`; a sweep runs the ERM
        reference trials first and fills them in. "running": q10/q90 are running EMAs (weight
        `squash_ema`) of each batch's quantiles, our earlier choice, kept for comparison; it
        lets scores drift above the audit's band, where the audit clips them (docs/relif.md).
    squash_constants: task -> [q10, q90] of the same-seed ERM validation raw scores, for every
        task whose score is not a probability (used with squash="erm" only).
    squash_gradient: the gradient through a squashed score, with either squash. "clip" (the
        paper's): the clip's own, zero where it saturates, so a prototype score beyond q90
        is never pulled back. "straight_through" (our extension, label `relif-st`): the same
        forward value (the audit's score, so the surrogate, the statistics and the controller
        are unchanged), but the slope of the squash's affine map (`relif_ray.reference`) everywhere,
        saturated scores included (docs/relif.md).
    surrogate_score: the score a squashed task's surrogate gaps are formed from. "audit" (the
        paper's): the audit's squash itself. "logistic" (our extension, label
        `relif-logistic`): sigmoid(4 (u - 1/2)) of the same ERM-normalised score
        u (`relif_ray.squash.normalised_score`), smooth and never flat, with the clip's slope at
        the band's middle (`relif_ray.relif.regularizer.logistic_squash`); takes the clip's
        squash_gradient only.
    clip_share_penalty: our extension (label `relif-clipshare`): lambda_t also weights, per
        squashed task, how far the batch's 90th percentile of u lies above 1 and its 10th
        below 0, i.e. a penalty that is zero while at most ERM's share of the batch lies
        beyond each of ERM's clip points (`relif_ray.relif.regularizer.clip_share_penalty`).
    quantile_alignment=False: tau = kappa = 1 (ablation "ReLiF-no-align").
    controller="static": lambda fixed at lambda0 (static-lambda ablation).
    lipschitz_branch=False: lambda = 0, no gradient from L_lip (ablation "ReLiF w/o Lip").
    """

    enabled: bool = False
    beta: float = 0.1
    mu: float = 0.05
    distance_floor: float = 1e-3
    scale_quantile: float = 0.95
    scale_ema: float = 0.1
    scale_floor: float = 1e-4
    quantile_alignment: bool = True
    prototypes_per_task: int = 4
    prototype_pairing: Literal["cross", "rank"] = "cross"
    squash: Literal["erm", "running"] = "erm"
    squash_constants: dict[str, list[float]] = field(default_factory=dict)
    squash_ema: float = 0.1
    squash_gradient: SquashGradient = "clip"
    surrogate_score: SurrogateScore = "audit"
    clip_share_penalty: bool = False
    controller: Literal["adaptive", "static"] = "adaptive"
    lipschitz_branch: bool = True
    lambda0: float = 0.1
    lambda_min: float = 0.01
    lambda_max: float = 1.0
    warmup_steps: int = 100
    violation_ema: float = 0.1
    r_star: float = 0.24
    eta: float = 1e-3

    def controller_adapts(self) -> bool:
        """Whether lambda follows the multiplicative update of the paper's Eq. 12, so that
        r* and eta matter: ReLiF on, the adaptive controller, and the Lipschitz branch on
        (without it lambda stays 0, so "ReLiF w/o Lip" does not adapt)."""
        return self.enabled and self.controller == "adaptive" and self.lipschitz_branch

    def validate(self) -> None:
        _positive("relif.beta", self.beta)
        _positive("relif.mu", self.mu)
        _positive("relif.distance_floor", self.distance_floor)
        _in_range("relif.scale_quantile", self.scale_quantile, 0.0, 1.0)
        _in_range("relif.scale_ema", self.scale_ema, 0.0, 1.0)
        _positive("relif.scale_floor", self.scale_floor)
        _positive("relif.prototypes_per_task", self.prototypes_per_task)
        _in_range("relif.squash_ema", self.squash_ema, 0.0, 1.0)
        for task, bounds in self.squash_constants.items():
            _check_squash_bounds(f"relif.squash_constants.{task}", bounds)
        if self.surrogate_score == "logistic" and self.squash_gradient != "clip":
            raise UserError(
                "config field relif.surrogate_score: logistic has its own gradient; it needs "
                f"relif.squash_gradient clip, got {self.squash_gradient}"
            )
        _in_range("relif.violation_ema", self.violation_ema, 0.0, 1.0)
        _in_range("relif.r_star", self.r_star, 0.0, 1.0)
        if self.eta < 0:
            raise UserError(f"config field relif.eta: must be >= 0, got {self.eta}")
        if self.warmup_steps < 0:
            raise UserError(
                f"config field relif.warmup_steps: must be >= 0, got {self.warmup_steps}"
            )
        if not 0 <= self.lambda_min <= self.lambda0 <= self.lambda_max:
            raise UserError(
                "config field relif.lambda0: need 0 <= lambda_min <= lambda0 <= lambda_max, got "
                f"{self.lambda_min}, {self.lambda0}, {self.lambda_max}"
            )


@dataclass
class ExperimentConfig:
    """One training run: data, model, method (+ ReLiF), budget, seed and device."""

    seed: int = 0
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    relif: ReLiFConfig = field(default_factory=ReLiFConfig)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ExperimentConfig:
        """Build and validate a config from a nested dict; unknown fields are errors."""
        config = _build(cls, values, prefix="")
        for section in (config.model, config.train, config.relif):
            section.validate()
        if config.method.gradient_source == "representation" and config.train.compile:
            raise UserError(
                "config field method.gradient_source: 'representation' needs train.compile "
                "false (inside a compiled forward the heads do not read the returned encoder "
                "output)"
            )
        return config

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _build(cls: type, values: Any, prefix: str) -> Any:
    if not isinstance(values, dict):
        raise UserError(f"config field {prefix.rstrip('.') or '<root>'}: expected a mapping")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise UserError(f"config field {prefix}{unknown[0]}: unknown field")
    kwargs = {name: _coerce(hints[name], values[name], prefix + name) for name in values}
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, name: str) -> Any:
    """Check `value` against the type hint `hint`; ints are accepted where floats are."""
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, prefix=name + ".")
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, name)
    if origin is Literal:
        if value not in args:
            raise UserError(f"config field {name}: must be one of {list(args)}, got {value!r}")
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"config field {name}: expected a mapping, got {value!r}")
        return dict(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is bool and not isinstance(value, bool):
        raise UserError(f"config field {name}: expected true/false, got {value!r}")
    if hint in (int, float, str) and (not isinstance(value, hint) or isinstance(value, bool)):
        raise UserError(f"config field {name}: expected {hint.__name__}, got {value!r}")
    if hint is float and not math.isfinite(value):
        raise UserError(f"config field {name}: must be a finite number, got {value!r}")
    return value


def _check_squash_bounds(name: str, bounds: Any) -> None:
    """[q10, q90]: two finite numbers with q10 <= q90."""
    numbers = isinstance(bounds, list | tuple) and len(bounds) == 2
    numbers = numbers and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in bounds
    )
    if not numbers or not all(math.isfinite(v) for v in bounds) or bounds[0] > bounds[1]:
        raise UserError(f"config field {name}: expected [q10, q90] with q10 <= q90, got {bounds!r}")


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise UserError(f"config field {name}: must be > 0, got {value}")


def _in_range(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise UserError(f"config field {name}: must be in [{low}, {high}], got {value}")


CONFIG_SECTIONS: tuple[str, ...] = tuple(
    name
    for name, hint in typing.get_type_hints(ExperimentConfig).items()
    if dataclasses.is_dataclass(hint)
)
"""The sections of ExperimentConfig (data, model, train, method, relif), whose own fields are
the leaves of the flat form."""


def flat_config(values: dict[str, Any]) -> dict[str, Any]:
    """A config dict with flat dotted keys: {"relif": {"enabled": True}, "seed": 1} ->
    {"relif.enabled": True, "seed": 1}. A mapping-valued field (`method.options`) stays one
    value."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if key in CONFIG_SECTIONS and isinstance(value, dict):
            flat.update({f"{key}.{name}": item for name, item in value.items()})
        else:
            flat[key] = value
    return flat


def nested_config(flat: dict[str, Any]) -> dict[str, Any]:
    """The ExperimentConfig dict of the flat dotted keys in `flat` that name its fields; other
    keys (a trial's label, the sweep's delta, ...) are left out."""
    fields = {f.name for f in dataclasses.fields(ExperimentConfig)}
    values: dict[str, Any] = {}
    for key, value in flat.items():
        section, dot, name = key.partition(".")
        if section not in fields:
            continue
        if dot:
            values.setdefault(section, {})[name] = value
        else:
            values[key] = value
    return values
