#!/usr/bin/env bash
# Headless Chromium and its WebDriver for the browser tests (tests/browser/), from Debian's
# packages: `chromium` + `chromium-driver`. Installs them when missing (needs root, as on CI);
# prints the two paths on success, exits non-zero saying why otherwise.
#   bash scripts/_browser.sh
set -euo pipefail

find_bins() {
  CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
  DRIVER=$(command -v chromedriver || true)
  [ -n "$CHROMIUM" ] && [ -n "$DRIVER" ]
}

if ! find_bins; then
  if [ "$(id -u)" != "0" ]; then
    echo "chromium/chromedriver missing and not root: install Debian's chromium and chromium-driver" >&2
    exit 1
  fi
  echo "installing chromium and chromium-driver (Debian packages)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends chromium chromium-driver >&2
  find_bins || { echo "chromium installed but not found on PATH" >&2; exit 1; }
fi
echo "$CHROMIUM"
echo "$DRIVER"
