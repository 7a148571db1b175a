"""Synthetic NYUv2 writer, NYUv2 reader and `relif make-data`."""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from relif_ray.cli import make_data as cli_data
from relif_ray.data import synthetic_nyuv2
from relif_ray.data.nyuv2 import MODALITIES, read_nyuv2, read_nyuv2_split
from relif_ray.data.synthetic_nyuv2 import CLASS_ID, pinhole_rays, write_synthetic_nyuv2
from relif_ray.errors import UserError

FLOOR, CEILING, WALL = CLASS_ID["floor"], CLASS_ID["ceiling"], CLASS_ID["wall"]
WALL_MOUNTED = [CLASS_ID[name] for name in ("painting", "tv", "window")]
FLOOR_STANDING = [CLASS_ID[name] for name in ("bed", "chair", "furniture", "sofa", "table")]


def _tiny(root: Path, **sizes: int) -> Path:
    options = {"train": 3, "val": 2, "height": 8, "width": 10, "seed": 0} | sizes
    return write_synthetic_nyuv2(root, **options)


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """Train split of 24 scenes at 48x64, as HxW-last numpy arrays plus camera-frame points."""
    root = _tiny(tmp_path_factory.mktemp("scenes") / "nyuv2", train=24, height=48, width=64)
    split = read_nyuv2_split(root, "train")
    depth = split["depth"][:, 0].numpy()
    return {
        "image": split["image"].permute(0, 2, 3, 1).numpy(),
        "label": split["label"].numpy(),
        "depth": depth,
        "normal": split["normal"].permute(0, 2, 3, 1).numpy(),
        "points": depth[..., None] * pinhole_rays(48, 64)[None],
    }


def _floor_normal(normal: np.ndarray, label: np.ndarray, depth: np.ndarray) -> np.ndarray:
    floor = (label == FLOOR) & (depth > 0)
    assert floor.sum() > 20, "every generated room shows some floor"
    return normal[floor][0]


# ----- writer: determinism and layout -----


def _file_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.npy"))}


def test_same_seed_gives_identical_bytes_and_another_seed_differs(tmp_path: Path) -> None:
    first = _file_bytes(_tiny(tmp_path / "a", seed=5))
    again = _file_bytes(_tiny(tmp_path / "b", seed=5))
    other = _file_bytes(_tiny(tmp_path / "c", seed=6))
    assert first == again
    assert first.keys() == other.keys()
    assert all(first[name] != other[name] for name in first if "/image/" in name)


def test_val_scenes_do_not_depend_on_the_number_of_train_scenes(tmp_path: Path) -> None:
    few = _file_bytes(_tiny(tmp_path / "few", train=1) / "val")
    many = _file_bytes(_tiny(tmp_path / "many", train=4) / "val")
    assert few == many


def test_layout_dtypes_and_shapes(tmp_path: Path) -> None:
    root = _tiny(tmp_path / "nyuv2", train=3, val=2, height=8, width=10)
    assert sorted(p.name for p in root.iterdir()) == ["train", "val"]
    for split, count in (("train", 3), ("val", 2)):
        for modality, shape in zip(
            MODALITIES, [(8, 10, 3), (8, 10), (8, 10, 1), (8, 10, 3)], strict=True
        ):
            folder = root / split / modality
            assert sorted(p.name for p in folder.iterdir()) == [f"{i}.npy" for i in range(count)]
            for i in range(count):
                array = np.load(folder / f"{i}.npy")
                assert array.shape == shape and array.dtype == np.float32
    assert not [p for p in tmp_path.iterdir() if p.name != "nyuv2"], "no staging folder left"


# ----- writer: geometry -----


def test_floor_and_ceiling_are_planes_at_camera_height_and_room_height(scenes) -> None:
    for label, depth, normal, points in zip(
        scenes["label"], scenes["depth"], scenes["normal"], scenes["points"], strict=True
    ):
        up = _floor_normal(normal, label, depth)
        assert up[1] > np.cos(np.radians(20.0)) - 1e-6  # pitch is at most 20 degrees
        floor = (label == FLOOR) & (depth > 0)
        np.testing.assert_allclose(
            normal[floor], np.broadcast_to(up, normal[floor].shape), atol=1e-6
        )
        # n . p = -(camera height above the floor) for every floor point.
        floor_offset = points[floor] @ up
        assert np.ptp(floor_offset) < 1e-3
        assert -1.6 - 1e-3 <= floor_offset[0] <= -1.0 + 1e-3
        ceiling = (label == CEILING) & (depth > 0)
        if ceiling.any():
            np.testing.assert_allclose(
                normal[ceiling], np.broadcast_to(-up, normal[ceiling].shape), atol=1e-6
            )
            ceiling_offset = points[ceiling] @ -up
            assert np.ptp(ceiling_offset) < 1e-3
            room_height = -(floor_offset[0] + ceiling_offset[0])
            assert 2.5 - 1e-3 <= room_height <= 3.2 + 1e-3


