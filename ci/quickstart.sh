#!/usr/bin/env bash
# From a fresh checkout to minGPT training on device "tpu":
#   1. install Bazel if missing (ci/setup.sh),
#   2. build the wheel,
#   3. make .venv at the repo root from requirements_lock.txt and pip install the wheel there,
#   4. run examples/mingpt/train.py --steps 20 with it.
# Extra arguments go to train.py (e.g. --check, --compile).
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/setup.sh
ci_setup

example=examples/mingpt/train.py
if [ ! -f "$example" ]; then
  echo "ci/quickstart.sh: $example does not exist yet; nothing to run" >&2
  exit 1
fi

bazel build "${BAZEL_FLAGS[@]}" //ci/wheel:torch_tpu_wheel
# Bazel 4's cquery has no --output=files; the path is relative to the bazel-out symlink here.
wheel="$(bazel cquery "${BAZEL_FLAGS[@]}" --output=starlark \
  --starlark:expr='"\n".join([f.path for f in target.files.to_list()])' \
  //ci/wheel:torch_tpu_wheel 2>/dev/null)"
if [ ! -f "$wheel" ]; then
  echo "ci/quickstart.sh: cannot find the built wheel (got '$wheel')" >&2
  exit 1
fi

if [ ! -x .venv/bin/python ]; then
  "${PYTHON_BIN_PATH:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements_lock.txt
.venv/bin/python -m pip check --disable-pip-version-check
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$wheel"

.venv/bin/python "$example" --steps 20 "$@"
