"""Bzlmod (Bazel 7+) module extension for the Python environment repositories.

    python_env = use_extension("//third_party/python:extensions.bzl", "python_env")
    use_repo(python_env, "pybind11", "pybind11_2_14", "python_env", "python_env_2_14",
             "torch", "torch_2_14", "xla")

Makes the same repositories as repositories.bzl does for WORKSPACE, one set per torch version of
build_defs/torch_versions.bzl.
"""

load("//build_defs:torch_versions.bzl", "TORCH_VERSIONS")
load(":cc_repos.bzl", "pybind11_repo", "torch_repo", "xla_repo")
load(":python_env.bzl", _python_env_rule = "python_env")

def _python_env_impl(module_ctx):
    for version, info in TORCH_VERSIONS.items():
        env = "python_env" + info.suffix
        _python_env_rule(name = env, lock = info.lock, torch_version = version)
        torch_repo(name = "torch" + info.suffix, probe = "@%s//:probe.json" % env)
        pybind11_repo(name = "pybind11" + info.suffix, probe = "@%s//:probe.json" % env)
    xla_repo(name = "xla")

python_env = module_extension(implementation = _python_env_impl)
