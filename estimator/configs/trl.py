"""TRL CLI YAML (`trl sft|dpo|kto|reward|grpo --config FILE`, trl 1.16): ScriptArguments, ModelConfig and the trainer's
config (SFTConfig, DPOConfig, KTOConfig, RewardConfig, GRPOConfig; ORPOConfig from trl.experimental.orpo) in one file.

The trainer is the one whose own keys the file has (``num_generations`` is GRPO's, ``precompute_ref_log_probs`` DPO's
or KTO's), or the one given beside the file (``--trainer``, ``trainer`` in MCP); keys of another trainer than the one
given are an error naming both. Every trainer field of the plan (estimator/trainers.py) has TRL's own name, so each
is read under it."""

from __future__ import annotations

from ..errors import safe_text
from ..trainer_memory import DISABLE_DROPOUT
from ..trainers import TRAINER_CLASSES, TRAINER_FIELDS, TRAINERS
from . import transformers_args
from .reading import TORCH_DTYPES, Reading, read_attention, reasons
from .types import ConfigError

SCHEMA = "TRL 1.16 (ModelConfig, ScriptArguments and the trainer's config)"
DEFAULTS = {  # TRL 1.16 ModelConfig and SFTConfig defaults (the plan's own); the other trainers' are the same here
    "method": "full", "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "seq_len": 1024, "batch_size": 8,
    "gradient_accumulation_steps": 1, "gradient_checkpointing": True, "optim": "adamw_torch_fused", "dtype": "bf16",
}


def _owners(*groups: tuple[tuple[str, ...], str]) -> dict[str, tuple[str, ...]]:
    return {key: trainers for trainers, keys in groups for key in keys.split()}


# The keys only some of TRL 1.16's six trainer configs have (trl/trainer/{sft,dpo,kto,reward,grpo}_config.py,
# trl/experimental/orpo/orpo_config.py), with the trainers that have them; every other key of those configs is
# TrainingArguments' and theirs alike. tests/test_configs.py checks this table against the installed TRL.
KEY_TRAINERS: dict[str, tuple[str, ...]] = _owners(
    (("sft",), "assistant_only_loss completion_only_loss dataset_kwargs dataset_text_field eval_packing packing "
               "packing_strategy"),
    (("dpo",), "discopop_tau f_alpha_divergence_coef f_divergence_type label_smoothing ld_alpha loss_weights "
               "use_weighting"),
    (("orpo",), "generate_during_eval is_encoder_decoder padding_value"),
    (("kto",), "desirable_weight undesirable_weight"),
    (("reward",), "center_rewards_coefficient"),
    (("grpo",), "cache_implementation cast_lm_head_to_fp32 chat_template_kwargs delta ds3_gather_for_generation "
                "entropy_coef entropy_coef_delta entropy_coef_max entropy_coef_min entropy_target epsilon epsilon_high "
                "generation_batch_size generation_kwargs importance_sampling_level log_completions "
                "log_completions_hub_repo log_multimodal log_unique_prompts mask_truncated_completions "
                "max_tool_calling_iterations min_p multi_objective_aggregation num_completions_to_print "
                "num_generations num_generations_eval num_iterations off_policy_mask_threshold repetition_penalty "
                "reward_weights sapo_temperature_neg sapo_temperature_pos scale_rewards steps_per_generation "
                "temperature top_entropy_quantile top_k top_p transformers_continuous_batching_config "
                "use_adaptive_entropy use_bias_correction_kl use_transformers_continuous_batching "
                "use_transformers_paged use_vllm vespo_k_neg vespo_k_pos vespo_lambda_neg vespo_lambda_pos "
                "vllm_enable_sleep_mode vllm_gpu_memory_utilization vllm_group_port vllm_importance_sampling_cap "
                "vllm_importance_sampling_clip_max vllm_importance_sampling_clip_min "
                "vllm_importance_sampling_correction vllm_importance_sampling_mode vllm_max_model_length vllm_mode "
                "vllm_model_impl vllm_server_base_url vllm_server_host vllm_server_port vllm_server_timeout "
                "vllm_structured_outputs_regex vllm_tensor_parallel_size"),
    (("dpo", "kto"), "precompute_ref_batch_size precompute_ref_log_probs"),
    (("orpo", "grpo"), "max_completion_length"),
    (("sft", "dpo"), "padding_free truncation_mode"),
    (("sft", "grpo"), "shuffle_dataset"),
    (("sft", "reward"), "chat_template_path eos_token"),
    (("dpo", "kto", "grpo"), "ref_model_mixup_alpha ref_model_sync_steps sync_ref_model"),
    (("sft", "dpo", "reward"), "pad_token"),
    (("dpo", "orpo", "kto", "grpo"), "beta"),
    (("sft", "dpo", "kto", "grpo"), "loss_type router_aux_loss_coef"),
    (("sft", "dpo", "kto", "reward"), "activation_offloading"),
    (("dpo", "orpo", "kto", "reward", "grpo"), "disable_dropout"),
    (("sft", "dpo", "kto", "reward", "grpo"), "pad_to_multiple_of"),
    (("sft", "dpo", "orpo", "kto", "reward"), "dataset_num_proc max_length"),
)
# Keys that say which trainer a file is for: a trainer's own keys, and the trainer settings several share. Any other
# key of KEY_TRAINERS a trainer lacks (max_length in a GRPO file) is warned about: `trl <trainer>` does not read it.
TRAINER_SIGNS = frozenset({k for k, owners in KEY_TRAINERS.items() if len(owners) == 1}
                          | (set(TRAINER_FIELDS) & set(KEY_TRAINERS))
                          | {"sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps",
                             "precompute_ref_batch_size"})
