"""Memory of TRL 1.16's trainers beyond SFT: DPO, ORPO, KTO, GRPO and reward modelling.

DPO, KTO and GRPO compute the policy's per-token log-probabilities with the same fused, chunked
LM head as SFTTrainer (``add_fused_lm_head``, trl/trainer/utils.py; dpo_trainer.py, kto_trainer.py and
grpo_trainer.py call ``model(..., labels=labels, fused_lm_head=True)``): the policy's forward, backward and
optimizer step are an SFT step over the trainer's rows (:func:`policy_rows`). What is new, one function each:

- :func:`reference_weight_bytes`: the reference model (a frozen copy, or none);
- :func:`reference_forward_bytes`: the reference forward under ``torch.no_grad()`` on top of the policy's saved
  activations (its log-probabilities and one block's temporaries);
- :func:`kv_cache_bytes` / :func:`generation_bytes`: GRPO's generation with ``model.generate``;
- :func:`vllm_reservation_bytes`: GRPO with vLLM colocated on the training GPU;
- :func:`reward_spec` / :func:`reward_embedding_bytes`: RewardTrainer's sequence-classification model (no LM head);
- :func:`orpo_logits_bytes`: ORPO (trl/experimental/orpo), whose loss is computed from the model's full logits
  (no fused head), their cross-entropy and ``selective_log_softmax``.

Sources: .venv/lib/python3.11/site-packages/trl (1.16) trainer/dpo_trainer.py, kto_trainer.py, grpo_trainer.py,
reward_trainer.py, their *_config.py, utils.py; transformers 5.24 cache_utils.py (DynamicCache) and
generation/utils.py. Measured by benchmarks/validation/trainer_fake.py (cohorts v4 and v5).
"""

from __future__ import annotations

import dataclasses

from . import memory as m
from .allocator import round_block
from .components import STATIC_NAMES
from .constants import DTYPE_BYTES
from .plan import TrainingPlan
from .resolved import resolve
from .trainers import TRAINER_FIELDS, check_supported, reference_mode, resolved_trainer_fields

MODELLED = ("dpo", "orpo", "kto", "grpo", "reward")


def reward_spec(spec):
    """The reward model's architecture as the memory model sees it: AutoModelForSequenceClassification with
    num_labels=1 replaces lm_head (V x H) by a score head (1 x H, no bias; transformers 5.24
    GenericForSequenceClassification): no vocabulary logits. Modelled as the causal LM with a one-token vocabulary
    and a tied head, so the SFT components count no V x H head, no V-wide logits tile; the real input embedding
    (V x H, frozen under LoRA) is added back by :func:`reward_embedding_bytes`. The chunked head's terms at V = 1
    count the final hidden states the score keeps (a·N·H) and their gradient as fp32 plus compute dtype
    (4·N·H + a·N·H, where the score's backward makes a·T·H): an upper bound by 4·N·H."""
    return dataclasses.replace(spec, vocab_size=1, tie_word_embeddings=True)


def reward_embedding_bytes(policy_resolved, spec) -> int:
    """The reward model's input embedding, frozen under LoRA/QLoRA: V x H x bytes of the frozen dtype (fp32 after
    prepare_model_for_kbit_training); the score head and PEFT's trainable copy of it (SEQ_CLS modules_to_save) are
    2 x H weights, their gradient and optimizer states (a few KiB, counted as 5 blocks of H x 4 bytes).

    Full fine-tuning: the embedding trains: its weight and AdamW's two states, 3 x V x H x w (w the trainable
    dtype's bytes: torch.optim.AdamW keeps exp_avg and exp_avg_sq in the parameter's dtype), static in every phase;
    its gradient only from the end of backward (:func:`reward_embedding_grad_bytes`); the score head (H weights)
    with its gradient and states, 4 blocks of H x w."""
    if policy_resolved.full:
        w = policy_resolved.trainable_bytes_per_param
        return 3 * round_block(w * spec.vocab_size * spec.hidden_size) + 4 * round_block(w * spec.hidden_size)
    frozen = DTYPE_BYTES[policy_resolved.frozen_dtype]
    return round_block(frozen * spec.vocab_size * spec.hidden_size) + 5 * round_block(4 * spec.hidden_size)


