"""Synthetic rooms written in the NYUv2 layout, with geometrically consistent targets.

Each example is a box-shaped room (floor, ceiling, four walls) with a few axis-aligned boxes
standing on the floor (bed, chair, furniture, sofa, table, objects), small boxes on top of them
(books, objects) and flat rectangles on the walls (painting, window, tv), seen through a pinhole
camera and rendered by vectorised numpy ray casting. For every pixel the ray's first hit gives

- depth: z-depth of the hit point in metres (the camera ray is scaled to z = 1, so the ray
  parameter is the z-depth), about 0.5-10 m like NYUv2;
- normal: the unit normal of the hit face in camera coordinates, pointing towards the camera;
- label: the NYUv2 13-class id of the hit surface (`CLASS_NAMES`);
- image: the class's base colour (varied slightly per scene) times Lambertian shading
  `AMBIENT + (1 - AMBIENT) * max(0, n . light)` plus Gaussian noise, clipped to [0, 1].

So depth, normals and labels follow from one geometry, and the label is predictable from the
colour. A few small rectangles per image are made invalid like real Kinect data: depth and
normal both 0 there (missing depth), and, independently, label -1 (unlabelled).

Conventions. World: x right, y up, z forward; the room spans x in [-W/2, W/2], y in [0, H],
z in [0, D]. Camera frame: x right, y up, z forward (viewing direction), so the floor normal
in camera coordinates is close to (0, +1, 0) for a level camera. Image rows go downwards.

Determinism: the examples of split k ("train" = 0, "val" = 1) are drawn in order from
`np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(k,)))`, so the output is a
function of the seed, and the val scenes do not change with the number of train scenes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from relif_ray.data.atomic_dir import atomic_directory
from relif_ray.errors import UserError
from relif_ray.progress import progress

CLASS_NAMES = (
    "bed", "books", "ceiling", "chair", "floor", "furniture", "objects",
    "painting", "sofa", "table", "tv", "wall", "window",
)  # fmt: skip
CLASS_ID = {name: index for index, name in enumerate(CLASS_NAMES)}
IGNORE_LABEL = -1

# Base RGB colour per class (rows in CLASS_NAMES order), chosen with distinct hues.
CLASS_COLOURS = np.array(
    [
        [0.75, 0.55, 0.85],  # bed: lavender
        [0.85, 0.20, 0.20],  # books: red
        [0.95, 0.95, 0.92],  # ceiling: off-white
        [0.20, 0.60, 0.25],  # chair: green
        [0.55, 0.38, 0.22],  # floor: brown
        [0.30, 0.35, 0.75],  # furniture: blue
        [0.95, 0.60, 0.10],  # objects: orange
        [0.80, 0.15, 0.55],  # painting: magenta
        [0.15, 0.55, 0.60],  # sofa: teal
        [0.85, 0.80, 0.30],  # table: yellow
        [0.08, 0.08, 0.10],  # tv: black
        [0.78, 0.74, 0.66],  # wall: beige
        [0.55, 0.80, 0.95],  # window: sky blue
    ]
)

HORIZONTAL_FOV_DEG = 60.0
AMBIENT = 0.35
COLOUR_VARIATION = 0.05
NOISE_STD = 0.02
SPLITS = ("train", "val")

# World normal of each face code 2k + s: axis k, s = 0 for -e_k, s = 1 for +e_k.
FACE_NORMALS = np.array(
    [[-1, 0, 0], [1, 0, 0], [0, -1, 0], [0, 1, 0], [0, 0, -1], [0, 0, 1]], dtype=float
)
FLOOR_FACE, CEILING_FACE = 3, 2

# Size ranges (min, max) in metres for (x extent, height, z extent) of boxes on the floor.
FLOOR_BOX_SIZES = {
    "bed": ((1.4, 2.0), (0.4, 0.6), (1.9, 2.1)),
    "chair": ((0.4, 0.55), (0.8, 1.0), (0.4, 0.55)),
    "furniture": ((0.6, 1.5), (0.8, 2.0), (0.35, 0.6)),
    "sofa": ((1.6, 2.2), (0.7, 0.9), (0.8, 1.0)),
    "table": ((0.8, 1.6), (0.7, 0.78), (0.6, 1.0)),
    "objects": ((0.2, 0.5), (0.2, 0.6), (0.2, 0.5)),
}
# Small boxes that stand on top of a floor box.
TOP_BOX_SIZES = {
    "books": ((0.15, 0.3), (0.15, 0.3), (0.15, 0.25)),
    "objects": ((0.1, 0.3), (0.1, 0.35), (0.1, 0.3)),
}
# Wall rectangles: (width range, height range, centre-height range) in metres.
WALL_RECTANGLE_SIZES = {
    "painting": ((0.4, 1.2), (0.3, 0.9), (1.3, 1.8)),
    "window": ((0.8, 1.6), (0.8, 1.2), (1.3, 1.7)),
    "tv": ((0.8, 1.3), (0.5, 0.75), (1.0, 1.5)),
}


@dataclass(frozen=True)
class Box:
    """An axis-aligned box in world coordinates."""

    low: np.ndarray
    high: np.ndarray
    label: int


@dataclass(frozen=True)
class WallRectangle:
    """A flat rectangle on a wall: the wall is `axis` = 0 (x = +-W/2) or 2 (z = D), `side` = +-1.

    `across` is the range along the wall (z for side walls, x for the back wall), `vertical` the
    range of y.
    """

    axis: int
    side: int
    across: tuple[float, float]
    vertical: tuple[float, float]
    label: int


@dataclass(frozen=True)
class Scene:
    """Everything that determines one rendered example except the pixel noise and holes."""

    room: np.ndarray  # (width, height, depth) in metres
    camera_position: np.ndarray  # (3,) world
    camera_to_world: np.ndarray  # (3, 3) rotation, camera column vectors -> world
    light: np.ndarray  # (3,) unit world direction towards the light
    colours: np.ndarray  # (13, 3) per-scene class colours
    boxes: tuple[Box, ...]
    rectangles: tuple[WallRectangle, ...]


def write_synthetic_nyuv2(
    out: str | Path,
    *,
    train: int,
    val: int,
    height: int,
    width: int,
    seed: int,
    overwrite: bool = False,
) -> Path:
    """Write `train` + `val` synthetic examples of `height` x `width` to `out`; return its path.

    The data set is written to a temporary directory next to `out` and renamed into place, so
    an interrupted run never leaves a half-written data set. An existing non-empty `out` is
    refused unless `overwrite`; even then only a directory that holds nothing but split folders
    (train/val/test) is replaced, so a mistyped path cannot delete unrelated files.
    """
    for name, value in (("train", train), ("val", val), ("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UserError(f"synthetic NYUv2 {name}: must be a positive integer, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UserError(f"synthetic NYUv2 seed: must be a non-negative integer, got {seed!r}")
    replaceable = frozenset({"train", "val", "test"})
    with atomic_directory(out, overwrite=overwrite, replaceable=replaceable) as staging:
        for split_number, (split, count) in enumerate(zip(SPLITS, (train, val), strict=True)):
            rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(split_number,)))
            _write_split(staging / split, rng, count, height, width)
    return Path(out)


def pinhole_rays(height: int, width: int) -> np.ndarray:
    """(H, W, 3) camera-frame ray through each pixel centre, scaled so that its z is 1.

    The focal length gives a horizontal field of view of `HORIZONTAL_FOV_DEG`; a point at ray
    parameter t is at z-depth t.
    """
    right, up = _pixel_offsets(height, width)
    rays = np.empty((height, width, 3))
    rays[..., 0] = right[None, :]
    rays[..., 1] = up[:, None]
    rays[..., 2] = 1.0
    return rays


def focal_length(width: int) -> float:
    """Focal length in pixels for the horizontal field of view `HORIZONTAL_FOV_DEG`."""
    return (width / 2) / np.tan(np.radians(HORIZONTAL_FOV_DEG) / 2)


def _pixel_offsets(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """x/z of each column's and y/z of each row's pixel centre (rows go downwards)."""
    focal = focal_length(width)
    right = (np.arange(width) + 0.5 - width / 2) / focal
    up = -(np.arange(height) + 0.5 - height / 2) / focal
    return right, up


def draw_scene(rng: np.random.Generator) -> Scene:
    """Draw room, camera, light, colours, boxes and wall rectangles of one scene."""
    room = np.array([rng.uniform(3.5, 6.0), rng.uniform(2.5, 3.2), rng.uniform(4.0, 8.0)])
    camera_position = np.array(
        [rng.uniform(-room[0] / 4, room[0] / 4), rng.uniform(1.0, 1.6), rng.uniform(0.1, 0.5)]
    )
    yaw = np.radians(rng.uniform(-20.0, 20.0))
    pitch = np.radians(rng.uniform(-20.0, 5.0))
    azimuth = np.pi + rng.uniform(-1.2, 1.2)  # light comes from behind/beside the camera
    elevation = rng.uniform(np.radians(35.0), np.radians(75.0))
    light = np.array(
        [
            np.cos(elevation) * np.sin(azimuth),
            np.sin(elevation),
            np.cos(elevation) * np.cos(azimuth),
        ]
    )
    variation = 1.0 + COLOUR_VARIATION * rng.standard_normal(CLASS_COLOURS.shape)
    colours = np.clip(CLASS_COLOURS * variation, 0.0, 1.0)
    floor_boxes = _draw_floor_boxes(rng, room, camera_position[2])
    top_boxes = _draw_top_boxes(rng, floor_boxes)
    return Scene(
        room=room,
        camera_position=camera_position,
        camera_to_world=_yaw_rotation(yaw) @ _pitch_rotation(pitch),
        light=light,
        colours=colours,
        boxes=floor_boxes + top_boxes,
        rectangles=_draw_wall_rectangles(rng, room),
    )


def render_scene(scene: Scene, height: int, width: int) -> dict[str, np.ndarray]:
    """Ray-cast `scene`: noise-free image (H,W,3), label (H,W), depth (H,W,1), normal (H,W,3).

    Rays are held as (3, H, W) float32 arrays (one plane per axis) so that every step is an
    elementwise numpy operation; each box is only tested inside its projected screen window.
    """
    rays = _world_rays(scene, height, width)
    # Face code of the face a ray would hit along each axis: its normal opposes the ray.
    axis_faces = (2 * np.arange(3, dtype=np.int8))[:, None, None] + (rays < 0)
    origin = scene.camera_position
    depth, face, label = _hit_room(scene, origin, rays, axis_faces)
    for box in scene.boxes:
        window = _screen_window(box, scene, height, width)
        if window is None:
            continue
        planes = (slice(None), *window)
        box_depth, box_face = _hit_box(box, origin, rays[planes], axis_faces[planes])
        nearer = box_depth < depth[window]
        depth[window][nearer] = box_depth[nearer]
        face[window][nearer] = box_face[nearer]
        label[window][nearer] = box.label
    shading = AMBIENT + (1.0 - AMBIENT) * np.clip(FACE_NORMALS @ scene.light, 0.0, None)
    # Colour of every (class, face) pair, gathered once per pixel.
    shaded_colours = (scene.colours[:, None, :] * shading[None, :, None]).astype(np.float32)
    camera_normals = (FACE_NORMALS @ scene.camera_to_world).astype(np.float32)  # row f: R^T n_f
    return {
        "image": shaded_colours.reshape(-1, 3)[label * len(FACE_NORMALS) + face],
        "label": label,
        "depth": depth[..., None],
        "normal": camera_normals[face],
    }


def _world_rays(scene: Scene, height: int, width: int) -> np.ndarray:
    """(3, H, W) float32 world direction of each pixel's ray (camera z component 1)."""
    right, up = _pixel_offsets(height, width)
    rotation = scene.camera_to_world
    rays = np.empty((3, height, width), dtype=np.float32)
    for k in range(3):
        rays[k] = rotation[k, 0] * right[None, :] + rotation[k, 1] * up[:, None] + rotation[k, 2]
    rays[rays == 0] = 1e-12  # keep the slab divisions finite
    return rays


