"""attnmeta_dependencies(): every repository attnmeta needs, for attnmeta's own WORKSPACE and
for a workspace that depends on it.

In a consuming WORKSPACE, after attnmeta itself (under any name):

    local_repository(name = "attnmeta", path = "/path/to/attnmeta")  # or an archive rule
    load("@attnmeta//bazel:dependencies.bzl", "attnmeta_dependencies")
    attnmeta_dependencies()

A repository the consumer defined before the call is kept: a monorepo's own Abseil,
GoogleTest, glog, protobuf or rules wins (rules_cc and remote_coverage_tools included: declare
them first to keep rule sets that Bazel would otherwise fetch for them). The others are
Debian's packages (see third_party/README.md) and the in-tree shims that Bazel 4.2.3 needs,
found through labels of this repository, so they resolve wherever attnmeta is checked out.
"""

# The shims' BUILD files load and select through @attnmeta//; in a workspace that names this
# repository otherwise, they see it under that name. (Empty when attnmeta is the main
# repository, whose workspace name is attnmeta.)
_SELF = Label("//third_party:BUILD").workspace_name
_SELF_MAPPING = {"@attnmeta": "@" + _SELF} if _SELF else {}

def _maybe(rule, name, **kwargs):
    if not native.existing_rule(name):
        rule(name = name, **kwargs)

def _in_tree_impl(rctx):
    # The directory of attnmeta's `third_party/<subdir>`, found from a file label of this
    # repository, linked entry by entry into the new repository.
    src = rctx.path(rctx.attr.marker).dirname
    for part in rctx.attr.subdir.split("/"):
        src = src.get_child(part)
    for child in src.readdir():
        rctx.symlink(child, child.basename)

_in_tree_repository = repository_rule(
    implementation = _in_tree_impl,
    attrs = {
        "marker": attr.label(allow_single_file = True),
        "subdir": attr.string(mandatory = True),
    },
    local = True,
)

def _in_tree(name, subdir):
    _maybe(
        _in_tree_repository,
        name = name,
        marker = Label("//third_party:BUILD"),
        subdir = subdir,
        repo_mapping = _SELF_MAPPING,
    )

def attnmeta_dependencies():
    """Defines every repository attnmeta needs that the workspace has not defined yet."""

    # Rule sets (Bazel 4.2.3 would otherwise fetch them).
    _in_tree("rules_cc", "rules_cc_shim")
    _in_tree("remote_coverage_tools", "remote_coverage_tools")
    _maybe(native.local_repository, name = "rules_java", path = "/usr/share/bazel/rules/java")
    _maybe(native.local_repository, name = "platforms", path = "/usr/share/bazel/tools/platforms")
    _maybe(native.local_repository, name = "bazel_skylib", path = "/usr/share/bazel/tools/skylib")

    # Debian's -dev packages, under the names a monorepo that vendors them would use.
    _in_tree("com_google_absl", "system/com_google_absl")
    for name, build_file in [
        ("com_google_googletest", "googletest.BUILD"),
        ("com_github_google_glog", "glog.BUILD"),
        ("com_github_gflags_gflags", "gflags.BUILD"),
        ("com_google_protobuf", "protobuf.BUILD"),
        ("com_github_google_benchmark", "benchmark.BUILD"),
    ]:
        _maybe(
            native.new_local_repository,
            name = name,
            build_file = str(Label("//third_party/system:" + build_file)),
            path = "/usr",
            repo_mapping = _SELF_MAPPING,
        )

    # The CUDA toolkit; only read when a target built for the cuda backend needs it.
    _maybe(
        native.new_local_repository,
        name = "local_cuda",
        build_file = str(Label("//third_party/rules_hip:local_cuda.BUILD")),
        path = "/usr/local/cuda",
    )
