#!/usr/bin/env bash
# Install the real harness CLIs at the exact versions of .ci/clis-package.json
# into .clis/ (git-ignored). Re-running with the same versions does nothing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.clis"
manifest="$root/.ci/clis-package.json"
if ! command -v npm >/dev/null 2>&1; then
  echo "install-clis: npm not found; the real-CLI tests will be skipped" >&2
  exit 0
fi
mkdir -p "$dest"
if cmp -s "$manifest" "$dest/package.json" && [ -f "$dest/.installed" ]; then
  echo "install-clis: already installed in $dest"
  exit 0
fi
echo "install-clis: installing into $dest (about 1.6 GB with their native binaries; a few minutes):"
# One "  name@version" line per dependency of the manifest.
sed -n '/"dependencies"/,/}/s/^ *"\([^"]*\)": *"\([^"]*\)".*/  \1@\2/p' "$manifest"
cp "$manifest" "$dest/package.json"
rm -f "$dest/.installed"
# npm draws its progress bar only on a terminal; elsewhere (CI logs, pipes) it
# would print nothing until the end, so each download is logged as a line instead.
if [ -t 2 ]; then
  progress=(--progress=true --loglevel=notice)
else
  progress=(--progress=false --loglevel=http)
fi
(cd "$dest" && npm install --no-audit --no-fund "${progress[@]}")
touch "$dest/.installed"
echo "install-clis: done; the CLIs are in $dest/node_modules/.bin:"
ls "$dest/node_modules/.bin"
