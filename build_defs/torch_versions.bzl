"""The torch versions torch_tpu builds its extension glue for, and their repositories.

One wheel carries `torch_tpu/_C/torch_<major>_<minor>.so` for every version here; at import,
torch_tpu/_extension.py loads the one matching `torch.__version__`. Each version has its own
lock file, from which @python_env<suffix> makes a venv; @torch<suffix> and @pybind11<suffix>
give that venv's torch and pybind11 to the C++ build. The torch-independent core
(//csrc:core) is built once for all of them (build_defs/reset_torch_version.bzl).

To add a version: a lock file, an entry here, TORCH_REQUIREMENT, and
torch_tpu/_extension.py:SUPPORTED_TORCH.
"""

# The version the full test suite runs against; @python_env is its venv and the Python
# toolchain of every py_binary/py_test.
PRIMARY_TORCH_VERSION = "2.13.0"

# Full torch version -> the suffix of its repositories (@python_env<suffix>, @torch<suffix>,
# @pybind11<suffix>) and its lock file.
TORCH_VERSIONS = {
    "2.13.0": struct(suffix = "", lock = "//:requirements_lock.txt"),
    "2.14.1": struct(suffix = "_2_14", lock = "//:requirements_lock_torch_2_14.txt"),
}

# Requires-Dist of the wheel: every version above, and none that was not built and tested.
TORCH_REQUIREMENT = "torch>=2.13,<2.15"

def torch_glue_name(version):
    """"2.14.1" -> "torch_2_14": the glue's file name (without .so) and config_setting name."""
    major, minor = version.split(".")[:2]
    return "torch_%s_%s" % (major, minor)

def torch_select(repo):
    """The main target of `repo` (e.g. "@torch") for the torch of `--//:torch_version`.

    torch_select("@pybind11") -> select({"//:torch_2_13": ["@pybind11//:pybind11"],
                                         "//:torch_2_14": ["@pybind11_2_14//:pybind11"]})
    """
    return select({
        "//:" + torch_glue_name(version): ["%s%s//:%s" % (repo, info.suffix, repo[1:])]
        for version, info in TORCH_VERSIONS.items()
    })
