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
