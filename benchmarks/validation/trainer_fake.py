"""Measure two training steps of TRL 1.16's preference/RL trainers (DPO, ORPO, KTO, reward, GRPO's loss step) under
fake tensors.

:func:`measure_trainer_fake` (and the command line) runs DPO, ORPO, KTO, reward and GRPO's loss step through TRL's own
trainer by default (``driver="trainer"``: benchmarks/validation/pref_trainer_fake.py, ``trainer.training_step`` on a
trainer built as recipes/trainers.py builds it, so object lifetimes are the trainer's). With ``driver="loop"`` every
trainer runs the step written out below (:func:`run_trainer_steps`).

The counting, the GPU routing of attention and of TRL's chunked log-prob kernel, PEFT under fake tensors and the
model build are benchmarks/validation/fake_mode.py's and recipes/model_setup.py's. What is new is what one training step
of each trainer runs, reproduced call for call from TRL 1.16 (.venv/lib/python3.11/site-packages/trl):

- DPO and KTO disable dropout (``disable_dropout=True`` by default: ``disable_dropout_in_model``, every nn.Dropout's
  p = 0, PEFT's lora_dropout included); GRPO keeps it (default False).
- DPO (trainer/dpo_trainer.py ``_compute_loss``): ``add_fused_lm_head(policy, outputs=("log_probs", "entropy",
  "mean_logits", "is_top1"))``; one policy forward over the concatenated [chosen; rejected] batch (2B rows of
  max_length) with ``fused_lm_head=True``; then, unless the reference log-probabilities are precomputed, the
  reference forward under ``torch.no_grad()`` and ``disable_gradient_checkpointing`` -- through ``ref_model``
  (a separate frozen copy, ``add_fused_lm_head(ref_model)``) or, for a PEFT policy without one, through the policy
  inside ``use_adapter(model, None)`` (adapters disabled); then the sigmoid loss on the per-sequence sums.
- KTO (trainer/kto_trainer.py ``_compute_loss``): the KL batch (B mismatched rows) through the policy under
  ``no_grad``; the policy forward over the B completions (outputs ("log_probs", "entropy", "mean_logits")); the
  reference forwards (KL batch and completions) under ``no_grad``; the KTO loss on per-sequence sums.
- Reward (trainer/reward_trainer.py ``compute_loss``): :func:`build_reward_model`; ``model(**inputs)`` over the
  2B rows [chosen; rejected], ``-logsigmoid(rewards_chosen - rewards_rejected).mean()``.
- ORPO (experimental/orpo/orpo_trainer.py ``concatenated_forward`` / ``get_batch_loss_metrics``): :func:`_orpo_loss`;
  no fused head (the model's own logits, upcast to fp32 as accelerate's prepared forward returns them), the chosen
  rows' cross-entropy, ``get_batch_logps`` with ``selective_log_softmax`` routed to what TRL's Triton kernel
  allocates on a GPU (:func:`orpo_gpu_routing`); on a 4-bit base, kbit preparation then
  ``peft_module_casting_to_bf16`` as ORPOTrainer.__init__ does. Two things ORPOTrainer.__init__ does are not written
  out here (the trainer driver runs them): it leaves PEFT's adapters in fp32 on a quantized base (this loop builds
  them as recipes/model_setup.py does, bf16 as SFT/DPO have them), and it runs ``prepare_model_for_kbit_training`` on
  an 8-bit base too (every unquantized weight, the embedding and lm_head included, to fp32).
- GRPO (trainer/grpo_trainer.py ``_compute_loss``, completions given): one policy forward over B rows of
  prompt + completion (outputs ("log_probs", "entropy")), labels -100 on the prompt; old log-probs = the detached
  policy ones (num_iterations 1, steps aligned); the reference log-probs an input computed at generation time
  (beta > 0); the clipped-ratio loss with the per-token KL term, normalised as ``dapo``.

The per-sequence/per-token loss arithmetic is written out from those functions (their own ``_compute_loss`` also
logs metrics with ``.item()``, which fake tensors cannot answer); it is a few B- or B x C-sized fp32 tensors.

On a CPU (no Triton) TRL's fused head scores every position (``compact = _use_triton(device)`` is False); on a GPU
it scores the label-masked positions only. For DPO/KTO every label is valid, so the two agree; for GRPO the CPU path
scores the prompt positions as well; pref_trainer_fake.py (the default driver) measures the GPU's compact path, which
the estimator counts (the completions alone).

``kv_cache_bytes(plan, config, rows, tokens)`` measures the KV cache a ``model.generate`` would hold: one forward
with ``use_cache=True`` over ``rows`` x ``tokens`` and the bytes of every key/value tensor of the returned cache.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import time
from typing import Any


def _fake_mode_module():
    if "fake_mode" not in sys.modules:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_mode.py")
        spec = importlib.util.spec_from_file_location("fake_mode", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["fake_mode"] = module
        spec.loader.exec_module(module)
    return sys.modules["fake_mode"]


def _reference_plan(plan):
    """The plan of TRL's reference copy: the base model as create_model_from_path loads it (the policy's dtype and
    quantization), frozen, no adapters, no checkpointing."""
    from canifinetune.estimator.trainer_memory import reference_plan

    return reference_plan(plan)


def build_reward_model(plan, config: dict):
    """RewardTrainer's model (trl/trainer/reward_trainer.py, 1.16): AutoModelForSequenceClassification with
    num_labels=1 (a score head H -> 1 instead of lm_head), random weights from ``config``, quantized as
    recipes/model_setup.py
    quantizes; PEFT LoRA with task_type SEQ_CLS (PEFT then trains a modules_to_save copy of ``score``); gradient
    checkpointing as transformers 5 enables it, ``enable_input_require_grads`` with PEFT; on a quantized base the
    trainable parameters are cast to bf16 (reward_trainer.py __init__)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from canifinetune.recipes import model_setup

    qconfig = model_setup.quantization_config(plan)
    dtype = model_setup.weight_dtype(plan) if qconfig is None else model_setup.torch_dtype(plan)
    cfg = model_setup.hf_config(config)
    cfg.num_labels = 1
    if getattr(cfg, "pad_token_id", None) is None:
        cfg.pad_token_id = 0
    model = AutoModelForSequenceClassification.from_config(cfg, dtype=dtype,
                                                           attn_implementation=plan.attn_implementation)
    if qconfig is not None:
        model_setup._quantize_model(model, plan, qconfig)
    model.config.use_cache = False
    quantized = qconfig is not None
    if plan.method == "full":
        model.requires_grad_(True)
    if plan.uses_adapters:
        from peft import get_peft_model

        lora = model_setup.lora_config(plan)
        lora.task_type = "SEQ_CLS"
        model = get_peft_model(model, lora)
    model_setup.enable_checkpointing(model, plan)
    if quantized and plan.uses_adapters:
        for name, param in model.named_parameters():
            if param.requires_grad and "lora_magnitude_vector" not in name:
                param.data = param.data.to(torch.bfloat16)
    model.train()
    return model


