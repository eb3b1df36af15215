"""Declares the Python environment repositories for WORKSPACE builds (Bazel 4.2.3).

    load("//third_party/python:repositories.bzl", "python_env_repositories")
    python_env_repositories()
    register_toolchains("@python_env//:py_toolchain")

For every torch version of build_defs/torch_versions.bzl: @python_env<suffix> (a venv from its
lock file), @torch<suffix> and @pybind11<suffix> (suffix "" for the primary version, "_2_14" for
torch 2.14). @xla comes from the primary venv (the same jax for every torch).
Bzlmod (Bazel 7+) builds get the same repositories from extensions.bzl.
"""

load("//build_defs:torch_versions.bzl", "TORCH_VERSIONS")
load(":cc_repos.bzl", "pybind11_repo", "torch_repo", "xla_repo")
load(":python_env.bzl", "python_env")

def python_env_repositories():
    """Declares @python_env*, @torch*, @pybind11* and @xla."""
    for version, info in TORCH_VERSIONS.items():
        env = "python_env" + info.suffix
        python_env(name = env, lock = info.lock, torch_version = version)
        torch_repo(name = "torch" + info.suffix, probe = "@%s//:probe.json" % env)
        pybind11_repo(name = "pybind11" + info.suffix, probe = "@%s//:probe.json" % env)
    xla_repo(name = "xla")
