#!/usr/bin/env bash
# The runfold demo (`runfold demo`): broker, topics, definitions, processor, worker, child executor,
# a batch of runs with live progress, the outcome table, replay verify, clean shutdown.
#   bash scripts/demo.sh [--keep-broker] [--json]
# A local broker the demo starts is stopped at the end unless --keep-broker is given.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_broker.sh

ensure_venv
exec .venv/bin/runfold demo "$@"