class _TritonLogProbs:
    """What TRL 1.16's Triton ``selective_log_softmax`` allocates on a GPU (trl/trainer/utils.py: on a cuda/xpu device
    with fp16/bf16/fp32 logits of unit last stride it calls trl/kernels/logprob_entropy.py
    ``_LogProbEntropyFunction``): forward makes four fp32 row tensors (logprobs, entropy, log_z, expected_logit,
    shape logits.shape[:-1]), saves the logits (the caller's view, no copy), the index, log_z and expected_logit, and
    returns logprobs (selective_log_softmax drops the entropy); backward makes ``grad_logits =
    torch.empty_like(logits, memory_format=torch.contiguous_format)`` and writes it in one kernel. The CPU path
    (a per-row log_softmax loop for bf16, logsumexp for fp32) allocates otherwise; the fake harness runs on a CPU
    device, so :func:`orpo_gpu_routing` puts this in its place."""

    _function = None

    @classmethod
    def function(cls):
        if cls._function is None:
            import torch

            class LogProbEntropy(torch.autograd.Function):
                @staticmethod
                def forward(ctx, logits, index):
                    logprobs = torch.empty(logits.shape[:-1], device=logits.device, dtype=torch.float32)
                    entropy = torch.empty_like(logprobs)
                    log_z = torch.empty_like(logprobs)
                    expected_logit = torch.empty_like(logprobs)
                    ctx.save_for_backward(logits, index, log_z, expected_logit)
                    del entropy
                    return logprobs

                @staticmethod
                def backward(ctx, grad_logprobs):
                    logits, _index, _log_z, _expected = ctx.saved_tensors
                    return torch.empty_like(logits, memory_format=torch.contiguous_format), None

            cls._function = LogProbEntropy
        return cls._function


