"""Offline stand-in for @rules_cc under Bazel 4.2.3 (WORKSPACE builds only).

Debian's rules_cc is too new for Bazel 4.2.3 (it needs `use_cpp_toolchain`), and nothing can
be downloaded, so this repository forwards `@rules_cc//cc:defs.bzl` to the native rules.
@bazel_tools loads it even for a py_test. Bazel 7+ (bzlmod) uses the real rules_cc from the
Bazel Central Registry instead (see MODULE.bazel).
"""

cc_binary = native.cc_binary
cc_import = native.cc_import
cc_library = native.cc_library
cc_proto_library = native.cc_proto_library
cc_test = native.cc_test
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
fdo_prefetch_hints = native.fdo_prefetch_hints
fdo_profile = native.fdo_profile
objc_import = native.objc_import
objc_library = native.objc_library
