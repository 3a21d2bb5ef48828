#!/usr/bin/env bash
# Install the real harness CLIs at the exact versions of .ci/clis-package.json
# into .clis/ (git-ignored). Re-running with the same versions does nothing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.clis"
if ! command -v npm >/dev/null 2>&1; then
  echo "install-clis: npm not found; the real-CLI tests will be skipped" >&2
  exit 0
fi
mkdir -p "$dest"
if cmp -s "$root/.ci/clis-package.json" "$dest/package.json" && [ -f "$dest/.installed" ]; then
  echo "install-clis: already installed in $dest"
  exit 0
fi
cp "$root/.ci/clis-package.json" "$dest/package.json"
rm -f "$dest/.installed"
(cd "$dest" && npm install --no-audit --no-fund --loglevel=error)
touch "$dest/.installed"
ls "$dest/node_modules/.bin"
