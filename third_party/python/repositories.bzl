"""Declares the Python environment repositories for WORKSPACE builds (Bazel 4.2.3).

    load("//third_party/python:repositories.bzl", "python_env_repositories")
    python_env_repositories(lock = "//:requirements_lock.txt")
    register_toolchains("@python_env//:py_toolchain")

Bzlmod (Bazel 7+) builds get the same repositories from extensions.bzl.
"""

load(":cc_repos.bzl", "pybind11_repo", "torch_repo", "xla_repo")
load(":python_env.bzl", "python_env")

def python_env_repositories(lock):
    """Declares @python_env, @torch, @pybind11 and @xla.

    Args:
      lock: label of the requirements lock file.
    """
    python_env(name = "python_env", lock = lock)
    torch_repo(name = "torch")
    pybind11_repo(name = "pybind11")
    xla_repo(name = "xla")
