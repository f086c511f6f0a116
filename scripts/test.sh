#!/usr/bin/env bash
# The checks and the test suite, in tiers, stopping at the first tier that fails:
#   bash scripts/test.sh                  checks -> unit -> integration -> chaos
#   bash scripts/test.sh checks           ruff check, ruff format --check, mypy
#   bash scripts/test.sh unit [args]      tests/unit across the cores (pytest-xdist); no broker
#   bash scripts/test.sh integration [args]
#                                         tests/integration against a real broker: across the cores,
#                                         then the tests marked `serial` one at a time
#   bash scripts/test.sh chaos [args]     the chaos tests (tests/chaos and any test marked chaos), serially
#   bash scripts/test.sh soak [args]      the long property runs (hypothesis profile `soak`); not in CI
#   bash scripts/test.sh [pytest args]    the checks, then one plain pytest with these args, e.g.
#                                         bash scripts/test.sh tests/unit -q   or   -m "not chaos"
# A tier's args go to its pytest after the tier's own. The tier comes from the test's folder
# (tests/conftest.py), so a new test file gets its tier by where it is.
# Broker (integration, chaos, and a plain pytest that names anything beyond tests/unit):
# KAFKA_BOOTSTRAP_SERVERS if set; else `runfold kafka up` (Docker if running, else Apache Kafka jars
# from Maven on 127.0.0.1:${RUNFOLD_KAFKA_PORT:-9092}), stopped again on exit if this script started it.
# RUNFOLD_TEST_WORKERS: the xdist workers of the parallel tiers (default: one per core).
# CI=true: pytest prints each tier's 25 slowest tests, and the run ends with the 25 slowest of all.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_broker.sh

WORKERS="${RUNFOLD_TEST_WORKERS:-auto}"
# worksteal: a worker that ran out of tests takes some of another's queue (a few tests take a
# minute: with plain load balancing one worker can be left running them while the other idles)
XDIST=(-n "$WORKERS" --dist worksteal)
REPORTS="$(mktemp -d "${TMPDIR:-/tmp}/runfold-tests.XXXXXX")"
TIMES=()     # "tier seconds result" of each tier run, for the summary
RAN_TESTS=0  # 1 once a pytest run ran at least one test (exit 5 is "no tests": only then an error)

cleanup() {
  stop_broker_if_started
  rm -rf "$REPORTS"
}
trap cleanup EXIT

durations() {
  if [ -n "${CI:-}" ]; then
    echo "--durations=25"
  fi
}

# One pytest run of a tier; its junit XML feeds the summary. Exit 5 (no test selected, e.g. every
# test of a pass deselected by -k) is not a failure; any other non-zero status is.
run_pytest() {
  local name="$1"
  shift
  local rc=0
  .venv/bin/python -m pytest --junitxml="$REPORTS/$name.xml" $(durations) "$@" || rc=$?
  if [ "$rc" = "5" ]; then
    echo "($name: no test selected)" >&2
    return 0
  fi
  if [ "$rc" = "0" ]; then
    RAN_TESTS=1
  fi
  return "$rc"
}

timed() {
  local tier="$1"
  shift
  local t0=$SECONDS rc=0
  echo "=== tier: $tier" >&2
  "$@" || rc=$?
  local took=$((SECONDS - t0))
  TIMES+=("$tier ${took}s $([ "$rc" = 0 ] && echo passed || echo "FAILED (exit $rc)")")
  echo "=== tier: $tier ${took}s, exit $rc" >&2
  return "$rc"
}

summary() {
  echo "=== tiers" >&2
  local line
  for line in "${TIMES[@]}"; do
    echo "  $line" >&2
  done
  if [ -n "${CI:-}" ] && compgen -G "$REPORTS/*.xml" >/dev/null; then
    .venv/bin/python - "$REPORTS" <<'PY' >&2
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

cases = []
for xml in sorted(Path(sys.argv[1]).glob("*.xml")):
    for case in ET.parse(xml).iter("testcase"):
        cases.append((float(case.get("time", 0)), xml.stem, f"{case.get('classname')}::{case.get('name')}"))
cases.sort(reverse=True)
print(f"=== the 25 slowest of {len(cases)} tests (all tiers)")
for took, tier, name in cases[:25]:
    print(f"  {took:8.2f}s  {tier:<18} {name}")
PY
  fi
}

checks() {
  # chained: a function run in an `||` list does not stop at a failing line under `set -e`
  .venv/bin/ruff check . &&
    .venv/bin/ruff format --check . &&
    .venv/bin/mypy --explicit-package-bases processors schemas topology benchmarks
}

unit() {
  run_pytest unit tests/unit "${XDIST[@]}" "$@"
}

integration() {
  # Tests isolated by their topic prefix run side by side; the ones marked `serial` (their own
  # brokers, fixed resources, CPU-bound timing: the marker says why) run alone afterwards.
  local rc=0
  run_pytest integration tests/integration -m "not chaos and not serial" "${XDIST[@]}" "$@" || rc=$?
  [ "$rc" = 0 ] || return "$rc"
  run_pytest integration-serial tests/integration -m "serial and not chaos" "$@"
}

chaos() {
  # Serially: the scenarios kill, freeze and restart processes and brokers, and count on the CPU.
  run_pytest chaos tests/chaos tests/integration -m chaos "$@"
}

soak() {
  HYPOTHESIS_PROFILE=soak run_pytest soak tests/unit "${XDIST[@]}" --timeout 0 "$@"
}

# A plain pytest run needs the broker unless every path it names is under tests/unit.
needs_broker() {
  local arg named=0
  for arg in "$@"; do
    case "$arg" in
      tests/unit | tests/unit/*) named=1 ;;
      tests | tests/ | tests/* | */tests/*) return 0 ;;
    esac
  done
  [ "$named" = 0 ]
}

finish() {
  local rc="$1"
  summary
  if [ "$rc" = 0 ] && [ "$RAN_TESTS" = 0 ]; then
    echo "no test ran" >&2
    exit 5
  fi
  exit "$rc"
}

tier="${1:-all}"
case "$tier" in
  all)
    ensure_venv
    timed checks checks || finish $?
    timed unit unit || finish $?
    ensure_broker
    timed integration integration || finish $?
    timed chaos chaos || finish $?
    finish 0
    ;;
  checks)
    ensure_venv --no-engine
    timed checks checks
    exit $?
    ;;
  unit | soak)
    shift
    # no pre-built engine needed: the tests that compare the two engines build it themselves
    ensure_venv --no-engine
    rc=0
    timed "$tier" "$tier" "$@" || rc=$?
    finish "$rc"
    ;;
  integration | chaos)
    shift
    ensure_venv
    ensure_broker
    rc=0
    timed "$tier" "$tier" "$@" || rc=$?
    finish "$rc"
    ;;
  *)
    ensure_venv
    timed checks checks || finish $?
    if needs_broker "$@"; then
      ensure_broker
    fi
    rc=0
    timed pytest run_pytest pytest "$@" || rc=$?
    finish "$rc"
    ;;
esac
