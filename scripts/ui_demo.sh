#!/usr/bin/env bash
# One command: the demo's runs in the web UI.
#   bash scripts/ui_demo.sh [port]        then open http://127.0.0.1:${port:-8088}/
# Runs `runfold demo` (broker, topics, processor, worker, a batch of runs; the broker is kept),
# then `runfold ui` over the demo's topics, with a fresh index file (.runfold/ui-demo.sqlite)
# that the UI process fills from the run events. Ctrl-C stops the UI; `runfold kafka down`
# stops the broker. Actions sent from this UI are not answered: the demo's processor has stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_broker.sh
ensure_venv
prefix="demo-ui-$(date +%s)"
.venv/bin/runfold demo --topic-prefix "$prefix" --keep-broker
rm -f .runfold/ui-demo.sqlite .runfold/ui-demo.sqlite-wal .runfold/ui-demo.sqlite-shm
exec .venv/bin/runfold ui --topic-prefix "$prefix" --db .runfold/ui-demo.sqlite --port "${1:-8088}"
