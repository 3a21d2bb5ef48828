#!/usr/bin/env bash
# The sdist carries its own tests. Install it (pip install SDIST) into a fresh virtual
# environment that sees this one's packages, so nothing but the sdist's own build comes
# from the package index; unpack it; check that it holds every file of the repository the
# tests read; then run tests from the unpacked tree against the installed package.
#
# Which tests: the unit and contract tests, the env, the command and the packaging checks
# (the list below: about 2 minutes on 2 cores), not the whole suite a second time: the main
# run tests the same sources in full, including what is left out here (the docs' code
# blocks, the command on a pseudo-terminal, rollouts, vector workers killed mid-step,
# process families, containment, floods, Ray).
# `-m "not cli"`: an sdist has no .clis/, so the real-CLI tests cannot run from it.
set -euo pipefail
sdist=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH

python -m venv --system-site-packages "$work/venv"
venv_python="$work/venv/bin/python"
"$venv_python" -m pip install --quiet --no-deps "$sdist"

tar -xzf "$sdist" -C "$work"
tree=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'gym_harness-*')
missing=0
while IFS= read -r path; do
  if [ ! -e "$tree/$path" ]; then
    echo "sdist-tests: the sdist lacks $path" >&2
    missing=1
  fi
done < <(git -C "$root" ls-files tests docs notebooks .ci LICENSE CHANGELOG.md README.md mkdocs.yml pyproject.toml MANIFEST.in)
[ "$missing" = 0 ]

cd "$tree"
# -P: the current directory is not put on sys.path, so gym_harness is the installed one.
"$venv_python" -P -c '
import sys, gym_harness
where = gym_harness.__file__
assert where.startswith(sys.prefix), f"gym_harness imported from {where}, not the sdist install"
print("sdist-tests: gym_harness", gym_harness.__version__, "from", where)
'
"$venv_python" -P -m pytest -m "not cli" -p no:cacheprovider \
  tests/project/test_packaging.py tests/project/test_layout.py tests/rollout/test_cli.py \
  tests/env/test_env.py tests/records/test_trajectory.py tests/records/test_values.py \
  tests/turn/test_outcome.py tests/utils/test_parsers.py tests/spaces/test_spaces.py \
  tests/utils/test_json_bounds.py tests/bridge/test_tools.py
