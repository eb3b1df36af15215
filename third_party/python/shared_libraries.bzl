"""`shared_libraries`: links prebuilt shared libraries by path, with no Bazel rpaths.

Copied into @torch by //third_party/python:python_env.bzl. cc_library/cc_import of a .so make
Bazel symlink it into _solib_<cpu>/ and give every binary an rpath there, which means nothing
inside an installed wheel. Here the libraries go to the linker as plain paths (the output
records their SONAME, e.g. libc10.so), and binaries bring their own rpath
(e.g. -Wl,-rpath,$ORIGIN/../torch/lib).
"""

def _shared_libraries_impl(ctx):
    libs = ctx.files.srcs
    linker_input = cc_common.create_linker_input(
        owner = ctx.label,
        user_link_flags = depset([f.path for f in libs]),
        additional_inputs = depset(libs),
    )
    return [CcInfo(linking_context = cc_common.create_linking_context(
        linker_inputs = depset([linker_input]),
    ))]

shared_libraries = rule(
    implementation = _shared_libraries_impl,
    attrs = {"srcs": attr.label_list(allow_files = [".so"], mandatory = True)},
    provides = [CcInfo],
)
