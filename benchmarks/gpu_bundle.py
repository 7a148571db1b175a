"""Build `.whl/`: the wheels a bare GPU machine with no network needs for `gpu_check.py`.

The lent GPU machine (`benchmarks/gpu_check.sh`) has Python 3.12 with torch and most of the
scientific stack and of Ray's own requirements, but not Ray, Optuna, tensorboardX, TorchJD and
its solvers or LibMTL, and it reaches no package index; only the working tree travels there (64
MiB in all). This script, run where the index is reachable, downloads the missing wheels for
CPython on manylinux x86_64 (`WHEELS`: one pinned version each, the tested ones, without their
dependencies) into `.whl/` (ignored by git; carry it). Ray's 79 MB wheel is mostly libraries a
Tune sweep never imports: `slim_wheel` repacks it without `RAY_UNUSED`, with a RECORD that
matches (about 40 MB).

    python benchmarks/gpu_bundle.py                      # .whl/ for the GPU machine
    python benchmarks/gpu_bundle.py --python-version 3.11 --out /tmp/whl311   # same set, 3.11
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
WHEELS = {
    "ray==2.60.0": "Ray Tune (slimmed, see RAY_UNUSED)",
    "jsonschema==4.26.0": "Ray",
    "jsonschema-specifications==2025.9.1": "jsonschema",
    "referencing==0.37.0": "jsonschema",
    "rpds-py==2026.9.1": "jsonschema, referencing",
    "tensorboardX==2.6.5": "ray[tune]: TensorBoard logs of every trial",
    "pydantic==2.14.4": "ray[tune]",
    "pydantic-core==2.50.5": "pydantic",
    "annotated-types==0.8.0": "pydantic",
    "typing-inspection==0.4.5": "pydantic",
    "typing-extensions==4.16.0": "pydantic-core needs a recent one",
    "packaging==26.4": "Ray needs >= 24.2",
    "optuna==5.0.0": "relif_ray.tuning.search (--search optuna)",
    "alembic==1.20.1": "optuna",
    "sqlalchemy==2.1.9": "optuna",
    "mako==1.4.3": "alembic",
    "colorlog==6.12.0": "optuna",
    "torchjd==0.18.0": "the TorchJD methods (the mtl extra) and their TorchJD rows",
    "quadprog==0.1.14": "torchjd: UPGrad and DualProj's dual-cone projection (mtl extra)",
    "cvxpy==1.9.3": "torchjd: Nash-MTL (mtl extra; its solvers other than ECOS are left out)",
    "ecos==2.0.14": "cvxpy: the solver Nash-MTL asks for",
    "qdldl==0.1.9.post1": "cvxpy imports it",
    "LibMTL==1.1.5": "the methods suite: the LibMTL rows of DWA and RLW",
    "fairlearn==0.15.0": "relif_ray.analysis.groups (imported with the analysis package)",
    "narwhals==2.29.0": "fairlearn needs >= 1.14; the image's version is not pinned",
    "setuptools==84.2.1": "gpu_check.sh's editable install of the project (pyproject needs >= 77)",
}
"""name==version: why it is needed. The GPU machine has the rest (`IMAGE_HAS`)."""
IMAGE_HAS = frozenset({
    "torch", "torchvision", "numpy", "scipy", "pandas", "pyarrow", "matplotlib", "statsmodels",
    "scikit-learn", "tqdm", "jinja2", "pyyaml",
})  # fmt: skip
"""The project's direct dependencies that the GPU machine's image holds (its package list, as
the device library's KINDS.md gives it, read 2026-11-17); every other one is in `WHEELS`."""
RAY_UNUSED = ("ray/jars/", "ray/dashboard/client/", "ray/rllib/", "ray/serve/", "ray/llm/")
"""Parts of the Ray wheel that a Tune sweep never imports (a sweep ran on the slim wheel): the
Java worker runtime, the dashboard's web client (sweeps run without it), RLlib, Serve, LLM."""


def requirement_name(requirement: str) -> str:
    """The normalised distribution name of a requirement ("ray[tune]>=2.60" -> "ray")."""
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def uncovered(requirements: list[str]) -> list[str]:
    """The requirements that neither `WHEELS` nor the image (`IMAGE_HAS`) provides."""
    bundled = {requirement_name(wheel) for wheel in WHEELS}
    return [r for r in requirements if requirement_name(r) not in bundled | IMAGE_HAS]


def project_requirements() -> list[str]:
    """The installed project's dependencies and its `mtl` extra (markers dropped): what the
    GPU check imports."""
    requirements = metadata.requires("relif-ray") or []
    wanted = [r for r in requirements if ";" not in r or r.endswith('extra == "mtl"')]
    return [r.split(";")[0].strip() for r in wanted]


def download(requirement: str, out: Path, python_version: str) -> Path:
    """One wheel (no dependencies) for CPython `python_version` on manylinux x86_64."""
    before = set(out.glob("*.whl"))
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    tag = python_version.replace(".", "")
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    command += ["--only-binary=:all:", "--python-version", python_version]
    command += ["--implementation", "cp", "--abi", f"cp{tag}", "--abi", "abi3", "--abi", "none"]
    command += [*platforms, "--dest", str(out), requirement]
    subprocess.run(command, check=True)
    new = set(out.glob("*.whl")) - before
    name = requirement.split("==")[0].replace("-", "_").lower()
    matches = [p for p in new | before if p.name.lower().startswith(name + "-")]
    if len(matches) != 1:
        raise RuntimeError(f"{requirement}: expected one wheel in {out}, found {matches}")
    return matches[0]


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim_wheel(path: Path, unused: tuple[str, ...]) -> tuple[int, int]:
    """Rewrite the wheel at `path` without the files under the `unused` prefixes (and no
    source maps), with a RECORD of exactly the files kept; (bytes before, bytes after)."""
    before = path.stat().st_size
    slim = path.with_suffix(".slim")
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as out:
        record_name = next(n for n in source.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        for info in source.infolist():
            name = info.filename
            if name == record_name or name.startswith(unused) or name.endswith(".js.map"):
                continue
            data = source.read(info)
            out.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            if not name.endswith("/"):
                lines.append(record_line(name, data))
        lines.append(f"{record_name},,")
        out.writestr(record_name, "\n".join(lines) + "\n")
    slim.replace(path)
    return before, path.stat().st_size


def build(out: Path, python_version: str) -> int:
    """Download every wheel into a fresh `out`, slim Ray's; the bundle's size in bytes."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for requirement in WHEELS:
        wheel = download(requirement, out, python_version)
        if requirement.startswith("ray=="):
            before, after = slim_wheel(wheel, RAY_UNUSED)
            print(f"{wheel.name}: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB (slim)")
    return sum(p.stat().st_size for p in out.glob("*.whl"))


def tracked_size() -> int:
    """Bytes of the files that travel with the working tree besides the bundle (tracked and
    untracked-not-ignored files)."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout
    files = [REPO / name for name in listing.decode().split("\0") if name]
    return sum(f.stat().st_size for f in files if f.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / ".whl", help="bundle folder")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    args = parser.parse_args(argv)
    missing = uncovered(project_requirements())
    if missing:
        print(f"gpu_bundle.py: WHEELS lacks the project's {', '.join(missing)}", file=sys.stderr)
        return 1
    bundle = build(args.out, args.python_version)
    tree = tracked_size()
    print(
        f"{len(WHEELS)} wheels in {args.out}: {bundle / 2**20:.1f} MiB; working tree "
        f"{tree / 2**20:.1f} MiB; together {(bundle + tree) / 2**20:.1f} MiB of the 64 MiB "
        "that travel"
    )
    return 0 if bundle + tree < 64 * 2**20 else 1


if __name__ == "__main__":
    raise SystemExit(main())
