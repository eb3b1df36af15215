"""Runs a torch_tpu example program against the built wheel (main of torch_tpu_py_binary).

argv: --torch_tpu_wheel=WHEEL SCRIPT [the script's own arguments]

`pip install --no-deps` the wheel into a temporary folder, put it first on sys.path (and on
PYTHONPATH for subprocesses), then run SCRIPT as __main__ with the remaining arguments. Everything
else the script imports comes from @python_env, the venv made from requirements_lock.txt; the
source tree's torch_tpu/ is never importable (legacy_create_init = False).
"""

import os
import runpy
import shutil
import subprocess
import sys
import tempfile

_WHEEL_FLAG = "--torch_tpu_wheel="


def main(argv):
    if not argv or not argv[0].startswith(_WHEEL_FLAG) or len(argv) < 2:
        raise SystemExit("example_runner: usage: %sWHEEL SCRIPT [ARGS...]" % _WHEEL_FLAG)
    wheel, script, args = argv[0][len(_WHEEL_FLAG):], argv[1], argv[2:]
    tmpdir = tempfile.mkdtemp(prefix="torch_tpu_example_")
    try:
        site = os.path.join(tmpdir, "site")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-input",
             "--disable-pip-version-check", "--target", site, os.path.abspath(wheel)],
            check=True,
        )
        sys.path.insert(0, site)
        os.environ["PYTHONPATH"] = site + (os.pathsep + os.environ["PYTHONPATH"] if "PYTHONPATH" in os.environ else "")
        sys.argv = [script, *args]
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as stop:
            return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        return 0
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