def test_valid_normals_are_unit_room_axes_facing_the_camera(scenes) -> None:
    for depth, normal, points in zip(
        scenes["depth"], scenes["normal"], scenes["points"], strict=True
    ):
        valid = depth > 0
        assert ((normal == 0).all(axis=-1) == ~valid).all(), "depth and normal invalid together"
        np.testing.assert_allclose(np.linalg.norm(normal[valid], axis=-1), 1.0, atol=1e-5)
        assert (np.einsum("pc,pc->p", normal[valid], points[valid]) < 0).all()
        assert (depth[valid] > 0.5).all() and (depth[valid] < 10.0).all()
        # Every surface is axis-aligned in the room: at most 6 normals, pairwise 0 or opposite.
        axes = np.unique(np.round(normal[valid], 4), axis=0)
        assert len(axes) <= 6
        cosines = axes @ axes.T
        assert (
            np.isclose(np.abs(cosines), 0, atol=1e-3).sum()
            + np.isclose(np.abs(cosines), 1, atol=1e-3).sum()
            == cosines.size
        )


def test_classes_follow_surface_type(scenes) -> None:
    for label, depth, normal, points in zip(
        scenes["label"], scenes["depth"], scenes["normal"], scenes["points"], strict=True
    ):
        up = _floor_normal(normal, label, depth)
        valid = depth > 0
        facing_up = valid & (normal @ up > 1 - 1e-4)
        vertical = valid & (np.abs(normal @ up) < 1e-4)
        on_wall = np.isin(label, [WALL, *WALL_MOUNTED])
        assert vertical[valid & on_wall].all(), "walls and what hangs on them are vertical"
        assert facing_up[valid & (label == FLOOR)].all()
        assert (normal[valid & (label == CEILING)] @ up < -1 + 1e-4).all()
        furniture = valid & np.isin(label, FLOOR_STANDING)
        assert (facing_up | vertical)[furniture].all(), "boxes show tops and sides only"
        # Upward-facing points at floor level are floor (box tops are higher up).
        floor_level = facing_up & np.isclose(points @ up, points[label == FLOOR][0] @ up, atol=1e-3)
        assert np.isin(label[floor_level], [FLOOR, -1]).all()


def test_all_classes_occur_and_holes_are_small(scenes) -> None:
    assert set(np.unique(scenes["label"])) == set(range(-1, 13))
    assert 0 < (scenes["label"] == -1).mean() < 0.1
    assert 0 < (scenes["depth"] == 0).mean() < 0.1
    assert scenes["image"].min() >= 0 and scenes["image"].max() <= 1


def test_image_colour_predicts_the_label(tmp_path: Path) -> None:
    data = read_nyuv2(_tiny(tmp_path / "nyuv2", train=8, val=8, height=32, width=40))

    def labelled_pixels(split: str) -> tuple[np.ndarray, np.ndarray]:
        colours = data[split]["image"].permute(0, 2, 3, 1).reshape(-1, 3).numpy()
        labels = data[split]["label"].reshape(-1).numpy()
        return colours[labels >= 0], labels[labels >= 0]

    train_x, train_y = labelled_pixels("train")
    val_x, val_y = labelled_pixels("val")
    accuracy = LogisticRegression(max_iter=2000).fit(train_x, train_y).score(val_x, val_y)
    majority = np.bincount(val_y).max() / len(val_y)
    assert accuracy > majority + 0.2


