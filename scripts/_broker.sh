# Sourced by test.sh and demo.sh: the venv and the broker (topology.broker's selection rules).
#   ensure_venv                 create .venv (python3.11) if missing, install runfold[test] into it and
#                               build the compiled engine (ensure_engine)
#   ensure_venv --no-engine     the same without the engine build (a tier that does not need it)
#   ensure_engine               `runfold engine build` (a hash of the sources when it is built already)
#   ensure_broker               KAFKA_BOOTSTRAP_SERVERS set -> use it; else `runfold kafka up` and export it.
#                               Sets RUNFOLD_STARTED_BROKER=1 only when this script started the broker.
#   stop_broker_if_started      `runfold kafka down`, only for a broker this script started
#                               (a broker that was already running, e.g. a shared dev broker, is left alone)

ensure_venv() {
  local engine_too=1
  [ "${1:-}" = "--no-engine" ] && engine_too=0
  if [ ! -x .venv/bin/python ]; then
    local py=python3.11
    command -v "$py" >/dev/null 2>&1 || py=python3
    echo "creating .venv with $py" >&2
    "$py" -m venv .venv
  fi
  if [ "${RUNFOLD_SKIP_INSTALL:-}" != "1" ]; then
    # Editable install: code changes need no reinstall, only pyproject.toml changes do (packages,
    # entry points), so a stamp of it skips pip's ~10 s and its build chatter on every run. The
    # stamp holds the checkout's path too: an editable install points at one directory, and a
    # .venv copied or moved from another checkout would run that checkout's code.
    local stamp=.venv/.runfold-install-stamp want
    want="$(.venv/bin/python -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())') $(pwd -P)"
    if [ ! -x .venv/bin/runfold ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
      .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' >&2 &&
        printf '%s\n' "$want" > "$stamp"
    fi
    if [ "$engine_too" = "1" ]; then
      ensure_engine
    fi
  fi
}

ensure_engine() {
  # The compiled engine (processors/native_engine.py): ~20 s once per set of engine sources,
  # a hash of them otherwise. If it cannot build, the engine runs interpreted, said here.
  local engine="${RUNFOLD_ENGINE:-auto}"
  if [ "${engine,,}" != "interpreted" ] && ! .venv/bin/runfold engine build >&2; then
    echo "warning: the compiled engine did not build (above): the engine runs interpreted;" \
      "a processor with RUNFOLD_ENGINE=compiled refuses to start" >&2
  fi
}

RUNFOLD_STARTED_BROKER=0

ensure_broker() {
  if [ -n "${KAFKA_BOOTSTRAP_SERVERS:-}" ]; then
    echo "using the Kafka cluster at KAFKA_BOOTSTRAP_SERVERS=$KAFKA_BOOTSTRAP_SERVERS" >&2
    return 0
  fi
  local out
  if ! out=$(.venv/bin/python -m topology kafka up --json); then
    echo "$out" >&2
    return 1
  fi
  KAFKA_BOOTSTRAP_SERVERS=$(printf '%s' "$out" | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["bootstrap"])')
  export KAFKA_BOOTSTRAP_SERVERS
  if printf '%s' "$out" | .venv/bin/python -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if d["broker"] != "external" and not d.get("already_running") else 1)'; then
    RUNFOLD_STARTED_BROKER=1
  fi
  if [ "$RUNFOLD_STARTED_BROKER" = "1" ]; then
    echo "Kafka started at $KAFKA_BOOTSTRAP_SERVERS (stop: runfold kafka down)" >&2
  else
    echo "Kafka already running at $KAFKA_BOOTSTRAP_SERVERS" >&2
  fi
}

stop_broker_if_started() {
  if [ "$RUNFOLD_STARTED_BROKER" = "1" ]; then
    env -u KAFKA_BOOTSTRAP_SERVERS .venv/bin/python -m topology kafka down >&2 || true
  fi
}
