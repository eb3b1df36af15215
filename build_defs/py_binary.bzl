"""`torch_tpu_py_binary`: a program run against the built torch_tpu wheel.

    load("//build_defs:py_binary.bzl", "torch_tpu_py_binary")
    torch_tpu_py_binary(name = "mingpt", main = "train.py", data = glob(["*.py"]))

`bazel run --config=wheel_common --config=no_rbe //examples/mingpt -- --steps 20` installs
//ci/wheel:torch_tpu_wheel (--no-deps) into a temporary folder and runs `main` in @python_env's
venv with the arguments after `--` (see example_runner.py). Use the wheel's configs, or the
extension is rebuilt.
"""

_WHEEL = "//ci/wheel:torch_tpu_wheel"
_RUNNER = "//build_defs:example_runner.py"

def torch_tpu_py_binary(name, main, data = [], args = [], **kwargs):
    """A py_binary running the Python program `main` with the wheel installed.

    Args:
      name: target name.
      main: the program (a .py file of this package).
      data: the files `main` reads or imports (its package's other modules, shared code).
      args: arguments always passed to `main`, before those given on the command line.
      **kwargs: passed to py_binary (tags, visibility, ...).
    """
    native.py_binary(
        name = name,
        srcs = [_RUNNER],
        main = _RUNNER,
        args = [
            "--torch_tpu_wheel=$(rootpath %s)" % _WHEEL,
            "$(rootpath %s)" % main,
        ] + args,
        data = [_WHEEL, main] + data,
        legacy_create_init = False,
        python_version = "PY3",
        **kwargs
    )

def torch_tpu_example(name, main = "train.py", deps = ["//examples/common"]):
    """One example package: `bazel run //examples/<name>` and its `:srcs` (its *.py and `deps`).

    Args:
      name: the target name, the package's own name by convention.
      main: the program to run.
      deps: shared example code the program imports.
    """
    native.filegroup(
        name = "srcs",
        srcs = native.glob(["*.py"]) + deps,
        visibility = ["//visibility:public"],
    )
    torch_tpu_py_binary(name = name, main = main, data = [":srcs"])
