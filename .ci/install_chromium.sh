#!/usr/bin/env bash
# Install Debian's chromium for the dashboard's end-to-end test (tests/test_dashboard_browser.py),
# which drives it headless over the DevTools protocol. Idempotent: does nothing when a chromium
# is already on PATH. Needs root (or sudo) and apt; elsewhere it says so and exits 0, and the
# browser test skips.
set -euo pipefail
start=$(date +%s)
for name in chromium chromium-browser google-chrome google-chrome-stable; do
  if command -v "$name" >/dev/null 2>&1; then
    echo "chromium already installed: $(command -v "$name")"
    exit 0
  fi
done
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_chromium.sh: no apt-get here; install chromium yourself to run the browser test" >&2
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "install_chromium.sh: not root and no sudo; the browser test will skip" >&2
    exit 0
  fi
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium
echo "chromium installed in $(( $(date +%s) - start )) s"