CONFIG_CLASSES = {t: c.replace("Trainer", "Config") for t, c in TRAINER_CLASSES.items()}  # SFTConfig, DPOConfig, ...
# Keys of TRL's trainers that are not estimated (rloo_config.py, distillation_config.py, scripts/rloo.py)
NOT_ESTIMATED = {"normalize_advantages": "rloo", "reward_clip_range": "rloo", "teacher_model_name_or_path":
                 "distillation", "teacher_model_init_kwargs": "distillation", "teacher_model_revision": "distillation"}
# The plan's trainer fields, read under TRL's names (reference_model is no config key: the trainer's ref_model
# argument); their types
TRAINER_KEYS = {"precompute_ref_log_probs": "bool", "use_vllm": "bool", "loss_type": "text", "vllm_mode": "text",
                "beta": "number", "vllm_gpu_memory_utilization": "number", "num_generations": "int",
                "max_completion_length": "int", "generation_batch_size": "int", "steps_per_generation": "int",
                "vllm_max_model_length": "int"}
SFT_LOSSES = ("nll", "chunked_nll")  # sft_config.py: chunked_nll is nll's old name; dft is warned about
KTO_LOSSES = ("kto", "apo_zero_unpaired")  # kto_config.py: the same log-probabilities, the same memory

READS = ("model_name_or_path", "use_peft", "load_in_4bit", "load_in_8bit", "lora_r", "lora_alpha", "lora_dropout",
         "lora_target_modules", "lora_modules_to_save", "use_dora", "bnb_4bit_quant_type", "use_bnb_nested_quant",
         "max_length", "max_seq_length", "packing", "padding_free", "dtype", "torch_dtype", "attn_implementation",
         "model_init_kwargs", "disable_dropout", "activation_offloading", *TRAINER_KEYS, *transformers_args.READS)
