"""LitGPT's own fine-tuning step under fake tensors: its model code, its LoRA, its chunked loss, its Fabric precision.

Runs in its own virtual environment (LitGPT 0.5.13 pins huggingface-hub < 1.4, below what transformers 5.24 needs):

    python3 -m venv .venv-litgpt && .venv-litgpt/bin/pip install torch==2.13.0 litgpt==0.5.13
    .venv-litgpt/bin/python benchmarks/validation/litgpt_fake.py --case '{"model": "Qwen/Qwen2.5-0.5B",
        "method": "lora", "seq_len": 1024, "batch_size": 2}'

What one step is, read from LitGPT 0.5.13 (litgpt/finetune/lora.py and full.py, ``setup``/``main``/``fit``):

- ``L.Fabric(devices=1, precision="bf16-true")``: the model is created under ``fabric.init_module()`` (every
  parameter in bf16, LoRA's included) and wrapped by ``fabric.setup_module``, whose forward returns its outputs
  converted to the default dtype (Lightning's ``HalfPrecision.convert_output``: fp32);
- LoRA: ``litgpt.lora.GPT`` with the ``Config`` of the Hugging Face model (``lora_r``, ``lora_alpha``,
  ``lora_dropout`` and the ``lora_query`` / ``lora_key`` / ``lora_value`` / ``lora_projection`` / ``lora_mlp`` /
  ``lora_head`` flags; defaults 8, 16, 0.05, query and value), ``mark_only_lora_as_trainable``; full:
  ``litgpt.model.GPT``, everything trains;
- the optimizer ``instantiate_torch_optimizer("AdamW", ...)`` (``--optimizer``: AdamW by default, SGD as asked):
  ``torch.optim.AdamW``, which on CUDA takes the foreach implementation (passed explicitly here: fake tensors are
  not foreach-supported types), or ``fused`` for the plan's adamw_torch_fused;
- each step: ``logits = model(input_ids, lm_head_chunk_size=128)`` (a list of 128-token chunks),
  ``logits[-1] = logits[-1][..., :-1, :]``, ``loss = chunked_cross_entropy(logits, targets[..., 1:])``,
  ``fabric.backward(loss)``, ``optimizer.step()``, ``optimizer.zero_grad()``; the ``logits`` list stays alive until
  the next step rebinds it (a local of ``fit``), which is kept here too.

No activation checkpointing: LitGPT's single-device fine-tuning scripts have none. The attention is routed as a GPU
runs it (``fake_mode.gpu_routing``). Quantization (``--quantize bnb.nf4``) is not run here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

LITGPT_LORA_DEFAULTS = {"lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "lora_query": True, "lora_key": False,
                        "lora_value": True, "lora_projection": False, "lora_mlp": False, "lora_head": False}
LM_HEAD_CHUNK = 128  # fit(): model(input_ids, lm_head_chunk_size=128)


def litgpt_config(hf_model: str, config_class=None, **overrides):
    """LitGPT's Config for a Hugging Face model id (its ``hf_config`` org/name), with ``overrides`` (``config_class``:
    ``litgpt.lora.Config`` for LoRA fields)."""
    from litgpt.config import Config, configs

    config_class = config_class or Config
    org, _, name = hf_model.partition("/")
    for entry in configs:
        hf = entry.get("hf_config", {})
        if hf.get("org") == org and hf.get("name") == name:
            return config_class.from_name(entry["name"], **overrides)
    raise ValueError(f"LitGPT 0.5.13 has no config for {hf_model}")


# The plan's optim as LitGPT's --optimizer builds it (litgpt/utils.py instantiate_torch_optimizer: a torch.optim
# class), with foreach/fused passed as CUDA picks them (fake tensors are not foreach-supported types)
OPTIMIZERS = {"adamw_torch": ("AdamW", {"foreach": True}), "adamw_torch_fused": ("AdamW", {"fused": True}),
              "sgd": ("SGD", {"foreach": True})}


def _optimizer(optim: str, params):
    import torch

    if optim not in OPTIMIZERS:
        raise ValueError(f"optim {optim!r}: LitGPT's step is measured with {', '.join(OPTIMIZERS)}")
    name, kwargs = OPTIMIZERS[optim]
    return getattr(torch.optim, name)(params, lr=3e-4, weight_decay=0.0, **kwargs)


def run_litgpt_steps(case: dict, steps: int = 2) -> dict:
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import fake_mode as fm
    import lightning as L
    import torch
    from litgpt.utils import chunked_cross_entropy
    from torch._subclasses.fake_tensor import FakeTensorMode

    method = case.get("method", "lora")
    seq, batch = int(case["seq_len"]), int(case.get("batch_size", 1))
    overrides = {k: case[k] for k in ("n_layer",) if k in case}
    config_class = None
    if method == "lora":
        from litgpt.lora import GPT, mark_only_lora_as_trainable
        from litgpt.lora import Config as config_class

        overrides.update({k: case.get(k, v) for k, v in LITGPT_LORA_DEFAULTS.items()})
    elif method == "full":
        from litgpt.model import GPT
    else:
        raise ValueError(f"method {method!r}: this harness runs LitGPT's lora and full fine-tuning")
    config = litgpt_config(case["model"], config_class, **overrides)
    counter = fm._make_counter_class()()
    model = optimizer = None

    def category_tensors():
        return {"parameters": fm._model_state_tensors(model) if model is not None else [],
                "gradients": [p.grad for p in model.parameters()] if model is not None else [],
                "optimizer_states": fm._optimizer_state_tensors(optimizer)}

    counter.category_tensors = category_tensors
    fabric = L.Fabric(devices=1, accelerator="cpu", precision="bf16-true")
    timeline, state = [], {}
    with fm.gpu_routing(True) as routed, fm.classic_module_apply(), FakeTensorMode(allow_fallback_kernels=False), \
            counter:
        counter.set_phase("build")
        with fabric.init_module(empty_init=False):
            model = GPT(config)
        if method == "lora":
            mark_only_lora_as_trainable(model)
        model = fabric.setup_module(model)
        optimizer = _optimizer(case.get("optim", "adamw_torch"), model.parameters())
        optimizer = fabric.setup_optimizers(optimizer)
        model.max_seq_length = seq
        state["after_build"] = counter.current
        state["after_build_categories"] = counter.categories_now()
        counter.reset_peak()
        logits = None
        # fit(): the optimizer steps when not is_accumulating; two micro-batches stand for any accumulation (the
        # second, like every later one, runs with the earlier ones' gradients alive)
        micro_steps = 2 if int(case.get("gradient_accumulation_steps", 1)) > 1 else 1
        for step in range(1, steps + 1):
            start = counter.current
            for _ in range(micro_steps):
                input_ids = torch.randint(0, config.vocab_size, (batch, seq))
                targets = input_ids.clone()
                counter.set_phase(f"step{step}.forward")
                logits = model(input_ids, lm_head_chunk_size=LM_HEAD_CHUNK)
                logits[-1] = logits[-1][..., :-1, :]
                loss = chunked_cross_entropy(logits, targets[..., 1:])
                counter.set_phase(f"step{step}.backward")
                fabric.backward(loss)
                del loss
            counter.set_phase(f"step{step}.optimizer")
            optimizer.step()
            counter.classify()
            if step == steps:
                state["end_categories"] = counter.categories_now()
            optimizer.zero_grad()
            timeline.append({"step": step, "start": start, "end": counter.current})
        del logits
        counter.set_phase("done")
    report = fm.measurement_report(counter, state, timeline, routed, {
        "litgpt_config": config.name, "padded_vocab_size": config.padded_vocab_size, "n_layer": config.n_layer,
        "params_total": sum(p.numel() for p in model.parameters()),
        "params_trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)})
    return {**report, "loss": "litgpt_chunked", "fake": True, "driver": "litgpt"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", required=True, help="JSON: model, method, seq_len, batch_size, LitGPT LoRA fields")
    parser.add_argument("--out", help="write the result JSON here (also printed)")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import fake_mode

    def run() -> dict:
        import litgpt
        import torch

        result = run_litgpt_steps(json.loads(args.case))
        result["versions"] = {"litgpt": getattr(litgpt, "__version__", "0.5.13"), "torch": torch.__version__}
        return result

    return fake_mode.report_run(run, args.out)


if __name__ == "__main__":
    sys.exit(main())
