#!/usr/bin/env bash
# metadata_check accepts the recorded snapshots and rejects corrupted copies, exiting 1 with a
# message that names the broken array.
set -euo pipefail
check="$1"
shift
"$check" "$@" >/dev/null || { echo "metadata_check rejected a good snapshot"; "$check" "$@"; exit 1; }

good=""
for f in "$@"; do case "$f" in *extend.textproto) good="$f" ;; esac; done
[[ -n "$good" ]] || { echo "no extend snapshot given"; exit 1; }

expect_rejected() {  # name, sed expression that corrupts the first match
  local name="$1" expr="$2" bad="$TEST_TMPDIR/$1.textproto" out rc=0
  sed "$expr" "$good" >"$bad"
  cmp -s "$good" "$bad" && { echo "corruption of $name changed nothing"; exit 1; }
  out=$("$check" "$bad") || rc=$?
  [[ $rc -eq 1 ]] || { echo "$name: exit code $rc, want 1: $out"; exit 1; }
  [[ "$out" == *"FAIL $bad: $name"* ]] || { echo "$name: message does not name it: $out"; exit 1; }
  echo "rejected as expected: $out"
}

expect_rejected kv_indices '0,/^kv_indices: [0-9]*/s//kv_indices: 999999/'
expect_rejected kv_indptr '0,/^kv_indptr: 0$/s//kv_indptr: 1/'
expect_rejected qo_indptr '0,/^qo_indptr: 0$/s//qo_indptr: 2/'
expect_rejected kv_last_page_len '0,/^kv_last_page_len: \([0-9]*\)/s//kv_last_page_len: 99/'
expect_rejected page_table '0,/^page_table: [0-9]*/s//page_table: 0/'
expect_rejected max_kv_len 's/^max_kv_len: \([0-9]*\)/max_kv_len: 1\1/'

# --rewrite re-records a snapshot whose arrays are wrong but whose inputs are good; the file
# then checks OK and equals the good one. Bad inputs are refused and the file is left alone.
bad="$TEST_TMPDIR/rewrite.textproto"
sed '0,/^kv_indices: [0-9]*/s//kv_indices: 999999/; s/^max_kv_len: \([0-9]*\)/max_kv_len: 1\1/' "$good" >"$bad"
rc=0
"$check" "$bad" >/dev/null || rc=$?
[[ $rc -eq 1 ]] || { echo "corrupted copy before the rewrite: exit $rc, want 1 (refused)"; exit 1; }
out=$("$check" --rewrite "$bad") || { echo "rewrite failed: $out"; exit 1; }
[[ "$out" == "REWROTE $bad" ]] || { echo "unexpected rewrite output: $out"; exit 1; }
"$check" "$bad" >/dev/null || { echo "rewritten snapshot does not check OK"; exit 1; }
cmp -s <(grep -v '^note' "$good") <(grep -v '^note' "$bad") || { echo "rewrite differs from the good snapshot"; exit 1; }
sed 's/^mode: .*/mode: "decode"/' "$good" >"$bad"
cp "$bad" "$bad.orig"
rc=0; out=$("$check" --rewrite "$bad") || rc=$?
[[ $rc -eq 1 && "$out" == *"FAIL $bad: rebuilding"* ]] || { echo "bad inputs rewritten: $rc $out"; exit 1; }
cmp -s "$bad" "$bad.orig" || { echo "a refused rewrite changed the file"; exit 1; }
# A rewrite whose new text cannot be written (its temporary name taken by a directory) fails
# and leaves the file as it was.
sed '0,/^kv_indices: [0-9]*/s//kv_indices: 999999/' "$good" >"$bad"
cp "$bad" "$bad.orig"
mkdir "$bad.rewrite"
rc=0; out=$("$check" --rewrite "$bad") || rc=$?
[[ $rc -eq 1 && "$out" == *"FAIL $bad: cannot write"* ]] || { echo "unwritable rewrite: $rc $out"; exit 1; }
cmp -s "$bad" "$bad.orig" || { echo "a failed rewrite changed the file"; exit 1; }
rmdir "$bad.rewrite"
rc=0; "$check" --bogus "$good" 2>/dev/null || rc=$?
[[ $rc -eq 2 ]] || { echo "unknown flag: exit code $rc, want 2"; exit 1; }

rc=0; out=$("$check" "$TEST_TMPDIR/does-not-exist") || rc=$?
[[ $rc -eq 1 && "$out" == *"cannot read"* ]] || { echo "missing file: exit code $rc, $out"; exit 1; }
echo "metadata_check: all checks passed"
