#!/usr/bin/env bash
# The GPU check on a lent GPU machine with no network: install the wheels carried in .whl/
# (built here by `python -m benchmarks.gpu_bundle`) into /tmp/site, install this tree
# editable (as the Quickstart does: `relif_ray.analysis` is the analysis/ folder only through
# the install's mapping), then run gpu_check.py.
#
#   bash benchmarks/gpu_check.sh OUT [gpu_check.py flags, e.g. --only compile cuda]
#
# Writes OUT/gpu_check.json, .md, .log (+ report_bf16.md, report_fp32.md); exit status of
# gpu_check.py (0: every suite done and no row FAILed), 3 if the wheels or the project did not
# install.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash benchmarks/gpu_check.sh OUT [gpu_check.py flags]}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl &&
    PYTHONPATH=/tmp/site python3 -m pip install -q --no-index --no-deps --no-build-isolation \
    --no-cache-dir --editable .
} >>"$out/gpu_check.log" 2>&1 || { echo "the wheels of .whl/ or the project did not install (see $out/gpu_check.log)"; exit 3; }
export PYTHONPATH=/tmp/site:$PWD
python3 -m pip list 2>/dev/null | grep -i -E '^(torch|torchvision|numpy|pandas|pyarrow|protobuf|ray|pydantic|nvidia-ml-py) ' >>"$out/gpu_check.log"
python3 -m benchmarks.gpu_check --out "$out" "$@"
