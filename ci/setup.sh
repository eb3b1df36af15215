#!/usr/bin/env bash
# Makes sure this machine can build torch_tpu: Bazel 4.2.3 from Debian and a Python 3.11 with
# venv and headers. Installs what is missing with apt-get (as root, or through sudo).
# Sourced by ci/test.sh and ci/quickstart.sh; also runs on its own: bash ci/setup.sh
#
# PYTHON_BIN_PATH: the interpreter the build makes its venv from (default: python3). When
# python3 is not 3.11, python3.11 is used and exported as PYTHON_BIN_PATH for Bazel's
# @python_env repository rule.

_ci_apt_install() {
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo="sudo"
    else
      echo "ci/setup.sh: need root (or sudo) to apt-get install $*" >&2
      return 1
    fi
  fi
  echo "ci/setup.sh: apt-get install $*" >&2
  $sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "$@"
}

ci_ensure_bazel() {
  # bazel-skylib and bazel-rules-java are found by WORKSPACE under /usr/share/bazel.
  if command -v bazel >/dev/null 2>&1 &&
    [ -f /usr/share/bazel/tools/skylib/WORKSPACE ] &&
    [ -f /usr/share/bazel/rules/java/WORKSPACE ]; then
    return 0
  fi
  _ci_apt_install bazel-bootstrap bazel-skylib bazel-rules-java
}

_ci_python_ok() {
  "$1" - <<'PY' 2>/dev/null
import ensurepip, os, sys, sysconfig, venv
assert sys.version_info[:2] == (3, 11), sys.version
assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
PY
}

ci_ensure_python() {
  local python="${PYTHON_BIN_PATH:-python3}"
  if _ci_python_ok "$python"; then
    return 0
  fi
  if [ -z "${PYTHON_BIN_PATH:-}" ] && command -v python3.11 >/dev/null 2>&1 && _ci_python_ok python3.11; then
    export PYTHON_BIN_PATH="$(command -v python3.11)"
    return 0
  fi
  # Debian's python3 is 3.11 on bookworm; venv and the headers are separate packages.
  if [ -z "${PYTHON_BIN_PATH:-}" ] && [ -f /etc/debian_version ]; then
    _ci_apt_install python3 python3-venv python3-dev || return 1
    if _ci_python_ok /usr/bin/python3; then
      if ! _ci_python_ok python3; then export PYTHON_BIN_PATH=/usr/bin/python3; fi
      return 0
    fi
  fi
  echo "ci/setup.sh: need Python 3.11 with venv and headers; set PYTHON_BIN_PATH (now: $python)" >&2
  return 1
}

ci_setup() {
  ci_ensure_bazel && ci_ensure_python
}

# The configs the wheel is built and tested with (tests must use the wheel's configs, or the
# extension is rebuilt), plus plain logs under CI=true.
BAZEL_FLAGS=(--config=wheel_common --config=no_rbe)
if [ "${CI:-}" = true ]; then
  BAZEL_FLAGS+=(--config=ci)
fi

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  ci_setup
fi
