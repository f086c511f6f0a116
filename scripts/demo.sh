#!/usr/bin/env bash
# The runfold demo: a broker, the topics, and a StartRun command produced and read back decoded.
#   bash scripts/demo.sh
# The broker stays up afterwards; stop it with `.venv/bin/runfold kafka down`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_broker.sh

ensure_venv
ensure_broker
export RUNFOLD_TOPIC_PREFIX="${RUNFOLD_TOPIC_PREFIX:-demo}"

echo "== runfold topology create (prefix $RUNFOLD_TOPIC_PREFIX)"
.venv/bin/runfold topology create
echo "== runfold topology verify"
.venv/bin/runfold topology verify
echo "== a StartRun command, produced and read back"
.venv/bin/python scripts/demo_roundtrip.py
