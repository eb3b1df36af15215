"""Describes the venv made by @python_env as JSON (read by third_party/python/python_env.bzl).

Runs inside the venv, after `pip install -r requirements_lock.txt`. Prints one JSON object:
interpreter and wheel tags, the Python headers, and torch / pybind11 / jax / jaxlib paths and
versions. Kept torch-version agnostic: it only uses public helpers.
"""

import json
import os
import re
import sys
import sysconfig


def _macro_version(header, prefix):
    """Reads MAJOR.MINOR.MICRO from `#define <prefix>{MAJOR,MINOR,MICRO} N` lines."""
    with open(header, encoding="utf-8") as f:
        text = f.read()
    parts = []
    for part in ("MAJOR", "MINOR", "MICRO"):
        m = re.search(r"#\s*define\s+%s%s\s+(\S+)" % (prefix, part), text)
        parts.append(m.group(1) if m else "?")
    return ".".join(parts)


def _torch():
    import torch
    import torch.utils.cpp_extension as cpp_extension

    include_paths = [os.path.realpath(p) for p in cpp_extension.include_paths()]
    bundled = os.path.join(include_paths[0], "pybind11", "detail", "common.h")
    return {
        "version": torch.__version__,
        "cxx11_abi": bool(torch.compiled_with_cxx11_abi()),
        "include_paths": include_paths,
        "library_paths": [os.path.realpath(p) for p in cpp_extension.library_paths()],
        "bundled_pybind11_version": (
            _macro_version(bundled, "PYBIND11_VERSION_") if os.path.exists(bundled) else None
        ),
    }


def _pybind11():
    import pybind11

    return {
        "version": pybind11.__version__,
        "include": os.path.realpath(pybind11.get_include()),
    }


def _jax():
    import jax
    import jax.ffi
    import jaxlib

    return {
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
        "ffi_include": os.path.realpath(jax.ffi.include_dir()),
    }


def main():
    py = "cp%d%d" % sys.version_info[:2]
    info = {
        "python": {
            "executable": sys.executable,
            "version": "%d.%d.%d" % sys.version_info[:3],
            "python_tag": py,
            "abi_tag": py + sys.abiflags,
            "platform_tag": sysconfig.get_platform().replace("-", "_").replace(".", "_"),
            "include": os.path.realpath(sysconfig.get_paths()["include"]),
            "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        },
        "torch": _torch(),
        "pybind11": _pybind11(),
        "jax": _jax(),
    }
    json.dump(info, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
