#!/usr/bin/env bash
# The shell tools answer --help with their header (which holds the usage) and refuse an
# unknown option with exit status 2, before creating anything: `tools/gpu_bundle --help` once
# built the whole bundle into a folder named --help.
set -euo pipefail
tools=()
for t in "$@"; do tools+=("$(realpath -s "$t")"); done
cd "$TEST_TMPDIR"
for tool in "${tools[@]}"; do
  name="$(basename "$tool")"
  for help in --help -h; do
    out="$("$tool" "$help")" || { echo "FAIL: $name $help exited $?"; exit 1; }
    grep -q "Usage: tools/$name" <<<"$out" || { echo "FAIL: $name $help printed no usage:"; echo "$out"; exit 1; }
  done
  rc=0
  err="$("$tool" --no-such-option 2>&1 >/dev/null)" || rc=$?
  ((rc == 2)) || { echo "FAIL: $name --no-such-option exited $rc, not 2"; exit 1; }
  grep -q "unknown option --no-such-option" <<<"$err" || { echo "FAIL: $name said: $err"; exit 1; }
  [[ ! -e --no-such-option ]] || { echo "FAIL: $name created ./--no-such-option"; exit 1; }
done
echo "PASS: $# tools"
