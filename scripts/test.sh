#!/usr/bin/env bash
# Run the checks (ruff, ruff format, mypy) and the whole test suite against a real Kafka broker.
#   bash scripts/test.sh [pytest args...]      e.g. bash scripts/test.sh tests/unit -x
# Broker: KAFKA_BOOTSTRAP_SERVERS if set; else `runfold kafka up` (Docker if running, else Apache Kafka
# jars from Maven on 127.0.0.1:${RUNFOLD_KAFKA_PORT:-9092}), stopped again on exit if this script started it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_broker.sh

ensure_venv
# The checks first (seconds): lint, format, types (strict on the engine, see pyproject.toml).
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy processors schemas topology

trap stop_broker_if_started EXIT
ensure_broker

set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
exit "$rc"
