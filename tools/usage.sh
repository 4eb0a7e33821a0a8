# Sourced by the shell tools here before they read their arguments. The sourcing script's
# comment header, from its second line to its `set -euo pipefail`, is its help.
#
# answer_usage ARG [OPTION ...]: for -h or --help, prints the help and exits 0; for any other
# ARG that looks like an option and is not one of the OPTIONs, says so and exits 2 (rather than
# taking it for a folder or a patch); otherwise returns.
answer_usage() {
  local arg="$1" option
  shift
  case "$arg" in
    -h | --help)
      sed -n '2,/^set -euo pipefail$/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
      exit 0
      ;;
    -*)
      for option in "$@"; do [[ "$arg" != "$option" ]] || return 0; done
      echo "$(basename "$0"): unknown option $arg (see --help)" >&2
      exit 2
      ;;
  esac
}
