#!/usr/bin/env bash
# The TPU lane: on a TPU host with jax and libtpu installed, installs torch and the built
# torch_tpu wheel, then runs ci/tpu/lane.py (tests on TPU in one process, every example with
# --check, the Pallas kernels compiled by Mosaic, the TPU benchmarks) and writes its results.
#
#   bash ci/tpu/lane.sh [--wheel WHEEL] [--site DIR] [--pip-args "ARGS"] [--skip-install] [LANE ARGS...]
#
# --wheel WHEEL       the torch_tpu wheel (default: bazel-bin/ci/wheel/torch_tpu-*.whl or dist/*.whl)
# --site DIR          install with `pip --target DIR` and append DIR to PYTHONPATH (hosts whose
#                     Python environment is read-only); default: the current environment
# --pip-args "ARGS"   where torch and the test extras come from (e.g. "--index-url URL" or
#                     "--no-index --find-links DIR"); default: pip's own configuration. A host
#                     whose index lacks a version the tests need (accelerate >= 1.16) takes
#                     its wheel from one more "--find-links DIR" (pip installs the newest)
# --skip-install      use what is installed
# LANE ARGS           passed to ci/tpu/lane.py (--parts, --out, --commit, ...; see its --help)
#
# On an ordinary Cloud TPU VM: pip install "jax[tpu]==0.10.2", build or copy the wheel, then
#   bash ci/tpu/lane.sh --wheel torch_tpu-*.whl
# The results go to benchmarks/results/tpu/ (lane.md, lane.json, lane.log) unless --out says otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$(pwd)"

python="${PYTHON:-python3}"
wheel=""
site=""
pip_args=""
install=1
lane_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) wheel="$2"; shift 2 ;;
    --site) site="$2"; shift 2 ;;
    --pip-args) pip_args="$2"; shift 2 ;;
    --skip-install) install=0; shift ;;
    *) lane_args+=("$1"); shift ;;
  esac
done

# torch at the lock file's version, so the lane tests what CI tests; the test extras as the
# index has them (the results record their versions).
pin() { grep -E "^$1==" requirements_lock.txt | head -n 1; }
extras=(transformers tqdm pytest pytest-timeout accelerate pytorch-lightning)

if [ "$install" = 1 ]; then
  if [ -z "$wheel" ]; then
    wheel="$(ls -t bazel-bin/ci/wheel/torch_tpu-*.whl dist/torch_tpu-*.whl 2>/dev/null | head -n 1 || true)"
  fi
  if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then
    echo "ci/tpu/lane.sh: no torch_tpu wheel; pass --wheel (build it with: bazel build --config=wheel_common --config=no_rbe //ci/wheel:torch_tpu_wheel)" >&2
    exit 2
  fi
  target=()
  if [ -n "$site" ]; then
    mkdir -p "$site"
    target=(--target "$site")
  fi
  # shellcheck disable=SC2086  # pip_args holds several arguments
  "$python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: $pip_args "${target[@]}" \
    "$(pin torch)" "${extras[@]}"
  "$python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps "${target[@]}" "$wheel"
fi
if [ -n "$site" ]; then
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(cd "$site" && pwd)"
  export PATH="$(cd "$site" && pwd)/bin:$PATH"
fi
exec "$python" "$repo/ci/tpu/lane.py" --repo "$repo" "${lane_args[@]}"
