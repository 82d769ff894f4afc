#!/usr/bin/env bash
# Makes the MCP tests runnable: Debian's Chromium and the pinned MCP servers
# (@playwright/mcp, @modelcontextprotocol/server-everything). Idempotent, so
# runtime/tests/mcp.rs and tests/tests/browser.rs run it every time; each step
# is skipped when its result is already there, which keeps a warm run to a
# few milliseconds.
set -euo pipefail
cd "$(dirname "$0")"

# The machine's Node.js runs the servers; both packages need 20 or newer.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "setup.sh: node and npm are needed (Node.js 20 or newer)" >&2
  exit 1
fi
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$node_major" -lt 20 ]; then
  echo "setup.sh: Node.js $(node --version) is too old; the MCP servers need 20 or newer" >&2
  exit 1
fi

# Playwright's MCP server drives the distribution's Chromium: a browser build
# of its own would be a download from outside the package registries.
if ! command -v chromium >/dev/null; then
  as_root=()
  if [ "$(id -u)" -ne 0 ]; then
    # -n: fail at once rather than wait for a password nobody will type.
    as_root=(sudo -n)
  fi
  echo "setup.sh: installing Debian's chromium" >&2
  # The package lists may be empty or stale on a new machine.
  "${as_root[@]}" apt-get update -q
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
fi

# npm writes node_modules/.package-lock.json on every install, so it is older
# than the committed lock exactly when the lock changed since.
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "setup.sh: npm ci" >&2
  npm ci --no-audit --no-fund
fi
