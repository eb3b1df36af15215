"""Runs pytest on torch_tpu test files against the built wheel (main of torch_tpu_py_test).

argv: [--python=PYTHON] --torch_tpu_wheel=WHEEL TEST_FILE... [extra pytest args, e.g. from --test_arg]

0. With --python (a test for another torch version, e.g. @python_env_2_14//:python), the runner
   first re-runs itself under that interpreter, whose venv holds that torch.

1. `pip install --no-deps` the wheel into $TEST_TMPDIR/site and put that first on sys.path
   (and on PYTHONPATH / PATH for subprocesses and the tpu-info script). The source tree's
   torch_tpu/ is never importable: the test depends on the wheel only, and the workspace folder
   in the runfiles has no __init__.py (legacy_create_init = False).
2. Bazel sharding: touches $TEST_SHARD_STATUS_FILE, exports TORCH_TPU_TEST_SHARD and
   TORCH_TPU_TEST_SHARDS, and keeps only the collected tests whose index modulo the shard count
   is this shard's index (after every other plugin and conftest has filtered and ordered them).
   Conftests may read the two variables, but must not shard again.
3. pytest runs in this process with --import-mode=importlib -p no:cacheprovider, the workspace
   as rootdir and on sys.path (so `from tests.helpers import x` works), and a JUnit XML for
   Bazel ($XML_OUTPUT_FILE). TORCH_TPU_CACHE_DIR defaults to $TEST_TMPDIR/torch_tpu_cache.
"""

import os
import subprocess
import sys
import tempfile

import pytest

_WHEEL_FLAG = "--torch_tpu_wheel="
_PYTHON_FLAG = "--python="


def _install_wheel(wheel, tmpdir):
    site = os.path.join(tmpdir, "site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-input", "--disable-pip-version-check", "--target", site, wheel],
        check=True,
    )
    return site


def _prepend_env_path(name, entry):
    old = os.environ.get(name)
    os.environ[name] = entry + (os.pathsep + old if old else "")


class _ShardPlugin:
    """Keeps every `total`-th collected test, starting at `index`."""

    def __init__(self, index, total):
        self.index, self.total = index, total
        self.collected = 0

    # trylast: after conftests and -k/-m, so that the shards partition the final list.
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        keep, drop = [], []
        for i, item in enumerate(items):
            (keep if i % self.total == self.index else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep
        self.collected = len(keep) + len(drop)

    def pytest_report_header(self, config):
        return "torch_tpu: shard %d of %d" % (self.index, self.total)


def main(argv):
    python = [a[len(_PYTHON_FLAG):] for a in argv if a.startswith(_PYTHON_FLAG)]
    if python:
        argv = [a for a in argv if not a.startswith(_PYTHON_FLAG)]
        interpreter = os.path.abspath(python[-1])
        sys.stdout.flush()
        os.execv(interpreter, [interpreter, os.path.abspath(__file__)] + argv)

    wheel = None
    rest = []
    for arg in argv:
        if arg.startswith(_WHEEL_FLAG):
            wheel = arg[len(_WHEEL_FLAG):]
        else:
            rest.append(arg)
    if wheel is None:
        raise SystemExit("pytest_runner: missing %sPATH" % _WHEEL_FLAG)

    workspace = os.getcwd()  # Bazel runs tests in the main repository's runfiles folder.
    tmpdir = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
    site = _install_wheel(os.path.abspath(wheel), tmpdir)
    sys.path.insert(0, site)
    _prepend_env_path("PYTHONPATH", site)
    _prepend_env_path("PATH", os.path.join(site, "bin"))
    # `from tests.helpers import x` works from any test folder.
    if workspace not in sys.path:
        sys.path.insert(1, workspace)
    os.environ.setdefault("TORCH_TPU_CACHE_DIR", os.path.join(tmpdir, "torch_tpu_cache"))

    plugins = []
    total = int(os.environ.get("TEST_TOTAL_SHARDS", "1") or "1")
    shard = None
    if total > 1:
        index = int(os.environ["TEST_SHARD_INDEX"])
        status = os.environ.get("TEST_SHARD_STATUS_FILE")
        if status:
            open(status, "a").close()  # tell Bazel that this test shards
        os.environ["TORCH_TPU_TEST_SHARD"] = str(index)
        os.environ["TORCH_TPU_TEST_SHARDS"] = str(total)
        shard = _ShardPlugin(index, total)
        plugins.append(shard)

    args = ["--import-mode=importlib", "-p", "no:cacheprovider", "--rootdir", workspace, "-ra"]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args.append("--junitxml=" + xml)

    code = pytest.main(args + rest, plugins=plugins)
    if code == pytest.ExitCode.NO_TESTS_COLLECTED and shard is not None and shard.collected:
        print("torch_tpu: shard %d of %d got none of the %d tests" % (shard.index, total, shard.collected))
        code = pytest.ExitCode.OK
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