def _screen_window(box: Box, scene: Scene, height: int, width: int) -> tuple | None:
    """(rows, cols) slices that contain every pixel whose ray can hit `box`; None if none.

    A box wholly in front of the camera projects into the convex hull of its projected
    corners, so their bounding rectangle (plus a pixel of margin) is enough; a box reaching
    behind the camera plane gets the whole image.
    """
    corners = np.array(list(itertools.product(*zip(box.low, box.high, strict=True))))
    camera = (corners - scene.camera_position) @ scene.camera_to_world  # rows R^T (c - o)
    if (camera[:, 2] <= 1e-3).any():
        return slice(None), slice(None)
    focal = focal_length(width)
    cols = focal * camera[:, 0] / camera[:, 2] + width / 2 - 0.5
    rows = -focal * camera[:, 1] / camera[:, 2] + height / 2 - 0.5
    first_col, last_col = max(int(np.floor(cols.min())) - 1, 0), min(int(cols.max()) + 2, width)
    first_row, last_row = max(int(np.floor(rows.min())) - 1, 0), min(int(rows.max()) + 2, height)
    if first_col >= last_col or first_row >= last_row:
        return None
    return slice(first_row, last_row), slice(first_col, last_col)


def _write_split(
    folder: Path, rng: np.random.Generator, count: int, height: int, width: int
) -> None:
    for modality in ("image", "label", "depth", "normal"):
        (folder / modality).mkdir(parents=True)
    for index in progress(range(count), f"NYUv2 {folder.name}", unit="image"):
        example = render_scene(draw_scene(rng), height, width)
        image = example["image"] + NOISE_STD * rng.standard_normal(
            (height, width, 3), dtype=np.float32
        )
        missing_depth = _random_holes(rng, height, width)
        unlabelled = _random_holes(rng, height, width)
        arrays = {
            "image": np.clip(image, 0.0, 1.0, out=image),
            "label": example["label"].astype(np.float32),
            "depth": example["depth"],
            "normal": example["normal"],
        }
        arrays["label"][unlabelled] = IGNORE_LABEL
        arrays["depth"][missing_depth] = 0.0
        arrays["normal"][missing_depth] = 0.0
        for modality, array in arrays.items():
            np.save(folder / modality / f"{index}.npy", array)


