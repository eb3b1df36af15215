#!/usr/bin/env bash
# Shows with `bazel aquery` that the wheel compiles the torch-independent core (csrc/core/*.cc)
# once, and the torch-dependent glue (csrc/*.cc) once per torch version (counting the .pic.o
# compiles that the shared libraries link; Bazel also lists non-PIC ones it never runs for
# them). Run by ci/test.sh;
# alone: bash ci/check_core_built_once.sh [bazel flags, e.g. --config=wheel_common]
set -euo pipefail
cd "$(dirname "$0")/.."
actions="$(bazel aquery "$@" --output=text \
  'mnemonic("CppCompile", deps(//ci/wheel:torch_tpu_wheel))' 2>/dev/null | grep -E '^ *Outputs: ')"
count() { grep -c -E "$1" <<<"$actions" || true; }
core_sources=$(ls csrc/core/*.cc | wc -l)
glue_sources=$(ls csrc/*.cc | wc -l)
versions=$(bazel cquery "$@" 'kind("with_torch_version", //csrc:all)' 2>/dev/null | grep -c '//csrc:_C_torch_' || true)
core=$(count '/_objs/core_impl/[^,]*\.pic\.o')
glue=$(count '/_objs/glue/[^,]*\.pic\.o')
core_dirs=$(grep -oE 'bazel-out/[^/]+/bin/csrc/_objs/core_impl/' <<<"$actions" | sort -u | wc -l)
glue_dirs=$(grep -oE 'bazel-out/[^/]+/bin/csrc/_objs/glue/' <<<"$actions" | sort -u | wc -l)
echo "core: ${core} compiles for ${core_sources} sources (${core_dirs} output folder); glue: ${glue} compiles" \
  "for ${glue_sources} sources x ${versions} torch versions (${glue_dirs} output folders)"
if [ "$core" -ne "$core_sources" ] || [ "$core_dirs" -ne 1 ] || [ "$glue" -ne $((glue_sources * versions)) ] ||
  [ "$glue_dirs" -ne "$versions" ] || [ "$versions" -lt 2 ]; then
  echo "check_core_built_once: FAILED (the core must compile once, the glue once per torch version)" >&2
  exit 1
fi
echo "check_core_built_once: ok"