NOT_MODELLED: dict[str, str | None] = {
    **transformers_args.NOT_MODELLED,
    "activation_offloading": None,  # read (SFT); the preference trainers' offloading is refused by the plan
    "lora_target_parameters": "adapters on parameters (MoE experts) are not modelled",
    "sync_ref_model": "a reference model synced to the policy (TR-DPO) is not modelled",
    "precompute_ref_batch_size": "the batch of the pass that precomputes the reference log-probabilities is not "
                                 "modelled (the training step is)",
    "use_weighting": "WPO's weights (a log-softmax over the logits) are not modelled",
    "cast_lm_head_to_fp32": "an fp32 lm_head is not modelled",
    "vllm_enable_sleep_mode": "vLLM's sleep mode (its weights and KV cache released while training) is not "
                              "modelled: estimated with them held, an upper bound",
    "vllm_tensor_parallel_size": "vLLM's tensor parallelism is not modelled",
    "use_transformers_paged": "transformers' paged generation is not modelled (model.generate's cache is estimated)",
    "use_transformers_continuous_batching": "continuous-batching generation is not modelled",
    "transformers_continuous_batching_config": "continuous-batching generation is not modelled",
    "cache_implementation": "the generation cache implementation is not modelled (a dynamic cache is estimated)",
    "generation_kwargs": "generation settings are not read (max_completion_length bounds the completions)",
    "max_tool_calling_iterations": "tool-calling turns (longer sequences) are not modelled",
    "num_generations_eval": "evaluation is not estimated (the training step is)",
    "entropy_coef": "the entropy term (over the vocabulary) is not modelled",
    "use_adaptive_entropy": "the entropy term (over the vocabulary) is not modelled",
    "reward_model_name_or_path": "a reward model on the GPU beside the policy is not modelled",
    "env": "environment variables are not read (PYTORCH_CUDA_ALLOC_CONF and the like change the allocator)",
}
IGNORED = {
    **transformers_args.IGNORED,
    **reasons(
        ("the dataset to load (ScriptArguments, DatasetMixtureConfig)", "dataset_name dataset_config "
         "dataset_train_split dataset_test_split dataset_streaming datasets streaming test_split_size"),
        ("a DDP debugging fix for bias buffers: no tensors", "ignore_bias_buffers"),
        ("where the weights come from: the same model", "model_revision trust_remote_code"),
        ("the LoRA task type: the same adapters (a reward model's score head is counted for trainer reward)",
         "lora_task_type"),
        ("rank-stabilised LoRA scaling: the same adapters", "use_rslora"),
        ("the 4-bit weights' storage dtype: the same packed bytes", "bnb_4bit_quant_storage"),
        ("how the dataset is prepared (CPU)", "dataset_kwargs dataset_text_field dataset_num_proc eval_packing "
         "packing_strategy shuffle_dataset truncation_mode chat_template_path chat_template_kwargs eos_token pad_token "
         "padding_value pad_to_multiple_of"),
        ("which tokens the loss counts: the same tensors", "assistant_only_loss completion_only_loss"),
        ("a loss weight or coefficient: the same tensors", "label_smoothing discopop_tau f_alpha_divergence_coef "
         "f_divergence_type ld_alpha loss_weights desirable_weight undesirable_weight center_rewards_coefficient "
         "router_aux_loss_coef epsilon epsilon_high delta scale_rewards reward_weights multi_objective_aggregation "
         "importance_sampling_level off_policy_mask_threshold sapo_temperature_neg sapo_temperature_pos vespo_k_neg "
         "vespo_k_pos vespo_lambda_neg vespo_lambda_pos use_bias_correction_kl mask_truncated_completions "
         "vllm_importance_sampling_cap vllm_importance_sampling_clip_max vllm_importance_sampling_clip_min "
         "vllm_importance_sampling_correction vllm_importance_sampling_mode entropy_coef_delta entropy_coef_max "
         "entropy_coef_min entropy_target top_entropy_quantile num_iterations"),
        ("sampling settings: the same completion lengths", "temperature top_p top_k min_p repetition_penalty "
         "vllm_structured_outputs_regex"),
        ("what is logged", "log_completions log_completions_hub_repo log_multimodal log_unique_prompts "
         "num_completions_to_print generate_during_eval"),
        ("only with sync_ref_model (warned about when on)", "ref_model_mixup_alpha ref_model_sync_steps"),
        ("vLLM server mode: the server runs on its own GPUs", "vllm_server_base_url vllm_server_host "
         "vllm_server_port vllm_server_timeout vllm_group_port"),
        ("vLLM's model implementation: the same weights and cache", "vllm_model_impl"),
        ("ZeRO-3 only (GRPO is estimated on one GPU)", "ds3_gather_for_generation"),
        ("encoder-decoder models only", "is_encoder_decoder"),
        ("reward functions run on the completions' text", "reward_funcs"),
    ),
}


def _trainer(r: Reading) -> str:
    """The trainer the file is for: from its keys, or the one given beside it; a conflict is an error."""
    name = r.doc.name
    for key in r.doc.data:
        if key in NOT_ESTIMATED:
            raise r.fail(key, f"a key of TRL's {NOT_ESTIMATED[key]} trainer, which is not estimated; sft, dpo, orpo, "
                              "kto, reward and grpo are")
    signs = [k for k in r.doc.data if k in TRAINER_SIGNS and r.get(k) is not None]
    given = r.trainer
    if given is not None and given not in TRAINERS:
        return "sft"  # the plan refuses it, naming the field
    if given is not None:
        wrong = [k for k in signs if given not in KEY_TRAINERS[k]]
        if wrong:
            raise ConfigError(safe_text(
                f"{r.where(wrong[0])}: {_described(wrong)}, but the trainer given is '{given}' (--trainer, or "
                f"trainer in MCP): {CONFIG_CLASSES[given]} has no such key; give the file's trainer, or remove "
                "them", 900))
        return given
    possible = set(TRAINERS)
    for key in signs:
        possible &= set(KEY_TRAINERS[key])
    if "sft" in possible:
        return "sft"
    if len(possible) == 1:
        return possible.pop()
    if not possible:
        raise ConfigError(safe_text(f"{name}: keys of different TRL trainers: {_described(signs)}; one file is one "
                                    "trainer's config", 900))
    raise ConfigError(safe_text(
        f"{r.where(signs[0])}: {_described(signs)}: which trainer runs this file ({', '.join(sorted(possible))})? "
        "give --trainer (trainer in MCP)", 900))