def _hit_room(
    scene: Scene, origin: np.ndarray, rays: np.ndarray, axis_faces: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each ray leaves the room: ray parameter (H,W), face code (H,W), class (H,W)."""
    low = (-scene.room[0] / 2, 0.0, 0.0)
    high = (scene.room[0] / 2, scene.room[1], scene.room[2])
    exits = [
        np.where(rays[k] > 0, np.float32(high[k] - origin[k]), np.float32(low[k] - origin[k]))
        / rays[k]
        for k in range(3)
    ]
    depth = np.minimum(np.minimum(exits[0], exits[1]), exits[2])
    face = _first_face(exits, depth, axis_faces)
    label = np.full(depth.shape, CLASS_ID["wall"])
    label[face == FLOOR_FACE] = CLASS_ID["floor"]
    label[face == CEILING_FACE] = CLASS_ID["ceiling"]
    hit_points = [float(origin[k]) + depth * rays[k] for k in range(3)]
    for rectangle in scene.rectangles:
        across = hit_points[2 if rectangle.axis == 0 else 0]
        inside = (
            (face == 2 * rectangle.axis + (rectangle.side < 0))
            & (across >= rectangle.across[0])
            & (across <= rectangle.across[1])
            & (hit_points[1] >= rectangle.vertical[0])
            & (hit_points[1] <= rectangle.vertical[1])
        )
        label[inside] = rectangle.label
    return depth, face, label


def _hit_box(
    box: Box, origin: np.ndarray, rays: np.ndarray, axis_faces: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Slab test: ray parameter of the entry point (inf on a miss) and the entry face code."""
    entries, leaves = [], []
    for k in range(3):
        to_low = np.float32(box.low[k] - origin[k]) / rays[k]
        to_high = np.float32(box.high[k] - origin[k]) / rays[k]
        entries.append(np.minimum(to_low, to_high))
        leaves.append(np.maximum(to_low, to_high))
    entry = np.maximum(np.maximum(entries[0], entries[1]), entries[2])
    leave = np.minimum(np.minimum(leaves[0], leaves[1]), leaves[2])
    hit = (entry <= leave) & (entry > 0)
    return np.where(hit, entry, np.inf), _first_face(entries, entry, axis_faces)


def _first_face(per_axis: list, chosen: np.ndarray, axis_faces: np.ndarray) -> np.ndarray:
    """Face code of the (first) axis whose ray parameter in `per_axis` equals `chosen`."""
    return np.where(
        per_axis[0] == chosen,
        axis_faces[0],
        np.where(per_axis[1] == chosen, axis_faces[1], axis_faces[2]),
    )


def _draw_floor_boxes(rng: np.random.Generator, room: np.ndarray, camera_z: float) -> tuple:
    names = list(FLOOR_BOX_SIZES)
    boxes = []
    for _ in range(rng.integers(2, 7)):
        name = names[rng.integers(len(names))]
        size = np.array([rng.uniform(*bounds) for bounds in FLOOR_BOX_SIZES[name]])
        if rng.random() < 0.5:
            size[[0, 2]] = size[[2, 0]]
        x = rng.uniform(-room[0] / 2, room[0] / 2 - size[0])
        z = rng.uniform(camera_z + 1.0, room[2] - size[2])  # the camera is never inside a box
        low = np.array([x, 0.0, z])
        boxes.append(Box(low=low, high=low + size, label=CLASS_ID[name]))
    return tuple(boxes)


def _draw_top_boxes(rng: np.random.Generator, floor_boxes: tuple) -> tuple:
    names = list(TOP_BOX_SIZES)
    boxes = []
    for _ in range(rng.integers(1, 5)):
        support = floor_boxes[rng.integers(len(floor_boxes))]
        name = names[rng.integers(len(names))]
        size = np.array([rng.uniform(*bounds) for bounds in TOP_BOX_SIZES[name]])
        footprint = support.high - support.low
        size[[0, 2]] = np.minimum(size[[0, 2]], footprint[[0, 2]])
        x = support.low[0] + rng.uniform(0.0, footprint[0] - size[0])
        z = support.low[2] + rng.uniform(0.0, footprint[2] - size[2])
        low = np.array([x, support.high[1], z])
        boxes.append(Box(low=low, high=low + size, label=CLASS_ID[name]))
    return tuple(boxes)


def _draw_wall_rectangles(rng: np.random.Generator, room: np.ndarray) -> tuple:
    names = list(WALL_RECTANGLE_SIZES)
    walls = ((2, 1), (0, -1), (0, 1))  # back wall, left wall, right wall
    rectangles = []
    for _ in range(rng.integers(1, 5)):
        name = names[rng.integers(len(names))]
        axis, side = walls[rng.integers(len(walls))]
        width_range, height_range, centre_range = WALL_RECTANGLE_SIZES[name]
        size_across, size_up = rng.uniform(*width_range), rng.uniform(*height_range)
        centre_up = min(rng.uniform(*centre_range), room[1] - 0.1 - size_up / 2)
        across_low, across_high = (1.0, room[2]) if axis == 0 else (-room[0] / 2, room[0] / 2)
        start = rng.uniform(across_low, across_high - size_across)
        rectangles.append(
            WallRectangle(
                axis=axis,
                side=side,
                across=(start, start + size_across),
                vertical=(centre_up - size_up / 2, centre_up + size_up / 2),
                label=CLASS_ID[name],
            )
        )
    return tuple(rectangles)


def _random_holes(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Boolean (H, W) mask of 0-3 small random rectangles (each 2.5-10% of the image side)."""
    mask = np.zeros((height, width), dtype=bool)
    for _ in range(rng.integers(0, 4)):
        hole_height = max(1, round(height * rng.uniform(0.025, 0.1)))
        hole_width = max(1, round(width * rng.uniform(0.025, 0.1)))
        top = rng.integers(0, height - hole_height + 1)
        left = rng.integers(0, width - hole_width + 1)
        mask[top : top + hole_height, left : left + hole_width] = True
    return mask


def _yaw_rotation(angle: float) -> np.ndarray:
    """Turn about the world y axis; positive turns the view towards +x."""
    cos, sin = np.cos(angle), np.sin(angle)
    return np.array([[cos, 0.0, sin], [0.0, 1.0, 0.0], [-sin, 0.0, cos]])


def _pitch_rotation(angle: float) -> np.ndarray:
    """Turn about the camera x axis; positive tilts the view up."""
    cos, sin = np.cos(angle), np.sin(angle)
    return np.array([[1.0, 0.0, 0.0], [0.0, cos, sin], [0.0, -sin, cos]])