def test_hand_built_scene_matches_closed_forms() -> None:
    """Level camera at (0, 1.5, 1) looking down +z into a 4 x 3 x 6 m room."""
    scene = synthetic_nyuv2.Scene(
        room=np.array([4.0, 3.0, 6.0]),
        camera_position=np.array([0.0, 1.5, 1.0]),
        camera_to_world=np.eye(3),
        light=np.array([0.0, 1.0, 0.0]),
        colours=synthetic_nyuv2.CLASS_COLOURS,
        boxes=(
            synthetic_nyuv2.Box(
                np.array([-0.5, 0, 3]), np.array([0.5, 0.75, 4]), CLASS_ID["table"]
            ),
        ),
        rectangles=(
            synthetic_nyuv2.WallRectangle(2, 1, (-0.5, 0.5), (1.2, 1.8), CLASS_ID["painting"]),
            synthetic_nyuv2.WallRectangle(0, 1, (2.0, 5.0), (1.0, 2.0), CLASS_ID["window"]),
        ),
    )
    out = synthetic_nyuv2.render_scene(scene, 48, 64)
    rays = pinhole_rays(48, 64)
    # (row, col): (class, camera-frame normal, z-depth)
    expected = {
        (23, 31): ("painting", (0, 0, -1), 5.0),  # back wall z = 6
        (47, 31): ("table", (0, 0, -1), 2.0),  # front face z = 3, below the table top
        (23, 63): ("window", (-1, 0, 0), 2.0 / rays[23, 63, 0]),  # right wall x = 2
        (23, 0): ("wall", (1, 0, 0), -2.0 / rays[23, 0, 0]),  # left wall x = -2
        (0, 31): ("ceiling", (0, -1, 0), 1.5 / rays[0, 31, 1]),  # ceiling y = 3
    }
    for (row, col), (name, normal, depth) in expected.items():
        assert out["label"][row, col] == CLASS_ID[name], (row, col)
        np.testing.assert_allclose(out["normal"][row, col], normal, atol=1e-6)
        np.testing.assert_allclose(out["depth"][row, col, 0], depth, rtol=1e-5)
        # Light from straight above: vertical faces and the ceiling get ambient light only.
        colour = synthetic_nyuv2.CLASS_COLOURS[CLASS_ID[name]] * synthetic_nyuv2.AMBIENT
        np.testing.assert_allclose(out["image"][row, col], colour, rtol=1e-5)


def test_screen_windows_do_not_change_the_rendering(monkeypatch) -> None:
    rng = np.random.default_rng(7)
    scene_list = [synthetic_nyuv2.draw_scene(rng) for _ in range(30)]
    windowed = [synthetic_nyuv2.render_scene(scene, 24, 32) for scene in scene_list]
    monkeypatch.setattr(synthetic_nyuv2, "_screen_window", lambda *_: (slice(None), slice(None)))
    for scene, fast in zip(scene_list, windowed, strict=True):
        full = synthetic_nyuv2.render_scene(scene, 24, 32)
        for name, array in full.items():
            np.testing.assert_array_equal(fast[name], array)


# ----- writer: arguments and atomic output -----


@pytest.mark.parametrize(
    "bad", [{"train": 0}, {"val": -1}, {"height": 2.5}, {"width": True}, {"seed": -3}]
)
def test_writer_rejects_bad_sizes(tmp_path: Path, bad: dict) -> None:
    name = next(iter(bad))
    with pytest.raises(UserError, match=name):
        _tiny(tmp_path / "nyuv2", **bad)
    assert not (tmp_path / "nyuv2").exists()


def test_writer_refuses_a_non_empty_out_unless_overwriting(tmp_path: Path) -> None:
    root = _tiny(tmp_path / "nyuv2", seed=1)
    before = _file_bytes(root)
    with pytest.raises(UserError, match="--force"):
        _tiny(root, seed=2)
    assert _file_bytes(root) == before
    write_synthetic_nyuv2(root, train=3, val=2, height=8, width=10, seed=2, overwrite=True)
    assert _file_bytes(root) == _file_bytes(_tiny(tmp_path / "fresh", seed=2))
    (tmp_path / "empty").mkdir()
    _tiny(tmp_path / "empty")  # an empty directory is fine


def test_overwrite_never_replaces_a_folder_with_other_files(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "thesis.tex").write_text("precious")
    with pytest.raises(UserError, match="refusing"):
        write_synthetic_nyuv2(
            tmp_path / "home", train=1, val=1, height=4, width=4, seed=0, overwrite=True
        )
    assert (tmp_path / "home" / "thesis.tex").read_text() == "precious"