def reward_embedding_grad_bytes(policy_resolved, spec) -> int:
    """A fully fine-tuned reward model's input-embedding gradient: V x H x w, made by the embedding's backward
    (``embedding_dense_backward``, a dense gradient in the gradient's dtype), the last op of backward; with no
    lm_head (AutoModelForSequenceClassification, tied or not) there is no earlier gradient to add it to, so it simply
    becomes ``.grad`` and lives through the optimizer step (estimator/phases.py step_peaks ``end_grad``). 0 under
    LoRA/QLoRA (the embedding is frozen)."""
    if not policy_resolved.full:
        return 0
    return round_block(policy_resolved.trainable_bytes_per_param * spec.vocab_size * spec.hidden_size)


def orpo_logits_bytes(policy_resolved) -> tuple[int, int]:
    """ORPO's loss on the full logits (trl/experimental/orpo/orpo_trainer.py 1.16 ``concatenated_forward``), on top of
    the policy's saved activations: returns (forward peak, backward peak) of its tensors. T = 2B x S tokens (chosen and
    rejected concatenated), V the vocabulary, a the compute dtype's bytes.

    The model runs without labels (no fused head): ``lm_head`` makes bf16 logits a·T·V, and accelerate's prepared
    forward returns them upcast to fp32 (accelerate accelerator.py ``convert_outputs_to_fp32``): L = 4·T·V, the bf16
    ones then freed. ORPO then takes (i) the chosen rows' cross-entropy, ``logits[..., :-1, :].contiguous()`` (a copy,
    Lc = 4·B·(S-1)·V) and ``nn.CrossEntropyLoss`` (log_softmax's fp32 output, Lc, saved for backward); (ii)
    ``selective_log_softmax(logits[:, :-1], labels)`` (trl/trainer/utils.py), which on a GPU with Triton runs
    trl/kernels/logprob_entropy.py: four fp32 per-row vectors, the logits saved as a view (no copy), and in backward
    ``grad_logits = torch.empty_like(logits)`` (G = 4·2B·(S-1)·V).

    forward = max(a·T·V + L (the upcast), L + 2·Lc (the contiguous copy and log_softmax's output)).
    backward = max(3·L, L + Lc + G): autograd runs the selective branch first (its grad_logits, then
    ``slice_backward`` widens it to the logits' shape, L, while log_softmax's output waits), then the cross-entropy
    branch, whose two ``slice_backward`` calls widen the chosen half's gradient to all rows (L), and the out-of-place
    sum with the first branch's (L): three T x V fp32 tensors at once (measured under fake tensors on Qwen2.5-0.5B,
    4 x 256: the peak's three largest tensors are slice_backward, slice_backward and add, each 4·T·V).
    The per-row vectors (a few x 4·T bytes) are below a block of the T x V tensors and not counted."""
    plan = policy_resolved.plan
    v = policy_resolved.spec.vocab_size
    t = policy_resolved.tokens
    half = (plan.batch_size // 2) * max(plan.seq_len - 1, 1)
    full = round_block(4 * t * v)
    chosen = round_block(4 * half * v)
    grad_logits = round_block(4 * policy_resolved.scored_tokens * v)
    forward = max(round_block(policy_resolved.act_bytes * t * v) + full, full + 2 * chosen)
    backward = max(3 * full, full + chosen + grad_logits)
    return forward, backward


def orpo_policy(plan: TrainingPlan, spec):
    """ORPO's policy as trl/experimental/orpo/orpo_trainer.py 1.16 ``__init__`` builds it. On a quantized (4-bit or
    8-bit) base with LoRA it runs ``prepare_model_for_kbit_training`` itself (peft 0.21: every non-quantized parameter
    to fp32), whatever the stack would do, and ``get_peft_model`` with PEFT's default ``autocast_adapter_dtype``: the
    adapters stay fp32 (SFTTrainer's cast to bf16 does not happen). With bf16 and a 4-bit base only, it then runs
    ``peft_module_casting_to_bf16`` (trl/experimental/utils.py: modules named *norm* to fp32, fp32 ``lm_head`` /
    ``embed_tokens`` back to bf16): the frozen embedding and head are in the compute dtype (no autocast copy of an
    fp32 head), while the fp32 norms feed bitsandbytes' Linear4bit fp32 inputs, whose outputs it casts back to fp32
    (``.to(inp_dtype)``): the residual stream is fp32 as after kbit preparation; the fp32 norm weights (a few x H per
    block) are counted in the compute dtype. An 8-bit base stays as prepared: fp32 embedding, head and norms, the
    head's autocast copy, an fp32 residual stream (cohort v7 e11 through ORPOTrainer: -19.4% before)."""
    sft = sft_equivalent(plan)
    if not (plan.uses_adapters and (plan.quantized_4bit or plan.load_in_8bit)):
        return resolve(sft, spec)
    policy = resolve(sft.model_copy(update={"prepare_model_for_kbit_training": True,
                                            "adapter_dtype": plan.adapter_dtype or "fp32"}), spec)
    if not (plan.quantized_4bit and plan.dtype == "bf16"):
        return policy
    return dataclasses.replace(policy, kbit_prepared=False, frozen_dtype=policy.compute_dtype, residual_dtype="fp32")


def reward_optimizer_temporary_bytes(policy_resolved, spec) -> int:
    """A fully fine-tuned reward model under ``adamw_torch`` (foreach AdamW): its step's sqrt(exp_avg_sq) temporaries
    cover the input embedding too, V x H x w beyond the stand-in model's (estimator/memory.py
    optimizer_step_temporary_bytes, the same formula); 0 under fused AdamW or LoRA/QLoRA."""
    if not policy_resolved.full or policy_resolved.plan.optim != "adamw_torch":
        return 0
    return round_block(policy_resolved.trainable_bytes_per_param * spec.vocab_size * spec.hidden_size)


def policy_rows(plan: TrainingPlan) -> int:
    """Rows of one policy forward. DPO: ``concatenated`` [chosen; rejected], 2B rows of max_length (= seq_len)
    (dpo_trainer.py DataCollatorForPreference); reward the same pairs (reward_trainer.py: chosen and rejected
    concatenated, ``torch.chunk(logits, 2)``). KTO: B unpaired completions (its KL batch runs under no_grad
    before them). GRPO loss step: B rows of prompt + completion (per_device_train_batch_size rows per micro-step).
    ORPO: chosen and rejected concatenated as DPO (experimental/orpo/orpo_trainer.py ``concatenated_inputs``)."""
    return 2 * plan.batch_size if plan.trainer in ("dpo", "reward", "orpo") else plan.batch_size


# TRL 1.16's ``disable_dropout`` default per trainer (dpo_config.py, kto_config.py, reward_config.py,
# experimental/orpo/orpo_config.py: True; grpo_config.py: False): when True the trainer calls
# ``disable_dropout_in_model`` (trl/trainer/utils.py: every ``nn.Dropout``'s p = 0, PEFT's lora_dropout included), and a
# dropout of p 0 returns its input (no mask, no copy: ATen ``_dropout``), as lora_dropout 0 does.
DISABLE_DROPOUT: dict[str, bool] = {"dpo": True, "kto": True, "orpo": True, "reward": True, "grpo": False}


def sft_equivalent(plan: TrainingPlan) -> TrainingPlan:
    """The SFT plan whose step is the policy's step: same model, method and settings, batch = :func:`policy_rows`;
    lora_dropout 0 where the trainer disables dropout (:data:`DISABLE_DROPOUT`)."""
    update: dict[str, object] = dict.fromkeys(TRAINER_FIELDS)
    update.update(trainer="sft", batch_size=policy_rows(plan))
    if DISABLE_DROPOUT.get(plan.trainer) and plan.uses_adapters:
        update["lora_dropout"] = 0.0
    return plan.model_copy(update=update)


def reference_plan(plan: TrainingPlan) -> TrainingPlan:
    """The reference copy as TRL builds it: the base model in the policy's dtype, frozen, no adapters."""
    update: dict[str, object] = dict.fromkeys(TRAINER_FIELDS)
    update.update(trainer="sft", method="full", gradient_checkpointing=False)
    return plan.model_copy(update=update)


def reference_weight_bytes(ref_resolved) -> int:
    """The reference copy's weights: every parameter of the base x bytes of the policy's weight dtype (TRL:
    ``ref_model_init_kwargs.setdefault("dtype", self.model.dtype)``); the same count as the policy's weights
    (estimator/memory.py weight_bytes), so a full-fine-tuning reference copy doubles the frozen weights. 0 for
    'adapter_disabled' (the policy's own base) and 'none' (precomputed, or GRPO beta 0)."""
    return m.weight_bytes(ref_resolved)


def reference_forward_bytes(policy_resolved) -> int:
    """Peak extra memory of the reference forward (torch.no_grad(), checkpointing disabled), run after the policy
    forward while all the policy's saved activations and its fused-head outputs are alive (dpo_trainer.py
    _compute_loss).

    Under no_grad nothing is saved; inside each block the gated MLP holds, at its widest, act(gate), up and their
    product (3 x a·T·I, ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``), beside the block input and the residual
    being formed (2 x e·T·H); the embedding output and its copy along the blocks (e·T·H); the fp32 per-token
    log-probabilities of the fused head (4·N, N = B·(S-1) scored positions). The attention side (q, k, v, output:
    a·T·(2·q_dim + 2·kv_dim)) counts instead when it is larger. T = the policy rows x seq_len."""
    spec = policy_resolved.spec
    t = policy_resolved.tokens
    a = policy_resolved.act_bytes
    e = DTYPE_BYTES[policy_resolved.residual_dtype]
    h = spec.hidden_size
    mlp = 3 * round_block(a * t * spec.intermediate_size)
    attn = 2 * round_block(a * t * spec.q_dim) + 2 * round_block(a * t * spec.kv_dim)
    n = policy_resolved.scored_tokens
    return max(mlp, attn) + 3 * round_block(e * t * h) + round_block(4 * n)


def kv_cache_bytes(spec, rows: int, tokens: int, dtype_bytes: int, prefill: bool = False) -> int:
    """The KV cache of ``rows`` sequences of ``tokens`` tokens: 2 (keys, values) x layers x kv_dim x tokens x rows x
    bytes, kv_dim = num_kv_heads x head_dim (transformers 5.24 DynamicCache: per layer one key and one value tensor
    [rows, kv_heads, tokens, head_dim]), each tensor rounded to the allocator's 512-byte blocks. A sliding-window
    layer (DynamicSlidingWindowLayer.update, cache_utils.py) keeps ``full_key_states[:, :, -sliding_window + 1:, :]``,
    a view of the concatenated states: after a prefill (``prefill``) the view's storage is the whole prompt; after a
    decode step it is min(tokens, sliding_window) tokens (the last window - 1 plus the new one)."""
    full_layers = spec.num_layers - spec.sliding_window_layers
    window = tokens if (prefill or not spec.sliding_window) else min(tokens, spec.sliding_window)
    per_tensor = lambda n: round_block(rows * spec.kv_dim * n * dtype_bytes)  # noqa: E731
    return 2 * full_layers * per_tensor(tokens) + 2 * spec.sliding_window_layers * per_tensor(window)


def generation_rows(plan: TrainingPlan) -> int:
    """Sequences one GPU generates at once with model.generate: its share of generation_batch_size (the prompts
    are repeated num_generations times by RepeatSampler, grpo_trainer.py; each process generates its slice of the
    generation batch, ``generation_batch_size / num_processes`` rows, in one ``unwrapped_model.generate`` call)."""
    fields = resolved_trainer_fields(plan)
    return max(1, int(fields["generation_batch_size"]) // plan.num_gpus)


def generation_bytes(policy_resolved, plan: TrainingPlan) -> tuple[int, int, str]:
    """GRPO's generation with model.generate (no vLLM), on top of the static weights/adapters/optimizer states
    (gradients are None between steps): the larger of its two extremes (generation/utils.py, transformers 5.24):

    - prefill: one no-grad forward over rows x P prompt tokens (``logits_to_keep=1``): the cache of the prompt
      (:func:`kv_cache_bytes` with ``prefill``) and one block's temporaries, max(3·a·t·I, a·t·(2·q_dim +
      2·kv_dim)) + 3·a·t·H, t = rows x P (as :func:`reference_forward_bytes`);
    - last decode step: the cache of every row at seq_len = P + max_completion_length tokens, plus one layer's key
      (or value) while ``torch.cat`` makes its successor (DynamicLayer.update), plus the sampling's fp32 copies of
      the next-token logits, 3 x 4·rows·V (``outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32)``, the
      processed scores, the softmax probabilities).

    rows = :func:`generation_rows`. Returns (kv_cache, temporaries, which extreme)."""
    spec = policy_resolved.spec
    a = policy_resolved.act_bytes
    rows = generation_rows(plan)
    fields = resolved_trainer_fields(plan)
    prompt = plan.seq_len - int(fields["max_completion_length"])
    t = rows * prompt
    h = spec.hidden_size
    prefill_tmp = max(3 * round_block(a * t * spec.intermediate_size),
                      2 * round_block(a * t * spec.q_dim) + 2 * round_block(a * t * spec.kv_dim))
    prefill_tmp += 3 * round_block(a * t * h)
    prefill_kv = kv_cache_bytes(spec, rows, prompt, a, prefill=True)
    decode_kv = kv_cache_bytes(spec, rows, plan.seq_len, a)
    decode_tmp = round_block(rows * spec.kv_dim * plan.seq_len * a) + 3 * round_block(4 * rows * spec.vocab_size)
    if prefill_kv + prefill_tmp > decode_kv + decode_tmp:
        return prefill_kv, prefill_tmp, "prefill"
    return decode_kv, decode_tmp, "decode"


def vllm_reservation_bytes(plan: TrainingPlan, gpu_bytes: int | None) -> int | None:
    """vLLM colocated with training (use_vllm, vllm_mode 'colocate'): vLLM's documented behaviour is that its engine
    takes ``gpu_memory_utilization`` x the GPU's total memory for its weights, activations and KV cache (vLLM
    EngineArgs docs: "The fraction of GPU memory to be used for the model executor"); TRL passes
    ``vllm_gpu_memory_utilization`` (default 0.3, grpo_config.py). Not measurable here (vLLM's own allocator): it
    rests on that documentation. None when no GPU size is known (the estimate then says so); 0 in server mode (the
    server runs on its own GPUs) or without vLLM."""
    fields = resolved_trainer_fields(plan)
    if plan.trainer != "grpo" or not fields.get("use_vllm"):
        return 0
    if fields.get("vllm_mode") == "server":
        return 0
    if gpu_bytes is None:
        return None
    return int(float(fields["vllm_gpu_memory_utilization"]) * gpu_bytes)


def trainer_step_peaks(r, phases_module):
    """The forward, backward and optimizer peaks of a DPO/KTO/GRPO training step (and the GRPO generation phase).

    The policy's step is :func:`sft_equivalent`'s (estimator/phases.py step_peaks over policy_rows x seq_len);
    the reference copy's weights are static in every phase; the forward phase becomes the larger of the policy's
    forward peak and the reference forward (static + the policy's saved activations and fused-head outputs +
    :func:`reference_forward_bytes`). GRPO without vLLM adds a 'generation' phase: static + KV cache + prefill
    temporaries (:func:`generation_bytes`), the gradients being None between optimizer steps."""
    plan = r.plan
    check_supported(plan)
    Item, PhasePeak = phases_module.Item, phases_module.PhasePeak
    spec = reward_spec(r.spec) if plan.trainer == "reward" else r.spec
    policy = orpo_policy(plan, spec) if plan.trainer == "orpo" else resolve(sft_equivalent(plan), spec)
    if plan.trainer == "grpo":  # the fused head scores the completions alone on a GPU (labels -100 on the prompt)
        policy = dataclasses.replace(policy, scored_per_row=int(resolved_trainer_fields(plan)["max_completion_length"]))
    end_grad = reward_embedding_grad_bytes(policy, r.spec) if plan.trainer == "reward" else 0
    forward, backward, optimizer, sizes = phases_module.step_peaks(policy, end_grad=end_grad)
    ref_w, ref_item = _reference_item(r, policy, Item)
    rows_note = _rows_note(plan, policy)

    def with_ref(p):
        items = tuple(Item(i.name, i.bytes, i.explanation + ("; " + rows_note if i.name == "activations" else ""))
                      for i in p.items)
        return PhasePeak(p.phase, p.bytes + ref_w, (*items[:1], ref_item, *items[1:]))

    fwd = with_ref(forward)
    orpo_bwd = None
    if plan.trainer == "orpo":  # the chunked head's terms give way to ORPO's full-logits loss (orpo_logits_bytes)
        fwd, orpo_bwd = _orpo_loss_phases(r, policy, fwd, Item, PhasePeak)
    if reference_mode(plan) != "none" and plan.trainer in ("dpo", "kto"):
        fwd = _with_reference_forward(policy, fwd, Item, PhasePeak)
    extra = []
    if plan.trainer == "grpo" and not resolved_trainer_fields(plan).get("use_vllm"):
        extra.append(_generation_phase(r, policy, fwd, Item, PhasePeak))
    bwd = with_ref(backward)
    if orpo_bwd is not None and orpo_bwd.bytes > bwd.bytes:
        bwd = orpo_bwd
    opt = with_ref(optimizer)
    opt_extra = reward_optimizer_temporary_bytes(policy, r.spec) if plan.trainer == "reward" else 0
    if opt_extra:
        opt = PhasePeak(opt.phase, opt.bytes + opt_extra, tuple(
            Item(i.name, i.bytes + opt_extra, i.explanation + "; and the input embedding's")
            if i.name == "optimizer_temporaries" else i for i in opt.items))
    return fwd, bwd, opt, sizes, tuple(extra)


def _reference_item(r, policy, Item):
    """(bytes, item) of the reference model in every phase (a reward model: its input embedding and score head)."""
    plan = r.plan
    mode = reference_mode(plan)
    ref_w = reference_weight_bytes(resolve(reference_plan(plan), r.spec)) if mode == "copy" else 0
    why = {"copy": "a second frozen copy of the base model (TRL loads it in the policy's dtype)",
           "adapter_disabled": "none: the reference is the policy's base with its LoRA adapters disabled",
           "none": ("none: beta is 0, GRPO loads no reference model" if plan.trainer == "grpo" else
                    "none: ORPO has no reference model" if plan.trainer == "orpo" else
                    "none: the reference log-probabilities are precomputed before training")}[mode]
    if plan.trainer != "reward":
        return ref_w, Item("reference_model", ref_w, why)
    # no reference; the input embedding the one-token-vocabulary model left out
    ref_w = reward_embedding_bytes(policy, r.spec)
    return ref_w, Item("reward_model_embedding_and_score", ref_w,
                       f"the reward model's input embedding ({r.spec.vocab_size} x {r.spec.hidden_size}, "
                       + ("trained: weight and AdamW states; its gradient from the end of backward" if policy.full
                          else "frozen") + ") and its score head (H -> 1"
                       + ("" if policy.full else ", PEFT's trainable copy") + "): no lm_head, no vocabulary logits")


def _rows_note(plan, policy) -> str:
    return {"dpo": f"DPO concatenates chosen and rejected: {policy.plan.batch_size} rows of {plan.seq_len} tokens",
            "orpo": f"ORPO concatenates chosen and rejected: {policy.plan.batch_size} rows of {plan.seq_len} tokens",
            "kto": f"KTO: {plan.batch_size} completions (its KL batch runs under no_grad)",
            "reward": f"reward model: chosen and rejected, {policy.plan.batch_size} rows of {plan.seq_len} tokens",
            "grpo": f"GRPO loss step: {plan.batch_size} rows of prompt + completion ({plan.seq_len} tokens)",
            }[plan.trainer]


def _orpo_loss_phases(r, policy, fwd, Item, PhasePeak):
    """(forward, ORPO's backward candidate): the full-logits loss in place of the chunked head's terms, with the
    compute-dtype copy autocast makes of an fp32 head (an 8-bit base ORPOTrainer prepared:
    memory.head_weight_cast_bytes),
    kept from the head's forward to its backward (cohort v7 e11)."""
    head_copy = m.head_weight_cast_bytes(policy)
    fwd_loss, bwd_loss = (size + head_copy for size in orpo_logits_bytes(policy))
    base = tuple(i for i in fwd.items if i.name in (*STATIC_NAMES, "activations"))
    below = sum(i.bytes for i in base)
    note = (f"ORPO's loss on the full logits: {policy.tokens} tokens x {r.spec.vocab_size} vocab in fp32 "
            "(accelerate's upcast), the chosen rows' cross-entropy and Triton selective_log_softmax")
    if below + fwd_loss > fwd.bytes:
        fwd = PhasePeak("forward", below + fwd_loss, (*base, Item("logits_and_loss", fwd_loss, note)))
    orpo_bwd = PhasePeak("backward", below + bwd_loss, (*base, Item("logits_and_loss", bwd_loss, note + "; in "
                         "backward three fp32 T x V gradients at once (both branches' and their sum)")))
    return fwd, orpo_bwd


def _with_reference_forward(policy, fwd, Item, PhasePeak):
    """DPO/KTO: the forward phase, or the reference forward on top of the policy's kept tensors if larger."""
    ref_fwd = reference_forward_bytes(policy)
    kept = {i.name: i.bytes for i in fwd.items}
    statics = sum(kept.get(n, 0) for n in STATIC_NAMES)
    loss_kept = m.loss_forward_bytes(policy) + m.lm_head_cast_bytes(policy)
    total = statics + kept.get("activations", 0) + loss_kept + ref_fwd
    if total <= fwd.bytes:
        return fwd
    items = tuple(i for i in fwd.items if i.name in (*STATIC_NAMES, "activations"))
    return PhasePeak("forward", total, (
        *items,
        Item("logits_and_loss", loss_kept,
             "the policy's fused-head outputs and final hidden states, kept for backward"),
        Item("reference_forward", ref_fwd, "the reference forward under no_grad: one block's temporaries "
             "(MLP or attention), the residual stream and the reference's per-token log-probabilities")))


def _generation_phase(r, policy, fwd, Item, PhasePeak):
    """GRPO without vLLM: model.generate's KV cache and temporaries on top of the static set."""
    plan = r.plan
    kv, transient, when = generation_bytes(policy, plan)
    statics = tuple(i for i in fwd.items if i.name in STATIC_NAMES)
    rows = generation_rows(plan)
    if when == "decode":
        tokens = plan.seq_len
    else:
        tokens = plan.seq_len - int(resolved_trainer_fields(plan)["max_completion_length"])
    return PhasePeak("generation", sum(i.bytes for i in statics) + kv + transient, (
        *statics,
        Item("kv_cache", kv, f"model.generate's KV cache at the {when}: 2 x {r.spec.num_layers} layers x "
             f"{r.spec.kv_dim} kv_dim x {tokens} tokens x {rows} sequences in {policy.compute_dtype}"),
        Item("generation_temporaries", transient,
             "the prefill's no-grad block temporaries over the prompts" if when == "prefill" else
             "one layer's cache being concatenated and the sampling's fp32 next-token logits")))


def assumptions(plan: TrainingPlan) -> list[str]:
    """What the estimate takes for the trainer (estimate.assumptions)."""
    fields = resolved_trainer_fields(plan)
    mode = reference_mode(plan)
    out = [f"trainer {plan.trainer} (TRL 1.16): policy forward over {policy_rows(plan)} rows of {plan.seq_len} tokens "
           + ("with the score head (no LM head)" if plan.trainer == "reward" else
              "with the model's full logits in fp32 (ORPO's own loss)" if plan.trainer == "orpo" else
              "with TRL's fused LM head")
           + f"; reference: {mode}"]
    if plan.trainer == "grpo":
        if fields.get("use_vllm"):
            if fields.get("vllm_mode") == "server":
                out.append("vLLM server mode: generation runs on the server's own GPUs (not counted here); this GPU "
                           "holds training alone")
            else:
                out.append(f"vLLM colocate: the engine takes {fields['vllm_gpu_memory_utilization']} of the GPU's "
                           "memory (vLLM's documented gpu_memory_utilization, not measured); without a GPU given, "
                           "that share is not in the figures")
        else:
            out.append(f"generation with model.generate: {generation_rows(plan)} sequences at once "
                       f"(generation_batch_size per GPU), KV cache to {plan.seq_len} tokens "
                       f"(prompt + max_completion_length {fields['max_completion_length']})")
        out.append("the GRPO loss step scores prompt and completion positions (TRL's CPU path; on a GPU the fused head "
                   "scores completion positions only: the estimate is an upper bound there)")
    return out
