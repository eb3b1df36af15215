"""pytest targets that test the built torch_tpu wheel.

    load("//build_defs:py_test.bzl", "torch_tpu_py_tests")
    torch_tpu_py_tests()  # one py_test per test_*.py in this package

Each target pip-installs //ci/wheel:torch_tpu_wheel (--no-deps) into $TEST_TMPDIR, puts it
first on sys.path and runs pytest on its file (see pytest_runner.py). Run them with the wheel's
configuration, or the extension is rebuilt:

    bazel test --config=wheel_common --config=no_rbe //tests/...
"""

# Environment every torch_tpu test gets (the `env` argument adds to it or overrides it).
TORCH_TPU_TEST_ENV = {
    # Eight virtual PJRT CPU devices, for the sharding and device-mesh tests.
    "TORCH_TPU_NUM_CPU_DEVICES": "8",
    # The same for any jax code that runs before torch_tpu configures the client.
    "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
    # First calls compile before they run, so compile counts are exact (tests/conftest.py).
    "TORCH_TPU_ASYNC_COMPILE": "0",
}

_WHEEL = "//ci/wheel:torch_tpu_wheel"
_RUNNER = "//build_defs:pytest_runner.py"
_SHARED_SUPPORT = "//tests:support"

def torch_tpu_py_test(name, srcs, data = [], env = {}, shard_count = None, size = "medium", timeout = "long", tags = [], python = None, pytest_args = [], **kwargs):
    """A py_test running pytest on `srcs` against the installed wheel.

    Args:
      name: target name.
      srcs: the test files (test_*.py) to pass to pytest.
      data: more runtime files (conftest.py, helpers, data files).
      env: environment added to TORCH_TPU_TEST_ENV.
      shard_count: Bazel shards; tests are split by collection index modulo the count.
      size: Bazel test size.
      timeout: Bazel timeout class; "long" (15 min) because op test files grow, and a 2-core
        machine already needs over 3 minutes for some.
      tags: Bazel tags.
      python: an interpreter target to run pytest with instead of @python_env's, e.g.
        "@python_env_2_14//:python" to test the wheel against torch 2.14.
      pytest_args: arguments after the test files (e.g. ["-k", "llama"]).
      **kwargs: passed to py_test (flaky, ...).
    """
    test_env = dict(TORCH_TPU_TEST_ENV)
    test_env.update(env)
    python_args = []
    if python:
        python_args = ["--python=$(rootpath %s)" % python]
        data = data + [python]
    native.py_test(
        name = name,
        srcs = [_RUNNER] + srcs,
        main = _RUNNER,
        args = python_args + ["--torch_tpu_wheel=$(rootpath %s)" % _WHEEL] +
               ["$(rootpath %s)" % src for src in srcs] + pytest_args,
        data = [_WHEEL] + data,
        env = test_env,
        legacy_create_init = False,
        python_version = "PY3",
        shard_count = shard_count,
        size = size,
        tags = tags,
        timeout = timeout,
        **kwargs
    )

def torch_tpu_py_tests(srcs = None, data = [], shard_count = {}, tags = {}, env = {}, **kwargs):
    """One torch_tpu_py_test per test file, named after the file (tests/test_ops.py -> :test_ops).

    Args:
      srcs: test files; default: every test_*.py in this package.
      data: runtime files for every test; this package's other *.py and *.json files
        (conftest.py, helpers) and //tests:support (the conftest.py above) are always added.
      shard_count: {"test_ops.py": 4}: Bazel shards per file (default 1).
      tags: {"test_x.py": ["exclusive"]}: Bazel tags per file; "exclusive" runs a file alone,
        for multi-process tests whose timing starves when the 2-core CI runs others beside them.
      env: environment added to TORCH_TPU_TEST_ENV.
      **kwargs: passed to every torch_tpu_py_test (size, timeout, tags, ...).
    """
    if srcs == None:
        srcs = native.glob(["test_*.py"], allow_empty = True)
    support = native.glob(["*.py", "*.json"], exclude = ["test_*.py"], allow_empty = True)
    if native.package_name() == "tests":
        native.filegroup(
            name = "support",
            srcs = support,
            visibility = ["//tests:__subpackages__"],
        )
        support = [":support"]
    else:
        support = support + [_SHARED_SUPPORT]
    for src in srcs:
        torch_tpu_py_test(
            name = src[:-len(".py")].split("/")[-1],
            srcs = [src],
            data = support + data,
            env = env,
            shard_count = shard_count.get(src),
            tags = tags.get(src, []),
            **kwargs
        )

def torch_tpu_py_test_reruns(tests, env = {}, python = None):
    """Files of //tests run again in another setting: one target per file, named after it.

    Args:
      tests: {"test_x": pytest_args}: the //tests files (without .py), each with the arguments
        after its file (e.g. ["-k", "llama"], or []).
      env: environment added to TORCH_TPU_TEST_ENV (e.g. TPU's buffer layout).
      python: an interpreter target instead of @python_env's (e.g. another torch version's).
    """
    for name, pytest_args in tests.items():
        torch_tpu_py_test(
            name = name,
            srcs = ["//tests:%s.py" % name],
            data = [
                "//:examples",
                "//tests:support",
            ],
            env = env,
            pytest_args = pytest_args,
            python = python,
        )
