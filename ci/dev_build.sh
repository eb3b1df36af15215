#!/usr/bin/env bash
# Development build of the C++ extension without Bazel: compiles csrc/ into torch_tpu/_C.so
# (gitignored) so `PYTHONPATH=. python -m pytest tests/` runs against the source tree.
# Usage: PYTHON=/path/to/venv/bin/python bash ci/dev_build.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
read -r TORCH_DIR PYBIND_INC PY_INC EXT_SUFFIX ABI < <("$PYTHON" - <<'PY'
import os, sysconfig, torch, pybind11
print(os.path.dirname(torch.__file__), pybind11.get_include(), sysconfig.get_paths()["include"],
      sysconfig.get_config_var("EXT_SUFFIX"), int(torch._C._GLIBCXX_USE_CXX11_ABI))
PY
)
g++ -std=c++20 -O1 -shared -fPIC -Wall -I. -Icsrc \
  -isystem "$TORCH_DIR/include" -isystem "$TORCH_DIR/include/torch/csrc/api/include" \
  -isystem "$PYBIND_INC" -isystem "$PY_INC" \
  -DTORCH_EXTENSION_NAME=_C -DTORCH_API_INCLUDE_EXTENSION_H -D_GLIBCXX_USE_CXX11_ABI="$ABI" \
  csrc/core/*.cc csrc/*.cc -o torch_tpu/_C.so \
  -L"$TORCH_DIR/lib" -lc10 -ltorch -ltorch_cpu -ltorch_python -Wl,-rpath,"$TORCH_DIR/lib"
echo "built torch_tpu/_C.so"
