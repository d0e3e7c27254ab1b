#!/usr/bin/env bash
# The other stacks' own environments, pinned here (each module's docstring says why; their pins conflict with the main
# venv's and with each other): LitGPT (benchmarks/validation/litgpt_fake.py), Axolotl (axolotl_fake.py), torchtune
# (torchtune_fake.py) and LLaMA-Factory (llamafactory_fake.py). .ci/run starts this in the background while it installs
# the main venv, and waits for it before the tests, whose smoke cases run each stack's own step there
# (tests/test_litgpt.py, test_axolotl_harness.py, test_torchtune_harness.py, test_llamafactory_harness.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

venv() {
  if [ ! -x "$1/bin/python" ]; then
    "$PY" -m venv "$1"
  fi
  "$1/bin/python" -m pip install -q --upgrade pip
  # torch first, pinned: the CPU build, never a CUDA one
  "$1/bin/python" -m pip install -q "torch==2.13.0"
}

litgpt_and_torchtune() {
  venv .venv-litgpt
  .venv-litgpt/bin/python -m pip install -q "torch==2.13.0" "litgpt==0.5.13"

  venv .venv-torchtune
  .venv-torchtune/bin/python -m pip install -q "torch==2.13.0" "torchtune==0.6.1" "torchao==0.15.0"
}

axolotl_and_llamafactory() {
  venv .venv-axolotl
  .venv-axolotl/bin/python -m pip install -q --no-deps "axolotl==0.19.0"
  .venv-axolotl/bin/python -m pip install -q "torch==2.13.0" "triton==3.9.0" "packaging==26.0" "huggingface_hub==1.17.0" \
      "peft==0.20.0" "tokenizers==0.23.1" "transformers==5.16.1" "accelerate==1.13.0" "datasets==4.8.4" \
      "trl==1.9.0" "hf_xet==1.4.3" "typing-extensions==4.15.0" "pydantic==2.12.5" "PyYAML==6.0.3" \
      "numpy<3.0,>=2.1" "bitsandbytes==0.50.2" "axolotl-contribs-lgpl==0.0.7" "axolotl-contribs-mit==0.0.6" \
      "python-dotenv==1.0.1" "zstandard==0.22.0" "schedulefree==1.4.1" "kernels<0.17.0,>=0.16.0" \
      "posthog==6.7.11" "evaluate==0.4.1" "numba<1.0,>=0.63.1" addict fire einops colorama requests \
      sentencepiece scipy fastcore pillow wandb

  # LLaMA-Factory 0.9.5 (llamafactory_fake.py): its requirements at their caps; torchvision 0.28.0 (the CUDA build that
  # pins torch 2.13.0) and torchaudio 2.11.1 do not load against the CPU torch and are removed (the harness says why)
  venv .venv-llamafactory
  .venv-llamafactory/bin/python -m pip install -q "torch==2.13.0" "torchvision==0.28.0" "torchaudio==2.11.1" \
      "llamafactory==0.9.5" "transformers==5.6.0" "peft==0.18.1" "accelerate==1.11.0" "datasets==4.0.0" \
      "trl==0.24.0" "bitsandbytes==0.50.2"
  .venv-llamafactory/bin/python -m pip uninstall -q -y torchvision torchaudio
}

# Two lanes at once (each venv in a folder of its own; pip's cache is safe to share): most of the time is unpacking
# wheels, so the four environments take about two builds' time instead of four. Either lane failing fails the script.
litgpt_and_torchtune &
first=$!
axolotl_and_llamafactory &
second=$!
status=0
wait "$first" || status=1
wait "$second" || status=1
exit "$status"
