"""NYUv2: 13-class segmentation, depth and surface normals on a ResNet encoder with heads."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from relif_ray.data.nyuv2 import check_nyuv2, read_nyuv2, train_count
from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2
from relif_ray.models.architectures import build_dense_model
from relif_ray.problems import (
    SEED_OPTION,
    Benchmark,
    DatasetDefaults,
    DataWriter,
    Problem,
    ReportMetric,
    TensorSplit,
    WriterOption,
)
from relif_ray.tasks.nyuv2 import nyuv2_tasks


def load_nyuv2(root: str) -> Problem:
    """NYUv2 in the MTAN/LibMTL layout, held in memory.

    Segmentation labels (-1..12) are held as int8, an eighth of the reader's int64 and
    lossless; the tasks cast them where they index (cross-entropy, confusion matrix). Images,
    depth and normals stay float32: they are not integral, so a smaller dtype would round them.
    The model's gates (expert architectures) are sized for the data's images.
    """
    splits = {}
    arrays_by_split = read_nyuv2(root)
    for name, arrays in arrays_by_split.items():
        splits[name] = TensorSplit(
            {
                "input": arrays["image"],
                "seg": arrays["label"].to(torch.int8),
                "depth": arrays["depth"],
                "normal": arrays["normal"],
                "example_id": arrays["example_id"],
            }
        )
    image_shape = tuple(arrays_by_split["train"]["image"].shape[1:])
    model = functools.partial(build_dense_model, image_shape=image_shape)
    return Problem("nyuv2", nyuv2_tasks(), splits, model)


DEFAULTS = DatasetDefaults(
    dataset="nyuv2",
    seeds=7,
    backbone="resnet50",
    batch_size=8,
    lr=1e-4,
    epochs=200,
    r_star=0.24,
    eta=1e-3,
    paper_eta=True,
    delta=0.2,
    demo_data={"train": 48, "val": 24, "height": 48, "width": 64},
    demo_train={
        "steps": 240,
        "batch_size": 8,
        "lr": 1e-3,
        "backbone": "resnet18",
        "seeds": 2,
        "methods": "erm,relif",
    },
    gpu_config={
        "train.precision": "bf16",
        "train.channels_last": True,
        "train.data_on_device": True,
    },
)
"""NYUv2: ResNet50, 7 seeds, r* = 0.24, eta = 1e-3 (paper Table 5); Adam lr 1e-4, batch 8,
200 epochs (LibMTL's NYUv2 setting; the paper only says "the same budget for every method").
On a GPU trials run the fast path (bf16 forward, channels-last, every split on the GPU, and
with `train.cuda_graph: auto` the whole step as one CUDA graph where the method allows).
delta = 0.2 for the live Bias is our choice: the paper's delta_p75/delta_p50 come from a
reference validation distribution that exists only after the ERM runs, so delta_ref is None
and `relif report` calibrates it on ERM's trials."""

BENCHMARK = Benchmark(
    load=load_nyuv2,
    tasks=nyuv2_tasks,
    defaults=DEFAULTS,
    train_examples=lambda root: train_count(root) if (Path(root) / "train").is_dir() else None,
    synthetic=DataWriter(
        write=write_synthetic_nyuv2,
        help="synthetic rooms in the NYUv2 layout (image, 13-class label, depth, normal)",
        options=(
            WriterOption("train", int, 795, "number of train examples (default 795)"),
            WriterOption("val", int, 654, "number of val examples (default 654)"),
            WriterOption("height", int, 288, "image height in pixels (default 288)"),
            WriterOption("width", int, 384, "image width in pixels (default 384)"),
            SEED_OPTION,
        ),
    ),
    check=check_nyuv2,
    model=build_dense_model,
    report_metrics=(
        ReportMetric("seg_miou", "Seg mIoU", "Seg mIoU"),
        ReportMetric("depth_rmse", "Depth RMSE", "Depth RMSE"),
        ReportMetric("normal_angle_mean", "Normal mean", "Normal mean"),
    ),
    delta_m_metrics=(
        "seg_miou",
        "seg_pixel_acc",
        "depth_abs_err",
        "depth_rel_err",
        "normal_angle_mean",
        "normal_angle_median",
        "normal_within_11.25",
        "normal_within_22.5",
        "normal_within_30",
    ),
)
"""The paper's main NYUv2 table reports mIoU, depth RMSE and the mean normal angle. Delta-M%
averages the nine metrics of LibMTL's and the MTL literature's NYUv2 tables (depth RMSE, which
they do not report, stays out of it), so that it sits beside theirs."""
