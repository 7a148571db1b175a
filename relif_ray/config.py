"""One validated experiment config: everything a single training run needs.

The config is a tree of dataclasses. `ExperimentConfig.from_dict` builds it from the nested
dict that Ray Tune passes to a trial (and that trials store as `config.json`), rejecting
unknown fields, wrong types and out-of-range values with a one-line `UserError` that names the
dotted field, e.g. `config field train.lr: must be > 0, got -1.0`. No float field takes NaN or
infinity (YAML's `.nan`, `.inf`): each is refused where values are checked against their type
hints (`_coerce`), before any range check could let one through. `flat_config` and
`nested_config` turn it into flat dotted keys (`relif.enabled`, `seed`) and back: the form Ray
Tune stores and shows as a trial's config, and the form of `--set section.field=value`.

Each field's documentation is its attribute docstring: a first line that says what it is (ending
in "(paper Eq. N)" where the paper defines it), then any detail. The config reference of the
docs (docs/config.md) is generated from them; its build fails on a field without one.
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
    """Which data set and where it lives on disk."""

    dataset: str = "nyuv2"
    """The benchmark (`relif_ray.problems`; loading the problem checks it against the registry)."""
    root: str = ""
    """The data set's folder (a table sweep: the table's file)."""
    spec: dict[str, Any] = field(default_factory=dict)
    """The data spec of a benchmark that a spec defines rather than its files.

    The tabular benchmark's: tasks, kinds, groups, features, split fractions and data seed
    (`relif_ray.data.tabular.TableSpec`), with the summary of the data the sweep recorded; empty
    for the others. Every trial gets it with its config, and the experiment records it with
    each trial's config."""


