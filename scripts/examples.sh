#!/usr/bin/env bash
# Build (once, cached) and run the examples in other languages: examples/java (Maven) and
# examples/node (npm). Used by tests/integration/test_examples_other_languages.py; by hand:
#   bash scripts/examples.sh build                 # both
#   bash scripts/examples.sh java --bootstrap 127.0.0.1:9092 --prefix runfold
#   bash scripts/examples.sh node --bootstrap 127.0.0.1:9092 --prefix runfold
# Nothing lands in the work tree: builds go under $RUNFOLD_CACHE_DIR/examples (default
# ~/.cache/runfold/examples), keyed by a hash of the example's sources (Java) or of its
# package.json and package-lock.json (Node), so a second run starts at once and offline.
# Maven's downloads live in its own local repository (~/.m2), npm's in the cache's npm/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd -P)
CACHE="${RUNFOLD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/runfold}/examples"
mkdir -p "$CACHE"

need() {
  command -v "$1" >/dev/null 2>&1 || { echo "examples.sh: \`$1\` is not on PATH; it is needed to $2" >&2; exit 3; }
}

hash_of() {  # a stable hash of the named files' paths and contents
  (cd "$ROOT" && for f in "$@"; do printf '%s\n' "$f"; cat "$f"; done) | sha256sum | cut -c1-16
}

java_dir() {
  local sources
  sources=$(cd "$ROOT" && find examples/java/pom.xml examples/java/src -type f | LC_ALL=C sort)
  # shellcheck disable=SC2086
  printf '%s/java-%s' "$CACHE" "$(hash_of $sources)"
}

node_dir() {
  printf '%s/node-%s' "$CACHE" "$(hash_of examples/node/package.json examples/node/package-lock.json)"
}

build_java() {
  local dir
  dir=$(java_dir)
  [ -f "$dir/.complete" ] && return 0
  need mvn "build examples/java"
  need java "run examples/java"
  exec 9>"$CACHE/.java.lock"
  flock 9  # another process may be building the same sources
  if [ ! -f "$dir/.complete" ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    mvn -q -B -f examples/java/pom.xml "-Drunfold.build.dir=$dir/target" compile dependency:build-classpath \
      "-Dmdep.outputFile=$dir/classpath.txt" >&2
    touch "$dir/.complete"
  fi
  exec 9>&-
}

build_node() {
  local dir
  dir=$(node_dir)
  [ -f "$dir/.complete" ] && return 0
  need npm "install the packages of examples/node"
  need node "run examples/node"
  exec 9>"$CACHE/.node.lock"
  flock 9
  if [ ! -f "$dir/.complete" ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    cp examples/node/package.json examples/node/package-lock.json "$dir/"
    # npm ci: exactly the versions in package-lock.json (kafkajs-lz4's lz4 builds with node-gyp)
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error --cache "$CACHE/npm" >&2)
    touch "$dir/.complete"
  fi
  exec 9>&-
}

cmd="${1:-build}"
shift || true
case "$cmd" in
  build)
    build_java
    build_node
    ;;
  java)
    build_java
    dir=$(java_dir)
    exec java -cp "$dir/target/classes:$(cat "$dir/classpath.txt")" runfold.example.RunfoldExample \
      --schemas "$ROOT/schemas/standalone" "$@"
    ;;
  node)
    build_node
    dir=$(node_dir)
    NODE_PATH="$dir/node_modules" exec node "$ROOT/examples/node/example.js" --schemas "$ROOT/schemas/standalone" "$@"
    ;;
  *)
    echo "usage: bash scripts/examples.sh build | java ARGS... | node ARGS..." >&2
    exit 2
    ;;
esac
