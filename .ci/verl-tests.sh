#!/usr/bin/env bash
# verl's agent-loop contract tests (tests/verl/) in a virtualenv of their own: verl 0.9
# pins transformers<5.11, which the main environment's TRL does not accept. verl goes in
# without its requirements (vLLM or SGLang, wandb, tensorboard, peft ... are for GPU
# training); then what its agent-loop modules import, and gym_harness with its test extra.
# torch is pinned so pip takes the CPU wheel at hand (as .ci/run does).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-verl
python -m venv --clear "$venv"
py="$venv/bin/python"
"$py" -m pip install --quiet 'torch==2.13.0'
"$py" -m pip install --quiet --no-deps 'verl==0.9.1'
"$py" -m pip install --quiet -e '.[test]' 'torch==2.13.0' \
    'transformers>=5.5.3,!=5.6.0,<5.11' tokenizers hydra-core 'ray>=2.41' \
    'tensordict>=0.8,!=0.9.0,<=0.10' pillow codetiming fastapi
PYTHONPATH=$PWD "$py" -m pytest -n 0 tests/verl/