def _described(keys: list[str]) -> str:
    return "; ".join(f"{k} is a key of {', '.join(KEY_TRAINERS[k])} configs" for k in keys[:6])


def _trainer_settings(r: Reading, trainer: str) -> None:
    """The plan's trainer fields, under TRL's names; and the keys of KEY_TRAINERS the trainer does not have."""
    if trainer != "sft":  # the keys that say so (with --trainer too: the file says the same)
        signs = [k for k in r.doc.data if k in TRAINER_SIGNS and trainer in KEY_TRAINERS[k] and r.get(k) is not None]
        if signs:
            r.use(signs[0], "trainer", r.get(signs[0]), trainer)
    for key, kind in TRAINER_KEYS.items():
        if not r.has(key) or trainer not in KEY_TRAINERS.get(key, TRAINERS):
            continue
        if trainer not in TRAINER_FIELDS[key]:
            _other_setting(r, trainer, key)
            continue
        if r.get(key) is None:
            r.use(key, None, None)  # null: the trainer's default
        elif key == "loss_type" and trainer == "dpo" and isinstance(r.get(key), list):
            _dpo_losses(r)
        else:
            value = {"bool": r.boolean, "text": r.text, "number": r.number}.get(kind, r.integer)(key)
            r.use(key, key, value)
    dropout = r.get("disable_dropout")
    if dropout is not None and trainer in KEY_TRAINERS["disable_dropout"]:
        if r.boolean("disable_dropout") == DISABLE_DROPOUT.get(trainer):
            r.use("disable_dropout", None, dropout)  # the trainer's default: what is modelled
        else:
            r.warn("disable_dropout", f"not modelled: {trainer} is estimated with TRL's default "
                                      f"disable_dropout: {str(DISABLE_DROPOUT.get(trainer)).lower()}")
    for key in r.doc.data:
        if key in KEY_TRAINERS and trainer not in KEY_TRAINERS[key] and r.get(key) is not None:
            r.warn(key, f"not a key of {CONFIG_CLASSES[trainer]} (TRL 1.16): `trl {trainer}` does not read "
                        "it")
    if trainer == "grpo":
        r.warn(None, "GRPO (TRL 1.16) has no prompt-length key: seq_len, the longest prompt plus "
                     "max_completion_length, is the plan's (give --seq-len)")


def _other_setting(r: Reading, trainer: str, key: str) -> None:
    """A trainer key the plan has no field for under this trainer: SFT's and KTO's loss_type, ORPO's completion
    length."""
    value = r.get(key)
    if value is None:
        r.use(key, None, None)
    elif key == "loss_type" and trainer in ("sft", "kto"):
        known = SFT_LOSSES if trainer == "sft" else KTO_LOSSES
        if value in known:
            r.use(key, None, value)
        elif trainer == "sft" and value == "dft":
            r.warn(key, "the DFT loss (probability-weighted tokens) is not modelled; estimated as nll")
        else:
            raise r.fail(key, f"'{safe_text(value, 40)}' is not a {trainer} loss of TRL 1.16 "
                              f"({', '.join(known + (('dft',) if trainer == 'sft' else ()))}); for another trainer's "
                              "loss, give --trainer")
    elif key == "max_completion_length" and trainer == "orpo":
        r.use(key, None, value)  # ORPO: the completion length of encoder-decoder models only
    else:
        r.warn(key, f"not modelled for {trainer}")


def _dpo_losses(r: Reading) -> None:
    losses = r.get("loss_type")
    if not losses or not all(isinstance(x, str) for x in losses):
        raise r.fail("loss_type", f"expected DPO loss names; got {safe_text(repr(losses), 80)}")
    r.use("loss_type", "loss_type", losses, losses[0])
    if len(losses) > 1:
        r.warn("loss_type", f"several DPO losses: estimated with '{losses[0]}' (each is a per-sequence loss over the "
                            "same log-probabilities)")


