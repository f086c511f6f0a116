#!/usr/bin/env bash
# A throwaway PostgreSQL server for the index's tests, from Debian's `postgresql` package
# (installed when missing; needs root, as on CI). Never touches a system cluster.
#   bash scripts/_postgres.sh start DIR PORT   -> prints postgresql://runfold@127.0.0.1:PORT/runfold
#   bash scripts/_postgres.sh stop DIR
set -euo pipefail
cmd=${1:?start|stop} dir=${2:?data directory}

bindir() {
  local found
  found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  if [ -z "$found" ]; then
    if [ "$(id -u)" != "0" ]; then
      echo "PostgreSQL is not installed and this is not root: install Debian's postgresql" >&2
      return 1
    fi
    echo "installing postgresql (Debian package)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >&2
    found=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  fi
  echo "$found"
}

# the server refuses to run as root: as root, run it as the postgres user
as_owner() { if [ "$(id -u)" = "0" ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

case "$cmd" in
  start)
    port=${3:?port}
    bin=$(bindir)
    mkdir -p "$dir"
    [ "$(id -u)" = "0" ] && chown postgres "$dir"
    as_owner "$bin/initdb" -D "$dir/data" -U runfold --auth=trust --locale=C -E UTF8 >"$dir/initdb.log" 2>&1 ||
      { cat "$dir/initdb.log" >&2; exit 1; }
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
      -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off" start >&2 ||
      { cat "$dir/server.log" >&2; exit 1; }
    as_owner "$bin/createdb" -h 127.0.0.1 -p "$port" -U runfold runfold >&2
    echo "postgresql://runfold@127.0.0.1:$port/runfold"
    ;;
  stop)
    bin=$(bindir)
    as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >&2 || true
    ;;
  *) echo "usage: $0 start DIR PORT | stop DIR" >&2; exit 2 ;;
esac
