"""Which seeds can be trained as one fused trial (`train.fused_seeds`), and in which form.

Why: on a small model a training step is a few hundred tiny kernels, each dispatched by the
host; S trials of S seeds dispatch S times as many for S times the arithmetic. Trained as one
model whose every weight has a leading seed dimension, the S seeds share each dispatch
(HFTA's horizontal fusion, MLSys 2021; PyTorch's ensembling with `torch.func`).

Two forms (`fused_form`): the tabular MLP and the clinical LSTM of hard sharing are *stacked*
(`relif_ray.fused`: one vmapped forward and one backward for every seed; the LSTM through
`relif_ray.seedwise.stacked_lstm`, its recursion over every seed's padded stays as one batched
product per time step, each seed's dropout masks drawn as its own `nn.LSTM` draws them:
`relif_ray.seedwise.lstm_dropout_masks`); every other model (NYUv2's ResNet, the expert
architectures), and a method or field that acts on one model, is *looped*: each seed's forward,
losses, ReLiF term and its method's own backward run in turn, exactly as its unfused step (its
own model, batch and global random stream: `relif_ray.seedwise.seed_stream`), then one fused
optimiser step updates every seed. A looped trial shares what a trial costs beside its steps
(the process, the data, the evaluation set-up) and the optimiser's dispatch, not the steps'
kernels: a stacked ResNet would have to batch its BatchNorm statistics per seed. A stacked
tabular seed and a looped seed train bit for bit as their own trials on the CPU; a stacked
clinical seed up to the rounding of the unrolled recursion (`nn.LSTM` runs it over the packed
stays in kernels of its own).

On a CUDA GPU (NYUv2, the GPU benchmark) a fused trial is *streamed*: each seed runs its own
training step (`TrainingRun._train_step`, with its own optimiser, graphed where its config
graphs it) on a CUDA stream of its own, so the seeds' kernels run side by side on one GPU
from one process, where separate trials time-share it; each step ends when every seed's
has. A streamed seed runs its unfused trial's step exactly, so its numbers are those of its
trial up to the GPU's own non-determinism; on the CPU the test checks the form bit for bit
(without streams), and the GPU check's fused rows measure it on a GPU.

What cannot be fused is refused before anything is built (`fusion_refusal`: see its docstring
for each reason), and the seeds of one fused trial must share everything but their seed and
their same-seed squash constants (`check_fusable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from relif_ray.config import ExperimentConfig
from relif_ray.errors import UserError
from relif_ray.methods import methods
from relif_ray.methods.base import LossWeighting
from relif_ray.methods.gradients import GradientAggregator

STACKED_DATASETS = ("tabular", "mimic3", "eicu")
"""The benchmarks whose model is stacked (`fused_form`): the tabular MLP (every tabular preset
and table) and the clinical LSTM of hard sharing (`model.architecture` hps; its LSTM unrolled:
`relif_ray.models.clinical.unrolled_lstm`). The others are looped."""


def fused_form(
    config: ExperimentConfig, device_type: str = "cpu"
) -> Literal["stacked", "looped", "streamed"]:
    """How `config`'s seeds are fused on a device of `device_type` (the run's resolved
    device): "streamed" on CUDA (`fusion_refusal` lets only `STREAMED_DATASETS` get there);
    on the CPU "stacked" (one vmapped forward and one backward for all seeds) where the model
    is stacked (`STACKED_DATASETS`), the method is a loss weighting or a gradient aggregation
    on the shared parameters and no fast-path field acts on one model (torch.compile, bf16
    autocast, channels-last); "looped" otherwise: GradNorm and DB-MTL take their per-task
    passes inside their own backward, the representation gradient source backpropagates
    through the encoder after a solve, and the fast-path fields act on each seed's own
    model."""
    if device_type == "cuda":
        return "streamed"
    method = methods().get(config.method.name)
    train = config.train
    stacked = (
        config.data.dataset in STACKED_DATASETS
        and (config.data.dataset == "tabular" or config.model.architecture == "hps")
        and config.method.gradient_source == "parameters"
        and method is not None
        and issubclass(method, LossWeighting | GradientAggregator)
        and not (train.compile or train.compile_relif or train.channels_last)
        and train.precision == "fp32"
    )
    return "stacked" if stacked else "looped"


STREAMED_DATASETS = ("nyuv2",)
"""The benchmarks whose fused trials may train on a CUDA GPU (streamed, `FusedTrainingRun`):
NYUv2, whose models draw no random numbers on the device while they train."""


def fusion_refusal(config: ExperimentConfig) -> str | None:
    """Why `config`'s seeds cannot be trained as one fused trial, completing
    "train.fused_seeds: ..."; None where they can: every benchmark, method and field on the
    CPU, and NYUv2 on a GPU. On CUDA (and "auto", a GPU sweep's device) the other benchmarks
    are refused: their dropout draws its masks from the process's one CUDA generator (its
    fused kernel's Philox stream), not each seed's own, so a seed would not train as its
    trial."""
    if config.device != "cpu" and config.data.dataset not in STREAMED_DATASETS:
        return (
            f"fused trials of {config.data.dataset} run on the CPU (device {config.device}: "
            "on CUDA the seeds' dropout would share the process's one generator)"
        )
    return None


def check_fusable(configs: Sequence[ExperimentConfig]) -> None:
    """Refuse, in one line, seeds that cannot be one fused trial: a config `fusion_refusal`
    refuses, or configs that differ in more than their seed and their same-seed squash
    constants."""
    if not configs:
        raise ValueError("a fused run trains at least one seed")
    reason = fusion_refusal(configs[0])
    if reason is not None:
        raise UserError(f"config field train.fused_seeds: {reason}")
    first = setting_of(configs[0])
    for config in configs[1:]:
        if setting_of(config) != first:
            raise UserError(
                "config field train.fused_seeds: the fused seeds' configs differ beyond their "
                f"seed (seeds {configs[0].seed} and {config.seed})"
            )
    seeds = [config.seed for config in configs]
    if len(set(seeds)) != len(seeds):
        raise UserError(f"config field train.fused_seeds: a seed repeats in {seeds}")


def setting_of(config: ExperimentConfig) -> dict:
    """What the fused seeds must share: the config without its seed and squash constants."""
    values = config.to_dict()
    values.pop("seed")
    values["relif"] = {k: v for k, v in values["relif"].items() if k != "squash_constants"}
    return values
