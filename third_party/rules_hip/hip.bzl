"""`hip_library`: HIP-dialect device sources compiled for the selected GPU backend.

Backends (flag //third_party/rules_hip:backend, set by the `cuda` and `rocm` configs):
  none: the target is incompatible and skipped (the default, for CPU-only machines);
  cuda: nvcc compiles each source as CUDA; sources reach the vendor API through the
        project's portability header, which sees ATTNMETA_GPU_CUDA;
  rocm: Debian's clang 15 compiles each source as HIP for the AMD architectures listed in
        //third_party/rules_hip:rocm_archs.
The objects are archived (alwayslink) and returned as CcInfo, so cc_library, cc_binary and
cc_test targets depend on a hip_library like on any other C++ library.
"""

load("@bazel_skylib//rules:common_settings.bzl", "BuildSettingInfo")
load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

_NVCC = "/usr/local/cuda/bin/nvcc"
_HIP_CLANG = "/usr/lib/llvm-15/bin/clang++"

def _include_flags(compilation_context, bin_dir):
    flags = ["-I.", "-I" + bin_dir]
    for d in compilation_context.quote_includes.to_list():
        flags.append("-I" + d)
    for d in compilation_context.includes.to_list():
        flags.append("-I" + d)
    for d in compilation_context.system_includes.to_list():
        flags.extend(["-isystem", d])
    for d in compilation_context.defines.to_list():
        flags.append("-D" + d)
    return flags

# Optimization follows the compilation mode (-c dbg / fastbuild / opt), like the C++ rules.
_MODE_FLAGS = {
    "dbg": ["-O0", "-g"],
    "fastbuild": ["-O2"],
    "opt": ["-O3", "-DNDEBUG"],
}

