"""Bzlmod (Bazel 7+) module extension for the Python environment repositories.

    python_env = use_extension("//third_party/python:extensions.bzl", "python_env")
    python_env.lock(file = "//:requirements_lock.txt")
    use_repo(python_env, "pybind11", "python_env", "torch", "xla")

Makes the same @python_env, @torch, @pybind11 and @xla as repositories.bzl does for WORKSPACE.
Only the root module's lock is used.
"""

load(":cc_repos.bzl", "pybind11_repo", "torch_repo", "xla_repo")
load(":python_env.bzl", _python_env_rule = "python_env")

def _python_env_impl(module_ctx):
    locks = [
        tag.file
        for mod in module_ctx.modules
        if mod.is_root
        for tag in mod.tags.lock
    ]
    if len(locks) != 1:
        fail("the root module must give exactly one python_env.lock(file = ...), got %d" % len(locks))
    _python_env_rule(name = "python_env", lock = locks[0])
    torch_repo(name = "torch")
    pybind11_repo(name = "pybind11")
    xla_repo(name = "xla")

python_env = module_extension(
    implementation = _python_env_impl,
    tag_classes = {
        "lock": tag_class(attrs = {"file": attr.label(mandatory = True, allow_single_file = True)}),
    },
)
