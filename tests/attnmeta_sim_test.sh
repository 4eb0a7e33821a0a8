#!/usr/bin/env bash
# attnmeta_sim as a user runs it: exit 0 and PASS on a workload that holds, a JSON report,
# exit 2 (and nothing run) for bad flags and bad workload files, and exit 1 for an injected
# metadata fault, whose snapshot metadata_check rejects.
set -euo pipefail
sim="$1"
check="$2"
workload="$3"
tmp="$TEST_TMPDIR"

expect_rc() {  # want, command...
  local want="$1" rc=0
  shift
  "$@" >"$tmp/out" 2>&1 || rc=$?
  [[ $rc -eq $want ]] || { echo "exit code $rc, want $want: $*"; cat "$tmp/out"; exit 1; }
  # A refused invocation (exit 2) runs no scenario.
  if [[ $want -eq 2 ]] && grep -q "^scenario " "$tmp/out"; then
    echo "a bad invocation ran something: $*"; cat "$tmp/out"; exit 1
  fi
}

# The shipped text file is the compiled-in default; a short run of it passes.
expect_rc 0 "$sim" --workload="$workload" --page_sizes=16 --steps=20 --quiet --report="$tmp/r.json"
grep -q '^PASS$' "$tmp/out" || { echo "no PASS line"; cat "$tmp/out"; exit 1; }
grep -q '"passed": true' "$tmp/r.json" || { echo "the JSON report does not say passed"; exit 1; }
grep -q '"scenario": "eagle_topk4"' "$tmp/r.json" || { echo "the JSON report lacks a run"; exit 1; }

# Bad flags and bad workloads: exit 2, a message naming the problem, no report table.
expect_rc 2 "$sim" --no_such_flag
grep -q "unknown flag" "$tmp/out" || { echo "unknown flag not named"; cat "$tmp/out"; exit 1; }
expect_rc 2 "$sim" --steps=abc
expect_rc 2 "$sim" --page_sizes=0 --quiet
grep -q "page_sizes\[0\]" "$tmp/out" || { echo "bad page size not named"; cat "$tmp/out"; exit 1; }
expect_rc 2 "$sim" --dump_all --quiet
expect_rc 2 "$sim" --backend=tpu --quiet
grep -q 'backend' "$tmp/out" || { echo "bad backend not named"; cat "$tmp/out"; exit 1; }
sed 's/prompt_len: 190 /prompt_len: 0 /' "$workload" >"$tmp/bad.textproto"
expect_rc 2 "$sim" --workload="$tmp/bad.textproto"
grep -q "scenarios\[0\].requests\[0\].prompt_len" "$tmp/out" || { echo "field not named"; cat "$tmp/out"; exit 1; }
printf 'name: "x"\nscenarios {\n  nme: "y"\n}\n' >"$tmp/syntax.textproto"
expect_rc 2 "$sim" --workload="$tmp/syntax.textproto"
grep -q "line 3" "$tmp/out" || { echo "syntax error line not named"; cat "$tmp/out"; exit 1; }
expect_rc 2 "$sim" --workload="$tmp/missing.textproto"
# An unwritable report is refused before anything runs.
expect_rc 2 "$sim" --quiet --steps=1 --report="$tmp/no_such_dir/r.json"
grep -q -- "--report" "$tmp/out" || { echo "bad report path not named"; cat "$tmp/out"; exit 1; }

# --scenario runs that scenario alone; an unknown one is refused.
expect_rc 2 "$sim" --scenario=no_such --quiet
grep -q "no such scenario" "$tmp/out" || { echo "unknown scenario not named"; cat "$tmp/out"; exit 1; }
expect_rc 0 "$sim" --scenario=eagle_topk1 --page_sizes=16 --steps=5 --quiet
[[ $(grep -c "^eagle_topk1 " "$tmp/out") -eq 1 && $(grep -c "^chat " "$tmp/out") -eq 0 ]] ||
  { echo "--scenario ran other scenarios"; cat "$tmp/out"; exit 1; }

# --page_sizes replaces the file's page sizes before the file is checked: a file with none, or
# with one the runs would refuse, runs at the flag's.
grep -v '^page_sizes' "$workload" >"$tmp/no_sizes.textproto"
expect_rc 2 "$sim" --workload="$tmp/no_sizes.textproto" --quiet
expect_rc 0 "$sim" --workload="$tmp/no_sizes.textproto" --page_sizes=16 --steps=5 --quiet
sed 's/^page_sizes: \[/page_sizes: [4096, /' "$workload" >"$tmp/big_size.textproto"
expect_rc 2 "$sim" --workload="$tmp/big_size.textproto" --quiet
expect_rc 0 "$sim" --workload="$tmp/big_size.textproto" --page_sizes=16 --steps=5 --quiet

# An injected fault: FAIL, exit 1, and a snapshot that metadata_check rejects.
mkdir -p "$tmp/dump"
expect_rc 1 "$sim" --page_sizes=16 --inject_fault=30 --dump_dir="$tmp/dump" --quiet
grep -q '^FAIL$' "$tmp/out" || { echo "no FAIL line"; cat "$tmp/out"; exit 1; }
snapshots=("$tmp"/dump/*.textproto)
[[ -f "${snapshots[0]}" ]] || { echo "no snapshot written"; cat "$tmp/out"; exit 1; }
expect_rc 1 "$check" "${snapshots[@]}"
grep -q "^FAIL " "$tmp/out" || { echo "metadata_check did not reject the snapshot"; cat "$tmp/out"; exit 1; }
echo "attnmeta_sim: all expectations held"