@contextlib.contextmanager
def orpo_gpu_routing():
    """Route ORPO's ``selective_log_softmax`` (trl/experimental/orpo/orpo_trainer.py imports it from
    trl/trainer/utils.py) to :class:`_TritonLogProbs`, as a GPU with Triton runs it."""
    from trl.experimental.orpo import orpo_trainer

    def selective_log_softmax(logits, index, temperature=1.0, row_mask=None):
        return _TritonLogProbs.function().apply(logits, index)

    saved = orpo_trainer.selective_log_softmax
    orpo_trainer.selective_log_softmax = selective_log_softmax
    try:
        yield
    finally:
        orpo_trainer.selective_log_softmax = saved


def reference_mode(plan) -> str:
    """'copy', 'adapter_disabled' or 'none' as TRL 1.16 decides it (estimator/trainers.reference_mode)."""
    from canifinetune.estimator.trainers import reference_mode as decide

    return decide(plan)


def _orpo_loss(model, input_ids, beta):
    """One ORPO loss (trl/experimental/orpo/orpo_trainer.py 1.16, ``concatenated_forward`` and
    ``get_batch_loss_metrics``), its locals gone when it returns, as in the trainer (only the loss's graph is left
    for backward). accelerate's prepared forward returns fp32 outputs (``convert_outputs_to_fp32``): the logits are
    upcast to fp32 before ORPO sees them. Every label is valid (no padding, no prompt masking here)."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from trl.experimental.orpo.orpo_trainer import ORPOTrainer, log1mexp

    rows = input_ids.shape[0]
    len_chosen = rows // 2
    outputs = model(input_ids=input_ids, use_cache=False)
    all_logits = outputs.logits.float()  # accelerate convert_outputs_to_fp32
    del outputs
    labels = input_ids.clone()

    def cross_entropy_loss(logits, labels):
        logits = logits[..., :-1, :].contiguous()
        labels = labels[..., 1:].contiguous()
        loss_fct = nn.CrossEntropyLoss()
        return loss_fct(logits.view(-1, logits.shape[-1]), labels.view(-1))

    chosen_nll_loss = cross_entropy_loss(all_logits[:len_chosen], labels[:len_chosen])
    all_logps = ORPOTrainer.get_batch_logps(all_logits, input_ids, average_log_prob=True)
    chosen_logps, rejected_logps = all_logps[:len_chosen], all_logps[len_chosen:]
    chosen_logits = all_logits[:len_chosen, :-1, :]
    rejected_logits = all_logits[len_chosen:, :-1, :]
    # odds_ratio_loss
    pc, pr = chosen_logps.float(), rejected_logps.float()
    log_odds = (pc - pr) - (log1mexp(pc) - log1mexp(pr))
    ratio = F.logsigmoid(log_odds)
    losses = beta * ratio
    loss = chosen_nll_loss - losses.mean()
    with torch.no_grad():  # metrics (their .item() calls are left out)
        _ = (rejected_logits.detach().mean(), chosen_logits.detach().mean(),
             (beta * pc.detach() > beta * pr.detach()).float().mean())
    return loss


def run_trainer_steps(plan, config: dict, *, steps: int = 2) -> dict:
    import torch
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model, use_adapter

    from canifinetune.estimator.trainer_memory import DISABLE_DROPOUT, policy_rows
    from canifinetune.estimator.trainers import resolved_trainer_fields
    from canifinetune.recipes import model_setup

    fm = _fake_mode_module()
    Counter = fm._make_counter_class()
    counter = Counter()
    fake_mode = FakeTensorMode(allow_fallback_kernels=False)
    trainer = plan.trainer
    fields = resolved_trainer_fields(plan)
    ref_mode = reference_mode(plan)
    model = optimizer = ref_model = None
    timeline: list[dict] = []
    state: dict[str, Any] = {}

    def category_tensors():
        # the reference copy's weights count as parameters (the counter's categories are fixed, fake_mode.py)
        ref_state = fm._model_state_tensors(ref_model) if ref_model is not None else []
        cats = {
            "parameters": (fm._model_state_tensors(model) if model is not None else []) + ref_state,
            "gradients": [p.grad for p in model.parameters()] if model is not None else [],
            "optimizer_states": fm._optimizer_state_tensors(optimizer),
        }
        return cats

    counter.category_tensors = category_tensors
    outputs_by_trainer = {
        "dpo": ("log_probs", "entropy", "mean_logits", "is_top1"),
        "kto": ("log_probs", "entropy", "mean_logits"),
        "grpo": ("log_probs", "entropy"),
        "reward": None,  # no LM head: the score head's (2B, S, 1) logits
        "orpo": None,  # the model's own full logits (ORPO computes its loss from outputs.logits)
    }
    if trainer not in outputs_by_trainer:
        raise ValueError(f"trainer {trainer}: not measured by this harness")
    gc_kwargs = {"use_reentrant": False}
    orpo_ctx = orpo_gpu_routing() if trainer == "orpo" else contextlib.nullcontext()
    with fm.gpu_routing(True) as routed, fm.classic_module_apply(), \
            fm._beside("peft_fake").fake_peft_support(True) as build_ctx, orpo_ctx, fake_mode, counter:
        counter.set_phase("build")
        with build_ctx():
            if trainer == "reward":
                model = build_reward_model(plan, config)
            elif trainer == "orpo" and plan.uses_adapters and plan.quantized_4bit:
                # ORPOTrainer.__init__ runs prepare_model_for_kbit_training on a quantized base before get_peft_model
                model = model_setup.build_model(plan.model_copy(update={"prepare_model_for_kbit_training": True}),
                                                config)
            else:
                model = model_setup.build_model(plan, config)
        base = model.get_base_model() if plan.uses_adapters else model
        if trainer not in ("reward", "orpo"):
            add_fused_lm_head(base, outputs=outputs_by_trainer[trainer])
        if trainer == "orpo" and plan.uses_adapters and plan.quantized_4bit:
            # ORPOTrainer.__init__: args.bf16 and a 4-bit PEFT model -> peft_module_casting_to_bf16 (norms to fp32,
            # fp32 embed_tokens / lm_head to bf16), and compute_loss then runs under autocast
            from trl.experimental.utils import peft_module_casting_to_bf16

            peft_module_casting_to_bf16(model)
        if DISABLE_DROPOUT[trainer]:  # DPOConfig/KTOConfig disable_dropout=True: every nn.Dropout's p = 0
            disable_dropout_in_model(model)
        if ref_mode == "copy":
            with build_ctx():
                ref_model = model_setup.build_model(_reference_plan(plan), config)
            ref_model.requires_grad_(False)
            ref_model.eval()
            disable_dropout_in_model(ref_model)
            add_fused_lm_head(ref_model)
        optimizer = model_setup.build_optimizer(plan, model)
        resolved = model_setup.resolved_settings(plan, model, optimizer)
        vocab = int(model.config.get_text_config().vocab_size)
        rows = policy_rows(plan)
        seq = plan.seq_len
        input_ids = torch.randint(0, vocab, (rows, seq))
        labels = input_ids.clone()
        if trainer == "grpo":
            completion = int(fields["max_completion_length"])
            labels[:, : seq - completion] = -100
            ref_logps = torch.zeros(rows, completion) if fields["beta"] else None
            advantages = torch.zeros(rows)
        if trainer == "kto":
            kl_ids = torch.randint(0, vocab, (rows, seq))
            kl_labels = kl_ids.clone()
        state["after_build"] = counter.current
        state["after_build_categories"] = counter.categories_now()
        counter.reset_peak()
        ac = model_setup.autocast_dtype(plan)
        trainable = [p for p in model.parameters() if p.requires_grad]
        beta = float(fields.get("beta") or 0.0)

        def reference_forward(ids, lab):
            with torch.no_grad(), disable_gradient_checkpointing(base, gc_kwargs):
                if ref_mode == "copy":
                    return ref_model(input_ids=ids, labels=lab, use_cache=False, fused_lm_head=True).log_probs
                with use_adapter(model, adapter_name=None):
                    return model(input_ids=ids, labels=lab, use_cache=False, fused_lm_head=True).log_probs

        for step in range(1, steps + 1):
            counter.set_phase(f"step{step}.forward")
            start = counter.current
            autocast = torch.autocast("cpu", dtype=ac) if ac is not None else contextlib.nullcontext()
            with autocast:
                if trainer == "orpo":  # orpo_trainer.py concatenated_forward + get_batch_loss_metrics
                    step_loss = _orpo_loss(model, input_ids, beta)
                elif trainer == "reward":  # reward_trainer.py compute_loss
                    outputs = model(input_ids=input_ids, use_cache=False)
                    rewards_chosen, rewards_rejected = torch.chunk(outputs.logits.squeeze(-1), chunks=2)
                    step_loss = -F.logsigmoid(rewards_chosen - rewards_rejected).mean()
                elif trainer == "dpo":
                    outputs = model(input_ids=input_ids, labels=labels, use_cache=False, fused_lm_head=True)
                    logps = outputs.log_probs.sum(dim=1)
                    chosen, rejected = logps.chunk(2, dim=0)
                    if ref_mode == "none":  # precompute_ref_log_probs: the dataset's columns
                        ref_c = ref_r = torch.zeros(rows // 2)
                    else:
                        counter.set_phase(f"step{step}.reference")
                        ref_c, ref_r = reference_forward(input_ids, labels).sum(dim=1).chunk(2, dim=0)
                    delta = (chosen - ref_c) - (rejected - ref_r)
                    step_loss = (-F.logsigmoid(beta * delta)).mean()
                    with torch.no_grad():  # metrics
                        _ = (outputs.entropy.detach() * 1).sum(), outputs.mean_logits.sum(), outputs.is_top1.sum()
                elif trainer == "kto":
                    with torch.no_grad():
                        kl_logps = model(input_ids=kl_ids, labels=kl_labels, use_cache=False,
                                         fused_lm_head=True).log_probs.sum(-1)
                    outputs = model(input_ids=input_ids, labels=labels, use_cache=False, fused_lm_head=True)
                    logps = outputs.log_probs.sum(-1)
                    if ref_mode == "none":
                        ref_logps_seq = torch.zeros(rows)
                        ref_kl = torch.zeros(rows)
                    else:
                        counter.set_phase(f"step{step}.reference")
                        ref_kl = reference_forward(kl_ids, kl_labels).sum(-1)
                        ref_logps_seq = reference_forward(input_ids, labels).sum(-1)
                    kl = (kl_logps - ref_kl).mean().clamp(min=0).detach()
                    half = rows // 2
                    chosen_lr = logps[:half] - ref_logps_seq[:half]
                    rejected_lr = logps[half:] - ref_logps_seq[half:]
                    losses = torch.cat((1 - F.sigmoid(beta * (chosen_lr - kl)),
                                        1 - F.sigmoid(beta * (kl - rejected_lr))), 0)
                    step_loss = losses.nanmean()
                else:  # grpo loss step
                    outputs = model(input_ids=input_ids, labels=labels, use_cache=False, fused_lm_head=True)
                    per_token_logps = outputs.log_probs[:, -completion:]
                    entropies = outputs.entropy[:, -completion:]
                    mask = torch.ones(rows, completion)
                    old = per_token_logps.detach()
                    coef_1 = torch.exp(per_token_logps - old)
                    coef_2 = torch.clamp(coef_1, 1 - 0.2, 1 + 0.2)
                    adv = advantages.unsqueeze(1)
                    per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv)
                    if ref_logps is not None:
                        per_token_kl = torch.exp(ref_logps - per_token_logps) - (ref_logps - per_token_logps) - 1
                        per_token_loss = per_token_loss + beta * per_token_kl
                    step_loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
                    with torch.no_grad():
                        _ = (entropies * mask).sum()
            counter.set_phase(f"step{step}.backward")
            step_loss.backward()
            if trainer == "orpo":
                outputs = None
            del outputs, step_loss
            # TRL's compute_loss returns the loss alone: its intermediate tensors, and with them the step's autograd
            # graph, die before the optimizer step. Kept here until the next step, that graph would keep whatever a
            # custom Function holds as a ctx attribute (bitsandbytes' MatMul8bitLt: every 8-bit linear's input).
            logps = chosen = rejected = delta = ref_c = ref_r = kl_logps = ref_kl = ref_logps_seq = kl = None
            chosen_lr = rejected_lr = losses = per_token_logps = entropies = coef_1 = coef_2 = None
            per_token_loss = per_token_kl = rewards_chosen = rewards_rejected = None
            fm.optimizer_phase(counter, optimizer, trainable, step, steps, state)
            timeline.append({"step": step, "start": start, "end": counter.current})
        counter.set_phase("done")
    report = fm.measurement_report(counter, state, timeline, routed, resolved)
    return {**report, "trainer": trainer, "reference": ref_mode, "loss": f"trl_{trainer}", "fake": True}


def measure_trainer_fake(plan, config: dict, *, driver: str = "trainer", compact: bool = True) -> dict:
    """The measurement of ``plan`` (a TrainingPlan or a dict) on ``config`` (a config.json dict).

    driver "trainer" (the default): DPO, ORPO, KTO, reward and GRPO's loss step run through TRL's own trainer
    (pref_trainer_fake.py; ``compact``: its fused LM head's CUDA path, else the CPU build's that scores every
    position); driver "loop": :func:`run_trainer_steps`, the step written out."""
    from canifinetune.estimator.plan import TrainingPlan

    if not isinstance(plan, TrainingPlan):
        plan = TrainingPlan(**plan)
    if driver not in ("trainer", "loop"):
        raise ValueError(f"driver {driver!r}: 'trainer' or 'loop'")
    t0 = time.perf_counter()
    pref = _fake_mode_module()._beside("pref_trainer_fake")
    if driver == "trainer" and plan.trainer in pref.TRAINERS:
        result = pref.run_pref_trainer_steps(plan, config, compact=compact)
    else:
        result = {**run_trainer_steps(plan, config), "driver": "loop"}
    result["wall_seconds"] = round(time.perf_counter() - t0, 2)
    result["versions"] = _fake_mode_module().library_versions()
    result["plan"] = plan.model_dump(mode="json")
    return result


def kv_cache_bytes(plan, config: dict, rows: int, tokens: int) -> dict:
    """The KV cache of a generation at ``rows`` x ``tokens``, measured: one no-grad forward with use_cache=True under
    fake tensors; the bytes of every key and value storage the returned cache holds (model.generate's prefill; it then
    grows the same DynamicCache one token at a time, transformers 5.24 cache_utils.py)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from canifinetune.recipes import model_setup

    fm = _fake_mode_module()
    with fm.gpu_routing(True), fm.classic_module_apply(), FakeTensorMode(allow_fallback_kernels=False):
        base_plan = plan.model_copy(update={"method": "full", "gradient_checkpointing": False})
        model = model_setup.build_model(base_plan, config)
        model.eval()
        vocab = int(model.config.get_text_config().vocab_size)
        ids = torch.randint(0, vocab, (rows, tokens))
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        total = 0
        count = 0
        seen = set()
        for layer in cache.layers:  # storages, not views: a sliding layer's keys are a view of the whole prompt's
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in seen:
                    seen.add(t.untyped_storage()._cdata)
                    total += fm.round_block(t.untyped_storage().nbytes())
                    count += 1
    return {"kv_cache_bytes": total, "tensors": count}


