"""`reset_torch_version`: builds a torch-independent C++ target once for every torch version.

`//:torch_version` says which torch the extension is built against. A target that does not use
torch must not be rebuilt when that flag changes, so this rule builds its `dep` with the flag
reset to a fixed value (an outgoing-edge transition) and forwards the dep's CcInfo. Dependents
link the same objects whatever `--//:torch_version` says.

    cc_library(name = "core_impl", ..., tags = ["manual"])  # manual: not built twice by //...
    reset_torch_version(name = "core", dep = ":core_impl")
"""

# Any constant works; it only has to be the same for every torch version.
RESET_TORCH_VERSION = "0.0.0"

def _reset_torch_version_transition_impl(settings, attr):
    return {"//:torch_version": RESET_TORCH_VERSION}

_reset_torch_version_transition = transition(
    implementation = _reset_torch_version_transition_impl,
    inputs = [],
    outputs = ["//:torch_version"],
)

def _reset_torch_version_impl(ctx):
    # An outgoing-edge transition makes the attribute a list, even for attr.label.
    dep = ctx.attr.dep[0]
    return [
        dep[CcInfo],
        DefaultInfo(files = dep[DefaultInfo].files),
    ]

reset_torch_version = rule(
    implementation = _reset_torch_version_impl,
    doc = "Forwards `dep`'s CcInfo, with `dep` built under `--//:torch_version=%s`." % RESET_TORCH_VERSION,
    attrs = {
        "dep": attr.label(
            mandatory = True,
            providers = [CcInfo],
            cfg = _reset_torch_version_transition,
        ),
        "_allowlist_function_transition": attr.label(
            default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
        ),
    },
    provides = [CcInfo],
)

def _with_torch_version_transition_impl(settings, attr):
    return {"//:torch_version": attr.torch_version}

_with_torch_version_transition = transition(
    implementation = _with_torch_version_transition_impl,
    inputs = [],
    outputs = ["//:torch_version"],
)

def _with_torch_version_impl(ctx):
    dep = ctx.attr.dep[0]
    providers = [DefaultInfo(
        files = dep[DefaultInfo].files,
        runfiles = dep[DefaultInfo].default_runfiles,
    )]
    if CcInfo in dep:
        providers.append(dep[CcInfo])
    return providers

with_torch_version = rule(
    implementation = _with_torch_version_impl,
    doc = """Forwards `dep` built under `--//:torch_version=<torch_version>`.

    with_torch_version(name = "_C_torch_2_14", dep = ":_C.so", torch_version = "2.14.1")

The wheel takes one per supported torch version, so one build gives the glue for all of them
(each configuration gets its own output folder, bazel-out/k8-opt-ST-<hash>/).""",
    attrs = {
        "dep": attr.label(mandatory = True, cfg = _with_torch_version_transition),
        "torch_version": attr.string(mandatory = True),
        "_allowlist_function_transition": attr.label(
            default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
        ),
    },
)

def _linked_objects_impl(ctx):
    # One line per object file: "<dep label>\t<owner of the linker input>\t<object path>".
    lines = []
    for dep in ctx.attr.deps:
        for linker_input in dep[CcInfo].linking_context.linker_inputs.to_list():
            for library in linker_input.libraries:
                for obj in (library.pic_objects or []) + (library.objects or []):
                    lines.append("%s\t%s\t%s" % (dep.label, linker_input.owner, obj.path))
    out = ctx.actions.declare_file(ctx.label.name + ".tsv")
    ctx.actions.write(out, "\n".join(sorted(lines)) + "\n")
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

linked_objects = rule(
    implementation = _linked_objects_impl,
    doc = """Writes <name>.tsv: every object file each of `deps` links, with the library it
comes from. Two deps that list the same path for a library link the same artifact, built by one
action (//ci:core_built_once_test reads it).""",
    attrs = {"deps": attr.label_list(providers = [CcInfo])},
)