def _peft(r: Reading) -> None:
    use_peft = r.boolean("use_peft", False)
    four, eight = r.boolean("load_in_4bit", False), r.boolean("load_in_8bit", False)
    r.mark("use_peft", "load_in_4bit", "load_in_8bit")
    if not use_peft:
        if four or eight:
            raise r.fail("load_in_4bit" if four else "load_in_8bit", "a quantized base needs use_peft: true")
        if r.has("use_peft"):
            r.use("use_peft", "method", False, "full")
        return
    if four and eight:
        raise r.fail("load_in_8bit", "load_in_4bit and load_in_8bit are both true; set one")
    r.use("load_in_4bit" if four else "use_peft", "method", True, "qlora" if four else "lora")
    r.use("load_in_8bit", "load_in_8bit", eight) if r.has("load_in_8bit") else None
    for key, field in (("lora_r", "lora_r"), ("lora_alpha", "lora_alpha"), ("lora_dropout", "lora_dropout")):
        if r.has(key):
            r.use(key, field, r.integer(key, None, 1, 4096) if key == "lora_r" else r.number(key))
    targets = r.names("lora_target_modules")
    if targets:
        r.use("lora_target_modules", "target_modules", r.get("lora_target_modules"),
              "all-linear" if targets == ["all-linear"] else targets)
    saved = r.names("lora_modules_to_save")
    if saved:
        r.use("lora_modules_to_save", "modules_to_save", r.get("lora_modules_to_save"), saved)
    if r.has("use_dora"):
        r.use("use_dora", "use_dora", r.boolean("use_dora", False))
    if four:
        if r.has("bnb_4bit_quant_type"):
            r.use("bnb_4bit_quant_type", "bnb_4bit_quant_type", r.text("bnb_4bit_quant_type"))
        if r.has("use_bnb_nested_quant"):
            r.use("use_bnb_nested_quant", "bnb_4bit_use_double_quant", r.boolean("use_bnb_nested_quant"))


def _length(r: Reading, trainer: str) -> None:
    for key in ("max_length", "max_seq_length"):
        if r.has(key) and trainer in KEY_TRAINERS["max_length"]:
            value = r.get(key)
            if value is None:
                raise r.fail(key, "null means no truncation, so no length bounds the memory; give a number, or "
                             "--seq-len with your longest sample")
            r.use(key, "seq_len", r.integer(key, None, 1, 1_048_576))
            if key == "max_seq_length":
                r.warn(key, "TRL 1.16 calls it max_length (`trl` refuses max_seq_length); read as max_length")
            return


def read(r: Reading) -> None:
    trainer = _trainer(r)
    if r.text("model_name_or_path"):
        r.use("model_name_or_path", "model", r.text("model_name_or_path"))
    _peft(r)
    _length(r, trainer)
    for key in ("packing", "padding_free"):
        if r.has(key) and trainer in KEY_TRAINERS[key]:
            r.use(key, key, r.boolean(key, False))
    _trainer_settings(r, trainer)
    if r.has("activation_offloading") and trainer in KEY_TRAINERS["activation_offloading"]:
        # modelled for SFT with checkpointing; the plan refuses what is not (naming trainer or checkpointing)
        r.use("activation_offloading", "activation_offloading", r.boolean("activation_offloading", False))
    transformers_args.read_training_args(r)
    for key in ("dtype", "torch_dtype", "model_init_kwargs.dtype", "model_init_kwargs.torch_dtype"):
        name = r.text(key) if isinstance(r.get(key), str) else None
        if name and name != "auto":
            if name not in TORCH_DTYPES:
                raise r.fail(key, f"'{name}' is not a dtype; bfloat16, float16 or float32")
            r.use(key, "dtype", name, TORCH_DTYPES[name])
    for key in ("attn_implementation", "model_init_kwargs.attn_implementation"):
        read_attention(r, key)
    r.mark("model_init_kwargs")
    env = r.get("env")
    if isinstance(env, dict) and not any(str(k).upper().startswith(("PYTORCH_", "CUDA")) for k in env):
        r.ignore("env", "environment variables for the run, none of them PyTorch's or CUDA's")  # values not shown
    transformers_args.warn_not_modelled(r, {k: v for k, v in NOT_MODELLED.items()
                                            if k not in transformers_args.NOT_MODELLED and k not in r.seen})


# ------------------------------------------------------------------ edits back into the file

