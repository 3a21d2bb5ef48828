#!/usr/bin/env bash
# Install the real harness CLIs at the exact versions of .ci/clis-package.json
# into .clis/ (git-ignored). Re-running with the same versions does nothing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.clis"
manifest="$root/.ci/clis-package.json"
# Node.js: every pinned CLI runs on $node_min; the newest "engines" among them asks for
# $node_wanted (@agentclientprotocol/claude-agent-acp), and npm warns EBADENGINE below it.
node_min=20
node_wanted=22
install_node="install Node.js $node_wanted or newer (with npm): your distribution's nodejs package, or nvm (nvm install $node_wanted)"
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
  echo "install-clis: npm not found; the real-CLI tests will be skipped. To run them, $install_node." >&2
  exit 0
fi
node_version=$(node --version 2>/dev/null || true)
node_major=$(printf '%s' "$node_version" | sed -n 's/^v\([0-9][0-9]*\)\..*/\1/p')
if [ -z "$node_major" ] || [ "$node_major" -lt "$node_min" ]; then
  echo "install-clis: Node.js ${node_version:-of unknown version} is too old for the pinned CLIs (they need $node_min or newer); $install_node, then run this again." >&2
  exit 1
fi
if [ "$node_major" -lt "$node_wanted" ]; then
  echo "install-clis: Node.js $node_version: @agentclientprotocol/claude-agent-acp asks for $node_wanted or newer, so npm will warn EBADENGINE; the CLIs still install and run. To silence it, $install_node." >&2
fi
mkdir -p "$dest"
if cmp -s "$manifest" "$dest/package.json" && [ -f "$dest/.installed" ]; then
  echo "install-clis: already installed in $dest"
  exit 0
fi
echo "install-clis: installing into $dest (about 1.8 GB with their native binaries; a few minutes):"
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
