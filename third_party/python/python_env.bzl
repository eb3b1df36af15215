"""`python_env`: a hermetic Python environment for the torch_tpu build, made from a lock file.

@python_env is a venv made inside the external repository with
`pip install --no-deps -r requirements_lock.txt` plus `pip check` (so the lock must pin every
transitive dependency). It has:

  :py_toolchain    a py_runtime whose interpreter and stub shebang are the venv python
  :python_headers  cc_library with the interpreter's headers (sysconfig "include")
  :python          `bazel run @python_env//:python -- ...` runs the venv python
  :probe.json      what probe.py found: interpreter, wheel tags, torch/pybind11/jaxlib paths
  :defs.bzl        PYTHON_INTERPRETER (absolute venv python path), PYTHON_TAG, ABI_TAG,
                   PLATFORM_TAG, PYTHON_VERSION, TORCH_VERSION, JAX_VERSION, JAXLIB_VERSION

The interpreter that makes the venv is $PYTHON_BIN_PATH (from `--repo_env` or the
environment), or else `python3` on PATH. Changing the lock file, this file, probe.py or
PYTHON_BIN_PATH re-creates the venv; so does `bazel sync --only=python_env`.
cc_repos.bzl makes @torch, @pybind11 and @xla from probe.json.
"""

load(":common.bzl", "starlark_constants")

_PROBE_SCRIPT = Label("//third_party/python:probe.py")

# torch + jaxlib + scipy wheels take a while to unpack and byte-compile on 2 cores.
_PIP_TIMEOUT_S = 3600

def _fail_on_error(rctx, result, what):
    if result.return_code != 0:
        fail("%s failed (exit %d):\n%s\n%s" % (what, result.return_code, result.stdout, result.stderr))
    return result

def _find_python(rctx):
    python = rctx.os.environ.get("PYTHON_BIN_PATH", "").strip() or "python3"
    if "/" not in python:
        found = rctx.which(python)
        if not found:
            fail("@python_env: `%s` is not on PATH; set PYTHON_BIN_PATH (e.g. in user.bazelrc: " % python +
                 "build --repo_env=PYTHON_BIN_PATH=/usr/bin/python3)")
        return found
    return rctx.path(python)

def _python_env_impl(rctx):
    python = _find_python(rctx)
    lock = rctx.path(rctx.attr.lock)
    probe_script = rctx.path(_PROBE_SCRIPT)
    venv = rctx.path("venv")

    rctx.report_progress("creating venv with %s" % python)
    _fail_on_error(rctx, rctx.execute([python, "-m", "venv", "--clear", str(venv)]), "python -m venv")
    venv_python = rctx.path("venv/bin/python3")

    rctx.report_progress("pip install -r %s (torch, jax, jaxlib, ...)" % rctx.attr.lock.name)
    _fail_on_error(rctx, rctx.execute(
        [venv_python, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
         "--no-deps", "--requirement", str(lock)],
        timeout = _PIP_TIMEOUT_S,
    ), "pip install --no-deps -r %s" % rctx.attr.lock)
    _fail_on_error(rctx, rctx.execute(
        [venv_python, "-m", "pip", "check", "--disable-pip-version-check"],
    ), "pip check (is every transitive dependency pinned in %s?)" % rctx.attr.lock)

    rctx.report_progress("probing torch, pybind11, jaxlib and sysconfig")
    probe = _fail_on_error(rctx, rctx.execute([venv_python, probe_script]), "probe.py").stdout
    rctx.file("probe.json", probe)
    info = json.decode(probe)
    py = info["python"]
    torch_version = info["torch"]["version"].split("+")[0]
    if rctx.attr.torch_version and torch_version != rctx.attr.torch_version:
        fail("@%s: %s installs torch %s, but build_defs/torch_versions.bzl says %s" % (
            rctx.name,
            rctx.attr.lock,
            info["torch"]["version"],
            rctx.attr.torch_version,
        ))

    rctx.symlink(py["include"], "include")
    rctx.file("defs.bzl", starlark_constants({
        "ABI_TAG": py["abi_tag"],
        "EXT_SUFFIX": py["ext_suffix"],
        "JAX_VERSION": info["jax"]["jax_version"],
        "JAXLIB_VERSION": info["jax"]["jaxlib_version"],
        "PLATFORM_TAG": py["platform_tag"],
        "PYTHON_INTERPRETER": str(venv_python),
        "PYTHON_TAG": py["python_tag"],
        "PYTHON_VERSION": py["version"],
        "TORCH_VERSION": info["torch"]["version"],
    }))
    rctx.file("python.sh", "#!/bin/sh\nexec '%s' \"$@\"\n" % venv_python, executable = True)
    rctx.template("BUILD.bazel", rctx.attr._build_template, {
        "%{interpreter}": str(venv_python),
    })

python_env = repository_rule(
    implementation = _python_env_impl,
    doc = "A venv from a lock file, with a py_toolchain and the Python headers.",
    attrs = {
        "lock": attr.label(mandatory = True, allow_single_file = True, doc = "requirements_lock.txt"),
        "torch_version": attr.string(doc = "The torch version the lock must install (checked)."),
        "_build_template": attr.label(default = Label("//third_party/python:python_env.BUILD.tpl")),
    },
    environ = ["PYTHON_BIN_PATH"],
)