SIMPLE = {"model": "model_name_or_path", "lora_r": "lora_r", "use_dora": "use_dora", "lora_alpha": "lora_alpha",
          "modules_to_save": "lora_modules_to_save", "lora_dropout": "lora_dropout",
          "bnb_4bit_quant_type": "bnb_4bit_quant_type", "bnb_4bit_use_double_quant": "use_bnb_nested_quant",
          "activation_offloading": "activation_offloading", "torch_compile": "torch_compile",
          **{k: k for k in TRAINER_KEYS}}
# The plan fields the reader can set; each has an edit back (tests/test_configs.py checks both)
FIELDS = ("model", "method", "load_in_8bit", "lora_r", "lora_alpha", "lora_dropout", "target_modules",
          "modules_to_save", "use_dora", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant", "seq_len", "packing",
          "padding_free", "batch_size", "gradient_accumulation_steps", "gradient_checkpointing", "dtype", "optim",
          "attn_implementation", "sharding", "offload_params", "offload_optimizer", "trainer", "activation_offloading",
          "torch_compile", *TRAINER_KEYS)
DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def edits(changes: dict, new: dict, r: Reading) -> list[tuple]:
    trainer = new.get("trainer", "sft")
    out: list[tuple] = [(SIMPLE[f], v, [f]) for f, v in changes.items() if f in SIMPLE]
    out += transformers_args.edits({f: v for f, v in changes.items() if f != "dtype"}, new, r)
    if "seq_len" in changes:
        if trainer not in KEY_TRAINERS["max_length"]:
            out.append((None, None, ["seq_len"], f"{CONFIG_CLASSES[trainer]} (TRL 1.16) has no prompt-length key: "
                        f"keep the longest prompt plus max_completion_length within {changes['seq_len']} tokens"))
        else:
            key = "max_seq_length" if r.has("max_seq_length") and not r.has("max_length") else "max_length"
            out.append((key, changes["seq_len"], ["seq_len"]))
    for field in ("packing", "padding_free"):
        if field in changes and trainer in KEY_TRAINERS[field]:
            out.append((field, changes[field], [field]))
    if "trainer" in changes:
        out.append((None, None, ["trainer"], f"run the file with `trl {trainer} --config FILE`: the trainer is the "
                                             "command, not a key"))
    if "reference_model" in changes:
        out.append((None, None, ["reference_model"], "the reference model is the trainer's ref_model argument (no "
                    f"config key): {new['reference_model']}"))
    if "attn_implementation" in changes:
        keys = [k for k in ("attn_implementation", "model_init_kwargs.attn_implementation") if r.has(k)]
        out += [(k, changes["attn_implementation"], ["attn_implementation"]) for k in keys or ["attn_implementation"]]
    if "dtype" in changes:
        out.extend(_dtype_edits(changes["dtype"], r))
    if "target_modules" in changes:
        targets = changes["target_modules"]
        out.append(("lora_target_modules", targets, ["target_modules"]))
    if "method" in changes or "load_in_8bit" in changes:
        method = new["method"]
        out.append(("use_peft", method != "full", ["method"]))
        if method == "qlora" or r.get("load_in_4bit"):
            out.append(("load_in_4bit", method == "qlora", ["method"]))
        if r.get("load_in_8bit") or new.get("load_in_8bit"):
            out.append(("load_in_8bit", bool(new.get("load_in_8bit")), ["load_in_8bit"]))
        if method != "full" and not r.has("lora_target_modules") and new.get("target_modules"):
            targets = new["target_modules"]
            out.append(("lora_target_modules", targets, ["target_modules"]))
    return out


def _dtype_edits(dtype: str, r: Reading) -> list[tuple]:
    """The dtype keys the file has (dtype, torch_dtype, model_init_kwargs.*: the last one read wins), else
    bf16/fp16; fp32 needs ModelConfig's dtype: float32."""
    keys = [k for k in ("dtype", "torch_dtype", "model_init_kwargs.dtype", "model_init_kwargs.torch_dtype")
            if isinstance(r.get(k), str) and r.get(k) != "auto"]
    if keys or dtype == "fp32":
        return [(k, DTYPE_NAMES[dtype], ["dtype"]) for k in keys or ["dtype"]]
    out: list[tuple] = [(dtype, True, ["dtype"])]
    other = "fp16" if dtype == "bf16" else "bf16"
    if r.get(other):
        out.append((other, False, ["dtype"]))
    return out


distribution_edits = transformers_args.distribution_edits