def generation_peaks(plan, config: dict, rows: int, prompt: int, total: int) -> dict:
    """Live memory of model.generate's two extremes, measured under fake tensors on the frozen model (weights only):
    the prefill (one no-grad forward over rows x prompt tokens with ``use_cache=True, logits_to_keep=1``, as
    generation/utils.py runs it) and the last decode step (one token on a DynamicCache already holding
    ``total - 1`` tokens per row, filled with ``cache.update``). The sampling's own fp32 copies of the next-token
    logits are not run here (the estimator counts them from generation/utils.py)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import DynamicCache

    from canifinetune.recipes import model_setup

    fm = _fake_mode_module()
    Counter = fm._make_counter_class()
    out: dict[str, int] = {}
    with fm.gpu_routing(True), fm.classic_module_apply(), FakeTensorMode(allow_fallback_kernels=False):
        counter = Counter()
        with counter:
            model = model_setup.build_model(
                plan.model_copy(update={"method": "full", "gradient_checkpointing": False}), config)
            model.eval()
            model.requires_grad_(False)
            vocab = int(model.config.get_text_config().vocab_size)
            out["weights"] = counter.current
            counter.reset_peak()
            with torch.no_grad():
                ids = torch.randint(0, vocab, (rows, prompt))
                res = model(input_ids=ids, use_cache=True, logits_to_keep=1)
                out["prefill_peak"] = counter.peak
                del res, ids
                cfg = model.config.get_text_config()
                cache = DynamicCache(config=cfg)
                kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
                head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
                dtype = next(model.parameters()).dtype
                for layer in range(cfg.num_hidden_layers):
                    k = torch.zeros(rows, kv_heads, total - 1, head_dim, dtype=dtype)
                    cache.update(k, torch.zeros_like(k), layer)
                    del k
                    entry = cache.layers[layer]
                    if entry.keys.untyped_storage().nbytes() > entry.keys.numel() * entry.keys.element_size():
                        # a sliding layer's view: after decode steps its storage is its own (window - 1 tokens)
                        entry.keys, entry.values = entry.keys.clone(), entry.values.clone()
                counter.reset_peak()
                step = torch.randint(0, vocab, (rows, 1))
                _res = model(input_ids=step, past_key_values=cache, use_cache=True, logits_to_keep=1,
                             position_ids=torch.full((rows, 1), total - 1))
                out["decode_peak"] = counter.peak
    return out


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="fake-tensor measurement of a TRL 1.16 DPO/ORPO/KTO/reward/GRPO "
                                                 "training step")
    parser.add_argument("--plan", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--out")
    parser.add_argument("--driver", choices=("trainer", "loop"), default="trainer",
                        help="trainer: DPO/ORPO/KTO/reward/GRPO run through TRL's own trainer "
                             "(pref_trainer_fake.py); loop: the step written out here")
    parser.add_argument("--fused-head", choices=("compact", "every_position"), default="compact",
                        help="with --driver trainer: TRL's fused LM head as CUDA runs it (the labelled positions "
                             "only), or as a CPU build runs it (every position)")
    args = parser.parse_args(argv)
    compact = args.fused_head == "compact"
    return _fake_mode_module().run_and_report(
        lambda plan, config: measure_trainer_fake(plan, config, driver=args.driver, compact=compact),
        args.plan, args.config, args.out)


if __name__ == "__main__":
    sys.exit(main())
