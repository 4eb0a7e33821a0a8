#!/usr/bin/env bash
# tools/gpu_mutation_gate --check, the part of the GPU mutation gate that CI runs: in a scratch
# copy of a repository whose ./bazelw only answers `query` from a list of GPU-tagged tests, it
# accepts well-formed mutants that apply and name a GPU test, and rejects each kind of bad
# mutant with its exit code (1: stale or not a GPU test; 2: malformed) and a message that says
# which. The build path (DIR) needs nvcc and a real Bazel; it is not run here.
set -euo pipefail
gate="$1"
usage="$2"  # tools/usage.sh, which the gate sources

repo="$TEST_TMPDIR/repo"
rm -rf "$repo"
mkdir -p "$repo/tools" "$repo/tests/gpu_mutants" "$repo/kernels"
cp "$gate" "$repo/tools/gpu_mutation_gate"
cp "$usage" "$repo/tools/usage.sh"
chmod +x "$repo/tools/gpu_mutation_gate"
# The fake Bazel prints the labels of gpu_tests.txt that the query's set() names, as
# `bazel query 'attr(tags, gpu, tests(set(...)))'` would; it fails on anything but a query.
cat >"$repo/bazelw" <<'EOF'
#!/usr/bin/env bash
[[ "$1" == query ]] || { echo "fake bazelw: only query is answered, got $*" >&2; exit 3; }
expr="${*: -1}"
while read -r t; do [[ "$expr" == *"$t "* ]] && echo "$t"; done <"$(dirname "$0")/gpu_tests.txt"
exit 0
EOF
chmod +x "$repo/bazelw"
printf '%s\n' //kernels:decode_gpu_test //kernels:metadata_gpu_test //other:decode_gpu_test >"$repo/gpu_tests.txt"
printf 'int Scale(int x) {\n  return 2 * x;\n}\n' >"$repo/kernels/scale.hip.cc"
git -C "$repo" init -q

# A mutant of kernels/scale.hip.cc with the given header lines and replacement line.
write_mutant() {  # name, replacement for "return 2 * x;", header lines...
  local name="$1" line="$2"
  shift 2
  {
    printf '%s\n' "$@"
    printf -- '--- a/kernels/scale.hip.cc\n+++ b/kernels/scale.hip.cc\n'
    printf '@@ -1,3 +1,3 @@\n int Scale(int x) {\n-  return 2 * x;\n+  %s\n }\n' "$line"
  } >"$repo/tests/gpu_mutants/$name.patch"
}

expect() {  # exit code, message fragment, mutant names...
  local want="$1" fragment="$2" out rc=0 paths=()
  shift 2
  for m in "$@"; do paths+=("tests/gpu_mutants/$m.patch"); done
  out=$(cd "$repo" && tools/gpu_mutation_gate --check "${paths[@]}" 2>&1) || rc=$?
  [[ $rc -eq $want ]] || { echo "FAIL --check $*: exit $rc, want $want: $out"; exit 1; }
  [[ "$out" == *"$fragment"* ]] || { echo "FAIL --check $*: output lacks '$fragment': $out"; exit 1; }
  echo "ok: --check $* -> $rc: $out"
}

write_mutant good 'return 3 * x;' '# why: scales by 3' '# test: //kernels:decode_gpu_test' \
  '# filter: DecodeGpuTest.*'
write_mutant flagged 'return x;' '# why: no scale' '# test: //kernels:metadata_gpu_test' \
  '# flags: --//third_party/rules_hip:cuda_archs=sm_80'
expect 0 "2 mutants apply, and their 2 tests are GPU tests" good flagged

# A patch whose context the code no longer has.
write_mutant stale 'return 4 * x;' '# why: stale' '# test: //kernels:decode_gpu_test'
sed -i 's/^ int Scale(int x) {$/ int Scale(long x) {/' "$repo/tests/gpu_mutants/stale.patch"
expect 1 "stale.patch is stale (does not apply)" good stale

# A test that is not GPU-tagged (not in the fake query's answer), and a test that does not exist.
write_mutant cpu_test 'return 5 * x;' '# why: cpu' '# test: //kernels:decode_test'
expect 1 "'//kernels:decode_test' is not a GPU-tagged test" good cpu_test

# Malformed headers.
write_mutant no_test 'return 6 * x;' '# why: no test line'
expect 2 "'# test:' wants //pkg:name, got ''" no_test
write_mutant bad_label 'return 6 * x;' '# why: bad label' '# test: kernels/decode_gpu_test'
expect 2 "'# test:' wants //pkg:name" bad_label
write_mutant spaced_filter 'return 7 * x;' '# why: filter' '# test: //kernels:decode_gpu_test' \
  '# filter: DecodeGpuTest.* -Slow'
expect 2 "the filter has spaces or quotes" spaced_filter
write_mutant quoted_flags 'return 8 * x;' '# why: flags' '# test: //kernels:decode_gpu_test' \
  "# flags: --copt='-O0'"
expect 2 "the flags have quotes" quoted_flags
write_mutant baseline_x 'return 9 * x;' '# why: name' '# test: //kernels:decode_gpu_test'
expect 2 "a mutant's name may not start with baseline" baseline_x
expect 2 "no such mutant" missing

# Two tests whose binaries would land in the same folder under one name.
write_mutant other_pkg 'return 10 * x;' '# why: other' '# test: //other:decode_gpu_test'
expect 2 "two tests share a binary name" good other_pkg

# A mutant left applied by an interrupted run would be built into the baseline.
git -C "$repo" apply tests/gpu_mutants/good.patch
expect 2 "good.patch is applied to the working tree" good
git -C "$repo" apply -R tests/gpu_mutants/good.patch
expect 0 "1 mutants apply" good

echo "PASS"
