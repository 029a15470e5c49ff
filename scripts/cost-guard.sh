#!/usr/bin/env bash
# The cost guard (issue 41): counts with callgrind the instructions the proxy executes per
# request (SET NX PX on fresh keys and the compare-and-delete release, -P 1 and -P 16, over 1
# and 5 masters) and a master's per granted acquire (the proxy's lock script vs a bare
# SET NX PX), and fails when one grows by more than the margin of benches/cost-baseline.toml.
# About 1 ½ minutes on 2 CPUs once built. See README.md, "Cost guard".
#
#   scripts/cost-guard.sh                      # compare with the baseline; exit 1 on growth
#   COST_GUARD_UPDATE=1 scripts/cost-guard.sh  # write what it measured into the baseline
#   COST_GUARD_RUNS=5 scripts/cost-guard.sh    # more runs per cell (3 by default)
#
# It builds with the tests' profile (release-tests, as scripts/test.sh): in CI, after the
# tests, only the guard itself compiles, and the baseline counts the code of that profile.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib.sh
ensure_redis
if ! command -v valgrind >/dev/null || ! command -v callgrind_control >/dev/null; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -q valgrind
fi

exec cargo bench --profile release-tests --bench costguard "$@"