def test_a_crash_leaves_neither_output_nor_staging_files(tmp_path: Path, monkeypatch) -> None:
    calls = []

    def failing_render(*args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("simulated crash")
        return render(*args)

    render = synthetic_nyuv2.render_scene
    monkeypatch.setattr(synthetic_nyuv2, "render_scene", failing_render)
    with pytest.raises(RuntimeError):
        _tiny(tmp_path / "nyuv2")
    assert list(tmp_path.iterdir()) == []


# ----- reader -----


def test_reader_round_trips_the_files(tmp_path: Path) -> None:
    root = _tiny(tmp_path / "nyuv2", height=6, width=7)
    shutil.copytree(root / "val", root / "test")
    data = read_nyuv2(root)
    assert sorted(data) == ["test", "train", "val"]
    split = data["train"]
    assert {k: (tuple(v.shape), v.dtype) for k, v in split.items()} == {
        "image": ((3, 3, 6, 7), torch.float32),
        "label": ((3, 6, 7), torch.int64),
        "depth": ((3, 1, 6, 7), torch.float32),
        "normal": ((3, 3, 6, 7), torch.float32),
        "example_id": ((3,), torch.int64),
    }
    assert split["example_id"].tolist() == [0, 1, 2]
    for i in range(3):
        for modality in MODALITIES:
            stored = np.load(root / "train" / modality / f"{i}.npy")
            expected = stored if modality == "label" else stored.transpose(2, 0, 1)
            np.testing.assert_array_equal(split[modality][i].numpy(), expected)
    assert torch.equal(data["test"]["image"], data["val"]["image"])


def test_reader_accepts_float64_images_and_integer_labels(tmp_path: Path) -> None:
    root = _tiny(tmp_path / "nyuv2")
    image_path, label_path = root / "train/image/1.npy", root / "train/label/1.npy"
    np.save(image_path, np.load(image_path).astype(np.float64))
    np.save(label_path, np.load(label_path).astype(np.int32))
    split = read_nyuv2_split(root, "train")
    assert split["image"].dtype == torch.float32 and split["label"].dtype == torch.int64
    assert split["label"][1].tolist() == np.load(label_path).tolist()


def _replace(relative: str, make: Callable[[np.ndarray], np.ndarray]):
    """A corruption that rewrites `relative` with `make(old array)` and blames that file."""

    def corrupt(root: Path) -> Path:
        path = root / relative
        np.save(path, make(np.load(path)), allow_pickle=True)
        return path

    return corrupt


def _write_bytes(relative: str, make: Callable[[bytes], bytes]):
    def corrupt(root: Path) -> Path:
        path = root / relative
        path.write_bytes(make(path.read_bytes()))
        return path

    return corrupt


def _remove(relative: str):
    def corrupt(root: Path) -> Path:
        path = root / relative
        shutil.rmtree(path) if path.is_dir() else path.unlink()
        return path

    return corrupt


def _move(relative: str, target: str):
    def corrupt(root: Path) -> Path:
        (root / relative).rename(root / target)
        return root / relative

    return corrupt


def _add(relative: str, source: str):
    def corrupt(root: Path) -> Path:
        shutil.copy(root / source, root / relative)
        return root / relative

    return corrupt


def _empty_folder(relative: str):
    def corrupt(root: Path) -> Path:
        for path in (root / relative).iterdir():
            path.unlink()
        return root / relative

    return corrupt


def _npz(relative: str):
    def corrupt(root: Path) -> Path:
        path = root / relative
        array = np.load(path)
        with path.open("wb") as file:
            np.savez(file, image=array)
        return path

    return corrupt


def _shrink_example(index: int):
    def corrupt(root: Path) -> Path:
        for modality in MODALITIES:
            path = root / "train" / modality / f"{index}.npy"
            np.save(path, np.load(path)[:-1])
        return root / "train" / "image" / f"{index}.npy"

    return corrupt


def _set_pixel(value: float):
    def make(array: np.ndarray) -> np.ndarray:
        array = array.copy()
        array.reshape(-1)[5] = value
        return array

    return make


def _set_normal(vector: tuple[float, float, float]):
    def make(array: np.ndarray) -> np.ndarray:
        array = array.copy()
        array[2, 3] = vector
        return array

    return make


MALFORMED = {
    "missing split": _remove("val"),
    "missing modality": _remove("train/depth"),
    "no files": _empty_folder("train/label"),
    "gap in indices": _move("train/image/1.npy", "train/image/7.npy"),
    "modality has fewer files": _remove("val/depth/1.npy"),
    "modality has more files": _add("train/normal/3.npy", "train/normal/0.npy"),
    "bad file name": _add("train/image/first.npy", "train/image/0.npy"),
    "garbage bytes": _write_bytes("train/label/1.npy", lambda _: b"not a numpy file"),
    "truncated": _write_bytes("train/depth/2.npy", lambda data: data[: len(data) // 2]),
    "pickled objects": _replace("train/image/0.npy", lambda _: np.array([{}], dtype=object)),
    "npz archive": _npz("val/image/1.npy"),
    "image 2-d": _replace("train/image/1.npy", lambda a: a[..., 0]),
    "image 4 channels": _replace(
        "train/image/1.npy", lambda a: np.concatenate([a, a[..., :1]], -1)
    ),
    "label 3-d": _replace("train/label/0.npy", lambda a: a[..., None]),
    "depth 2-d": _replace("train/depth/1.npy", lambda a: a[..., 0]),
    "depth 2 channels": _replace("train/depth/1.npy", lambda a: np.concatenate([a, a], -1)),
    "normal 2 channels": _replace("train/normal/2.npy", lambda a: a[..., :2]),
    "size differs within example": _replace("train/depth/1.npy", lambda a: a[:, :-1]),
    "size differs across examples": _shrink_example(2),
    "uint8 image": _replace("train/image/2.npy", lambda a: (a * 255).astype(np.uint8)),
    "nan image": _replace("train/image/1.npy", _set_pixel(np.nan)),
    "inf depth": _replace("train/depth/0.npy", _set_pixel(np.inf)),
    "nan normal": _replace("val/normal/0.npy", _set_pixel(np.nan)),
    "nan label": _replace("train/label/1.npy", _set_pixel(np.nan)),
    "fractional label": _replace("train/label/1.npy", _set_pixel(2.5)),
    "label 13": _replace("train/label/2.npy", lambda a: np.where(a == 11, 13, a)),
    "label -2": _replace("val/label/0.npy", lambda a: np.where(a == 11, -2, a)),
    "boolean label": _replace("train/label/0.npy", lambda a: a > 3),
    "negative depth": _replace("train/depth/1.npy", _set_pixel(-0.5)),
    "integer depth": _replace("train/depth/0.npy", lambda a: a.astype(np.int32)),
    "short normal": _replace("train/normal/1.npy", _set_normal((0.0, 0.5, 0.0))),
    "long normal": _replace("val/normal/1.npy", _set_normal((0.6, 0.8, 0.3))),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_data_gives_a_one_line_error_naming_the_file(tmp_path: Path, case: str) -> None:
    root = _tiny(tmp_path / "nyuv2")
    culprit = MALFORMED[case](root)
    with pytest.raises(UserError) as error:
        read_nyuv2(root)
    message = str(error.value)
    assert str(culprit) in message
    assert "\n" not in message


def test_missing_root_is_named(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no_such_dir"):
        read_nyuv2(tmp_path / "no_such_dir")


def test_normals_within_tolerance_of_unit_are_accepted(tmp_path: Path) -> None:
    root = _tiny(tmp_path / "nyuv2")
    _replace("train/normal/1.npy", _set_normal((0.0, 1.005, 0.0)))(root)
    read_nyuv2(root)


# ----- CLI -----


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="relif")
    cli_data.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["make-data", *argv])


def test_make_data_defaults_follow_nyuv2() -> None:
    args = _parse("nyuv2", "--out", "x")
    assert (args.train, args.val, args.height, args.width, args.seed) == (795, 654, 288, 384, 0)
    assert args.force is False


def test_make_data_writes_prints_and_refuses_to_overwrite(tmp_path: Path, capsys) -> None:
    out = tmp_path / "made"
    argv = [
        "nyuv2",
        "--out",
        str(out),
        "--train",
        "2",
        "--val",
        "1",
        "--height",
        "8",
        "--width",
        "10",
    ]
    args = _parse(*argv, "--seed", "3")
    assert args.handler(args) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert _file_bytes(out) == _file_bytes(
        write_synthetic_nyuv2(tmp_path / "direct", train=2, val=1, height=8, width=10, seed=3)
    )
    args = _parse(*argv, "--seed", "4")
    with pytest.raises(UserError, match="--force"):
        args.handler(args)
    args = _parse(*argv, "--seed", "4", "--force")
    assert args.handler(args) == 0
    assert read_nyuv2(out)["train"]["image"].shape == (2, 3, 8, 10)


def test_make_data_rejects_unknown_dataset(capsys) -> None:
    with pytest.raises(SystemExit) as error:
        _parse("cifar", "--out", "x")
    assert error.value.code == 2
    assert "cifar" in capsys.readouterr().err
