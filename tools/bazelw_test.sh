#!/usr/bin/env bash
# bazelw on a fresh machine, with apt, dpkg and id faked on PATH: every package reads as
# missing, the first `apt-get update` finds the package lists locked (a freshly booted
# machine's unattended upgrades), the second succeeds. bazelw must retry the update, install
# the missing packages in one call, and then run Debian's /usr/bin/bazel (asked only for its
# version here). Then: an update that fails for another reason is not retried, and the install
# log is shown.
set -euo pipefail
bazelw="$(realpath "$1")"
fake="$TEST_TMPDIR/bin"
mkdir -p "$fake"
log="$TEST_TMPDIR/apt.log"
# Unknown to dpkg but for DPKG_INSTALLED (installed) and git (known, not installed); bazelw asks
# for every package in one call.
cat >"$fake/dpkg-query" <<'F'
#!/usr/bin/env bash
echo "dpkg-query $*" >>"$APT_LOG"
for p in $DPKG_INSTALLED; do printf '%s\tinstall ok installed\n' "$p"; done
printf 'git\tdeinstall ok config-files\n'
exit 1
F
cat >"$fake/id" <<'F'
#!/usr/bin/env bash
echo 0
F
cat >"$fake/sleep" <<'F'
#!/usr/bin/env bash
exit 0
F
# A bazelisk first on PATH would fetch another Bazel; bazelw must not run it.
cat >"$fake/bazel" <<'F'
#!/usr/bin/env bash
echo "the bazel first on PATH"
F
cat >"$fake/apt-get" <<'F'
#!/usr/bin/env bash
echo "apt-get $*" >>"$APT_LOG"
if [[ "$1" == update ]]; then
  n=$(grep -c "^apt-get update" "$APT_LOG")
  if [[ "$APT_MODE" == lock && $n -eq 1 || "$APT_MODE" == locked ]]; then
    # apt translates its messages: the test runs in a German locale.
    if [[ "${LC_ALL:-}" == C ]]; then
      echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 42" >&2
    else
      echo "E: Sperre /var/lib/apt/lists/lock konnte nicht bezogen werden" >&2
    fi
    exit 100
  fi
  if [[ "$APT_MODE" == offline ]]; then
    echo "E: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease" >&2
    exit 100
  fi
fi
exit 0
F
chmod +x "$fake"/*
export APT_LOG="$log"
export LANG=de_DE.UTF-8 LC_ALL=de_DE.UTF-8

# Runs bazelw with the fake apt in mode $1: sets $out (its stdout and stderr) and $rc.
run_bazelw() {
  : >"$log"
  rc=0
  out=$(APT_MODE="$1" PATH="$fake:$PATH" "$bazelw" --version 2>&1) || rc=$?
}
fail() { echo "FAIL: $*"; cat "$log"; exit 1; }
updates() { grep -c "^apt-get update" "$log" || true; }

# Locked lists, then success: two updates, one install, then Bazel.
export DPKG_INSTALLED=""
run_bazelw lock
(($(grep -c "^dpkg-query" "$log") == 1)) || fail "dpkg asked more than once"
((rc == 0)) || fail "bazelw exited $rc: $out"
(($(updates) == 2)) || fail "2 updates expected"
grep -q "^apt-get install .*bazel-bootstrap.*libabsl-dev" "$log" ||
  fail "no install of the missing packages"
grep -q "^bazel " <<<"$out" && ! grep -q "first on PATH" <<<"$out" ||
  fail "not Debian's bazel --version: $out"

# Locked for good: 30 tries (5 minutes on a real machine; sleep is faked here), a line on
# stderr for each wait, then exit 1 without an install.
run_bazelw locked
((rc == 1)) || fail "locked for good exited $rc: $out"
(($(updates) == 30)) || fail "30 updates expected"
! grep -q "^apt-get install" "$log" || fail "installed while locked"
(($(grep -c "lists are locked" <<<"$out") == 30)) || fail "no waits shown: $out"

# A failure that is not the lock: one update, no install, exit 1 with apt's message shown.
run_bazelw offline
((rc == 1)) || fail "offline exited $rc: $out"
(($(updates) == 1)) || fail "retried"
! grep -q "^apt-get install" "$log" || fail "installed after a failed update"
grep -q "Failed to fetch" <<<"$out" || fail "apt's message not shown: $out"
# A machine with some packages: only the others are installed (git's leftover configuration
# is not an installed package).
export DPKG_INSTALLED="g++ libabsl-dev bazel-skylib"
run_bazelw ok
((rc == 0)) || fail "bazelw exited $rc: $out"
install=" $(grep "^apt-get install" "$log") " || fail "no install"
for p in g++ libabsl-dev bazel-skylib; do
  [[ "$install" != *" $p "* ]] || fail "reinstalls $p:$install"
done
for p in bazel-bootstrap libgtest-dev git; do
  [[ "$install" == *" $p "* ]] || fail "does not install $p:$install"
done
echo "PASS"