@dataclass
class ModelConfig:
    """The shared-backbone model."""

    backbone: str = "resnet50"
    """The encoder: NYUv2's torchvision ResNet (the paper's resnet50), "lstm", "mlp" (a table)."""
    pretrained: str = "none"
    """The backbone's initial weights: "none", "imagenet" or a local state_dict file.

    "none": random (seeded); "imagenet": torchvision's ImageNet weights (IMAGENET1K_V1), from
    torchvision's cache or downloaded; any other value: the path of a local state_dict file of
    the torchvision ResNet named by `backbone`. Weights that cannot be loaded are an error,
    never a silent fall-back."""
    head_channels: int = 128
    """Width of each task head's decoder feature map (with `head: aspp` also the ASPP's).

    The depth/normal audit score is the channel-wise L2 norm of this map; DeepLabV3's and
    LibMTL's ASPP width is 256."""
    architecture: str = HARD_SHARING
    """The multi-task architecture (`relif architectures` lists them).

    One module each in `relif_ray/models/`: "hps" (hard parameter sharing: one shared encoder,
    one head per task), "mtan", "cross_stitch" (NYUv2's ResNet only), "mmoe", "cgc", "ple",
    "dselect_k" (ResNet experts on NYUv2, LSTM experts on the clinical data sets)."""
    architecture_options: dict[str, Any] = field(default_factory=dict)
    """The architecture's options (numbers of experts, DSelect-k's k, ...).

    Checked against its defaults where the model is built (`relif_ray.models.architectures`)."""
    head: Literal["simple", "aspp"] = "simple"
    """NYUv2's task heads: "simple" (conv3x3-BN-ReLU-conv1x1) or "aspp" (LibMTL's DeepLabV3 head).

    "aspp": ASPP, then conv3x3-BN-ReLU-conv1x1. The clinical heads are linear readouts."""
    hidden_size: int = 256
    """Hidden width of the clinical LSTM and of the table's MLP."""
    num_layers: int = 2
    """Layers of the clinical LSTM and of the table's MLP."""
    dropout: float = 0.3
    """Dropout of the clinical LSTM (between layers, before the heads) and the table MLP."""

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
    unchanged by them.
    """

    epochs: int | None = 1
    """Training epochs (None: exactly `max_steps` steps, the last epoch partial).

    With `max_steps` too, the smaller budget wins; at least one of them must be set."""
    max_steps: int | None = None
    """Training steps (None: `epochs` whole epochs); with `epochs` too, the smaller budget wins."""
    batch_size: int = 8
    """The training batch (an epoch is the train split's full batches)."""
    eval_batch_size: int = 16
    """The batch of the validation and test passes (no gradients: it may exceed `batch_size`).

    16 on both devices until the breakdown decides a GPU default."""
    eval_every: int = 1
    """Validate (the validation pass and a sweep trial's live audit) every this many epochs.

    Always also after the last epoch and at every epoch where a scheduler decides (ASHA's rungs;
    `relif_ray.tuning.trainable.evaluates_after`). An epoch without validation reports its
    metrics as NaN (`evaluated: false`), never the last ones. 1 (every epoch) keeps the CPU's and
    the GPU's behaviour until the GPU's per-epoch breakdown decides a GPU default; validation
    changes no trained number."""
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    """The optimiser."""
    lr: float = 1e-4
    """The learning rate (the start of a `scheduler`'s schedule)."""
    weight_decay: float = 1e-5
    """The optimiser's weight decay."""
    grad_clip: float | None = None
    """Clip the gradient's global norm to this (None: no clipping)."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """The model forward's precision: "bf16" runs it under bfloat16 autocast, "fp32" does not.

    Weights, gradients and optimiser state stay fp32 (bf16 needs no loss scaling); predictions,
    features and representation are cast back to fp32 before the task losses, the audit scores
    and ReLiF (its statistics and controller), and evaluation scores are fp32."""
    channels_last: bool = False
    """Weights and image batches in NHWC order (faster GPU convolutions; only rounding differs;
    a CPU without AVX-512 keeps NCHW: `relif_ray.gpu_stack.channels_last_applies`)."""
    compile: bool = False
    """Run the model forward through `torch.compile` (slow first steps; checkpoints unchanged)."""
    compile_relif: bool = False
    """Run the ReLiF regularizer's step through `torch.compile` as one graph.

    `relif_ray.relif.regularizer.compiled_regularizer`: its chain of small kernels fused, also
    inside the graphed step; the same numbers up to fused kernels' float rounding. No effect
    without ReLiF; off until the GPU's rows decide a default."""
    cudnn_benchmark: bool = True
    """On CUDA only, let cuDNN time its convolution algorithms and keep the fastest.

    A speed choice (the chosen kernels may differ between runs). CUDA runs are not bitwise
    repeatable either way (atomic adds of some backward kernels; docs/benchmarks.md, GPU run 2);
    CPU runs use deterministic algorithms."""
    data_on_device: bool = False
    """Hold every split on the training device, and gather each batch there.

    Copied once per process (but `relif_ray.transfer.HOST_KEYS`); each step's batch is gathered
    there from the epoch's permutation, with no host gathering, pinning or copying: the same
    batches, so the same numbers (on a CPU it changes nothing). It costs the data set's size in
    device memory (NYUv2 at 288x384: about 4.6 GB). Splits of tensors only (NYUv2)."""
    cuda_graph: Literal["auto", "off"] = "auto"
    """Replay the training step from CUDA graphs where the trial allows ("auto"), or never ("off").

    "auto" captures the whole step (batch gather, forward, losses, ReLiF, backward, optimiser) as
    one graph, on CUDA trials whose method is capturable and whose data are on the device; a
    method that solves for its weights on the host (PCGrad, FairGrad, TorchJD) gets two graphs
    around that solve. Others run eager steps, and a CUDA trial's log says why
    (`relif_ray.cuda_graph`)."""
    eval_cuda_graph: bool = False
    """Replay the evaluation forward from CUDA graphs, one per batch size (the same numbers).

    On CUDA trials whose data are on the device and whose forward is not compiled
    (`relif_ray.cuda_graph.GraphedForward`). Off until the breakdown's GPU rows decide a default."""
    scheduler: Literal["none", "step", "cosine"] = "none"
    """The learning-rate schedule over epochs: "none" (`lr` throughout), "step" or "cosine".

    The paper states none; LibMTL's NYUv2 setting uses "step" (torch's StepLR); "cosine" is
    torch's CosineAnnealingLR. The rate changes at the end of each complete epoch only
    (`relif_ray.schedule.build_lr_scheduler`). Not the sweeps' `--scheduler` (Ray Tune's ASHA)."""
    scheduler_step_size: int = 100
    """With scheduler "step": epochs between two decays of the rate."""
    scheduler_gamma: float = 0.5
    """With scheduler "step": the factor of each decay."""
    scheduler_epochs: int | None = None
    """With scheduler "cosine": its horizon in epochs (None: the run's; past it the rate rises)."""
    scheduler_min_lr: float = 0.0
    """With scheduler "cosine": the rate at its horizon."""
    epoch_test_metrics: bool = False
    """Also evaluate the test split after every validated epoch (`test_<metric>` in its result):
    what `relif report --delta-m-epochs best` and `last:K` read, as NYUv2 tables average the
    last epochs (Nash-MTL, FAMO) or take the best validation epoch (LibMTL). Costs a test pass."""
    fused_seeds: int = 1
    """Seeds per sweep trial, trained in step (`relif_ray.fusion`: stacked, looped or, on a GPU,
    streamed; 1: unfused); each seed's numbers are its own trial's, each its own row."""

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
        _positive("train.fused_seeds", self.fused_seeds)
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
    """The MTL method by registry name, and its options (keyword arguments of its class)."""

    name: str = "erm"
    """The MTL method's registry name (`relif methods` lists them)."""
    options: dict[str, Any] = field(default_factory=dict)
    """The method's options, keyword arguments of its class (`--set method.options.NAME=VALUE`)."""
    gradient_source: GradientSource = "parameters"
    """Where a gradient-based method takes the per-task gradients: "parameters" (exact).

    "representation": the encoder output, an approximation, for the methods that list it in
    `gradient_sources` (`relif_ray.methods.gradients`)."""


@dataclass
class ReLiFConfig:
    """The ReLiF regularizer and its violation-rate controller (paper section 4, Table 7).

    `enabled` switches ReLiF on for ANY method; ERM + ReLiF is the paper's "ReLiF".
    """

    enabled: bool = False
    """Add ReLiF's lambda_t L_lip to the method's loss (paper Eq. 1)."""
    beta: float = 0.1
    """Huber transition of the gap transform rho_beta (paper Eq. 8)."""
    mu: float = 0.05
    """Width of the huberized hinge phi_mu on the margin (paper Eq. 9)."""
    distance_floor: float = 1e-3
    """Training distances d' are clipped below at this epsilon_d (paper Eq. 6, 10)."""
    scale_quantile: float = 0.95
    """The quantile of the batch's gaps and distances that estimates tau and kappa (paper Eq. 6)."""
    scale_ema: float = 0.1
    """EMA weight alpha_s of the scale buffers tau and kappa (paper Eq. 7)."""
    scale_floor: float = 1e-4
    """Lower bound of tau and kappa, against a degenerate normalisation (paper Eq. 7)."""
    quantile_alignment: bool = True
    """Divide the margin's terms by tau and kappa; False: tau = kappa = 1 (paper Eq. 10).

    The ablation "ReLiF-no-align" (label `relif-noalign`)."""
    prototypes_per_task: int = 4
    """Prototypes per task in a batch's pair set P_t (paper Eq. 5).

    Our choice (the paper says "high-confidence prototypes"): each task's highest-scoring valid
    examples of the batch (`relif_ray.relif.surrogate.prototype_pairs`)."""
    prototype_pairing: Literal["cross", "rank"] = "cross"
    """How P_t pairs two tasks' prototypes: "cross" all with all, "rank" by confidence rank."""
    squash: Literal["erm", "running"] = "erm"
    """How the surrogate squashes non-probability scores into [0, 1] (paper appendix A.3).

    NYUv2's depth/normal feature norms. "erm" (the paper's: the audit's own score): the squash of
    `relif_ray.reference` with the fixed q10/q90 of the same-seed ERM validation run,
    `squash_constants`, which a sweep's ERM reference trials fill in. "running": EMAs (weight
    `squash_ema`) of each batch's quantiles, our earlier choice, which lets scores drift above
    the audit's band, where the audit clips them (docs/relif.md)."""
    squash_constants: dict[str, list[float]] = field(default_factory=dict)
    """Task -> [q10, q90] of the same-seed ERM validation raw scores (with `squash` "erm").

    For every task whose score is not a probability; a sweep fills them in."""
    squash_ema: float = 0.1
    """EMA weight of the running q10/q90 (with `squash` "running")."""
    squash_gradient: SquashGradient = "clip"
    """The gradient through a squashed score: "clip" (the paper's) or "straight_through".

    "clip": the clip's own, zero where it saturates. "straight_through" (our extension, label
    `relif-st`): the same forward value, but the slope of the squash's affine map
    (`relif_ray.reference`) everywhere, saturated scores included (docs/relif.md)."""
    surrogate_score: SurrogateScore = "audit"
    """The score a squashed task's surrogate gaps are formed from: "audit" (the paper's).

    "logistic" (our extension, label `relif-logistic`): sigmoid(4 (u - 1/2)) of the same
    ERM-normalised score u (`relif_ray.squash.normalised_score`), smooth and never flat, with the
    clip's slope at the band's middle (`relif_ray.relif.regularizer.logistic_squash`); takes the
    clip's `squash_gradient` only."""
    clip_share_penalty: bool = False
    """Also penalise squashed scores beyond ERM's clip points (our extension, `relif-clipshare`).

    lambda_t also weights, per squashed task, how far the batch's 90th percentile of u lies
    above 1 and its 10th below 0: zero while at most ERM's share of the batch lies beyond each
    of ERM's clip points (`relif_ray.relif.regularizer.clip_share_penalty`)."""
    controller: Literal["adaptive", "static"] = "adaptive"
    """How lambda moves: "adaptive" by the controller, "static" never (paper Eq. 12).

    "static": lambda stays at `lambda0`, the static-lambda ablation (label `relif-static`)."""
    lipschitz_branch: bool = True
    """False: lambda = 0 and no gradient from L_lip (ablation "ReLiF w/o Lip", `relif-nolip`)."""
    lambda0: float = 0.1
    """The penalty weight's start lambda_0, and the static controller's lambda (paper Eq. 12)."""
    lambda_min: float = 0.01
    """The controller's lower clip bound lambda_min (paper Eq. 12)."""
    lambda_max: float = 1.0
    """The controller's upper clip bound lambda_max (paper Eq. 12)."""
    warmup_steps: int = 100
    """Steps before the controller updates lambda (paper Eq. 12)."""
    violation_ema: float = 0.1
    """EMA weight alpha_r of the smoothed violation rate r~_t (paper Eq. 11)."""
    r_star: float = 0.24
    """The controller's target violation rate r* (paper Eq. 5, 12)."""
    eta: float = 1e-3
    """The controller's step size eta (paper Eq. 12)."""

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
    """The run's seed: the model's initialisation and each epoch's batch order."""
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    """Where the run trains ("auto": CUDA if there is one); a sweep sets it from its GPUs."""
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