def _compile_flags(ctx, backend):
    # The backend's defines (ATTNMETA_GPU_CUDA / ATTNMETA_GPU_ROCM) come from
    # //third_party/rules_hip:gpu_runtime through the portability header's dependency.
    common = ["-std=c++17"] + _MODE_FLAGS[ctx.var["COMPILATION_MODE"]] + ctx.attr.copts
    werror = ctx.attr._werror[BuildSettingInfo].value
    if backend == "cuda":
        # -Xcompiler reaches the host compiler; nvcc's own warnings are its --Werror kinds.
        # Device code calls the constexpr helpers of the plain headers, which compile without a
        # GPU toolchain too and so carry no __device__; clang's HIP treats constexpr functions
        # as host and device already.
        flags = ["-x", "cu", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC", "-Xcompiler", "-Wall"]
        if werror:
            flags += ["-Xcompiler", "-Werror", "-Werror", "all-warnings"]
        for arch in ctx.attr._cuda_archs[BuildSettingInfo].value:
            num = arch.replace("sm_", "")
            flags.append("-gencode=arch=compute_%s,code=[sm_%s,compute_%s]" % (num, num, num))
        return flags + common
    flags = [
        "-x",
        "hip",
        "-fPIC",
        "--rocm-path=/usr",
        "--hip-device-lib-path=/usr/lib/x86_64-linux-gnu/amdgcn/bitcode",
        "-Wall",
    ]
    if werror:
        flags.append("-Werror")
    for arch in ctx.attr._rocm_archs[BuildSettingInfo].value:
        flags.append("--offload-arch=" + arch)
    return flags + common

def _hip_library_impl(ctx):
    backend = ctx.attr._backend[BuildSettingInfo].value
    if backend not in ("cuda", "rocm"):
        fail("hip_library %s built with backend '%s'; use --config=cuda or --config=rocm" % (ctx.label, backend))
    compiler = _NVCC if backend == "cuda" else _HIP_CLANG

    cc_toolchain = find_cpp_toolchain(ctx)
    feature_configuration = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    dep_infos = [d[CcInfo] for d in ctx.attr.deps]
    own_context = cc_common.create_compilation_context(headers = depset(ctx.files.hdrs))
    merged = cc_common.merge_cc_infos(cc_infos = dep_infos + [CcInfo(compilation_context = own_context)])
    headers = merged.compilation_context.headers

    flags = _compile_flags(ctx, backend) + _include_flags(merged.compilation_context, ctx.bin_dir.path)
    objects = []
    for src in ctx.files.srcs:
        obj = ctx.actions.declare_file("_hip_objs/%s/%s.o" % (ctx.label.name, src.basename))
        # A temporary folder of its own: nvcc names its temporary files after its process id,
        # which is the same small number in every sandbox's PID namespace, and the sandboxes
        # share /tmp, so two compiles at once overwrote each other's files.
        ctx.actions.run_shell(
            command = 'd="$(mktemp -d)" && TMPDIR="$d" "$@"; s=$?; rm -rf "$d"; exit $s',
            arguments = [compiler] + flags + ["-c", src.path, "-o", obj.path],
            inputs = depset([src], transitive = [headers]),
            outputs = [obj],
            mnemonic = "HipCompile",
            progress_message = "Compiling %s for %s" % (src.short_path, backend),
            use_default_shell_env = True,
        )
        objects.append(obj)

    archive = ctx.actions.declare_file("lib%s_hip.a" % ctx.label.name)
    ar_args = ctx.actions.args()
    ar_args.add("rcsD")
    ar_args.add(archive)
    ar_args.add_all(objects)
    ctx.actions.run(
        executable = cc_toolchain.ar_executable,
        arguments = [ar_args],
        inputs = depset(objects, transitive = [cc_toolchain.all_files]),
        outputs = [archive],
        mnemonic = "HipArchive",
        use_default_shell_env = True,
    )
    library = cc_common.create_library_to_link(
        actions = ctx.actions,
        feature_configuration = feature_configuration,
        cc_toolchain = cc_toolchain,
        static_library = archive,
        alwayslink = True,
    )
    linking_context = cc_common.create_linking_context(
        linker_inputs = depset([cc_common.create_linker_input(
            owner = ctx.label,
            libraries = depset([library]),
        )]),
    )
    own = CcInfo(compilation_context = own_context, linking_context = linking_context)
    return [
        DefaultInfo(files = depset([archive])),
        cc_common.merge_cc_infos(direct_cc_infos = [own], cc_infos = dep_infos),
    ]

_hip_library_rule = rule(
    implementation = _hip_library_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".hip.cc"]),
        "hdrs": attr.label_list(allow_files = [".h"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "_backend": attr.label(default = "//third_party/rules_hip:backend"),
        "_cuda_archs": attr.label(default = "//third_party/rules_hip:cuda_archs"),
        "_rocm_archs": attr.label(default = "//third_party/rules_hip:rocm_archs"),
        "_werror": attr.label(default = "//third_party/rules_hip:werror"),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    fragments = ["cpp"],
)

def gpu_compatible():
    """`target_compatible_with` for targets that need a GPU backend."""

    # Labels of this repository, spelled so that they resolve from another repository's BUILD
    # files too (a plain "//..." string would name a package of the caller's repository).
    return select({
        str(Label("//third_party/rules_hip:backend_none")): [
            str(Label("//third_party/rules_hip:no_gpu_toolchain")),
        ],
        "//conditions:default": [],
    })

def hip_library(name, **kwargs):
    """HIP device sources (`*.hip.cc`) plus the plain headers they share with host code."""
    _hip_library_rule(
        name = name,
        target_compatible_with = gpu_compatible(),
        **kwargs
    )

def gpu_cc_test(name, tags = [], deps = [], **kwargs):
    """A cc_test that needs a GPU: tagged `gpu`, skipped without a GPU backend."""
    native.cc_test(
        name = name,
        tags = tags + ["gpu"],
        target_compatible_with = gpu_compatible(),
        deps = deps,
        **kwargs
    )
