"""DPO, ORPO, KTO, reward and GRPO (its loss step) run by TRL 1.16's own trainers under fake tensors (issue 24 item 1).

benchmarks/validation/trainer_fake.py writes each trainer's step out by hand (its loss arithmetic, and a loop that keeps
``outputs`` alive through backward). Here the step is the trainer's own, as benchmarks/validation/sft_trainer_fake.py
does for SFT, so object lifetimes are the trainer's:

- the trainer is built as ``recipes/trainers.build_trainer`` builds it: its config class (``trainers._config_class``)
  with ``trainers.config_kwargs(plan, runtime.sft_config_kwargs(...))``, its class (``trainers._trainer_class``), the
  plan's ``peft_config`` (``trainers.peft_config``: TRL applies the adapters, enables input gradients under
  checkpointing and casts QLoRA adapters to bf16), the reference as ``trainers.reference_of`` decides it (DPO/KTO
  ``copy``: a second frozen model in ``eval()`` passed as ``ref_model``; ``adapter_disabled``: none passed, TRL disables
  the adapters for the reference forward; ``none``: precomputed log-probabilities, emulation 5), for reward
  ``model.config.pad_token_id`` set to the tokenizer's, for GRPO a reward function. ORPO is
  ``trl.experimental.orpo.ORPOTrainer`` (trl/experimental/orpo/orpo_trainer.py, TRL 1.16.0) with ``ORPOConfig``, no
  reference: its ``__init__`` runs ``prepare_model_for_kbit_training`` on a quantized base and, for a 4-bit one with
  bf16, ``peft_module_casting_to_bf16`` (then ``compute_loss`` runs under ``autocast``), and disables dropout;
  ``compute_loss`` is ``get_batch_loss_metrics``: one forward over the concatenated [chosen; rejected] rows returning
  the model's full logits (fp32 from accelerate's prepared forward), the chosen rows' cross-entropy, ``get_batch_logps``
  (``selective_log_softmax``: emulation 8), the odds-ratio loss and its metrics;
- the base model is built as ``trainers.load_model`` loads it (``from_pretrained`` in the plan's dtype with its
  ``BitsAndBytesConfig``; full fine-tuning: ``requires_grad_(True)``; reward: ``num_labels=1``), from the config with
  recipes/model_setup.py's pieces (``hf_config``, ``weight_dtype``/``torch_dtype``, ``quantization_config`` and
  ``_quantize_model``: what ``model_setup.build_model`` runs before the adapters). ``build_model`` itself is not used:
  it applies the adapters too, and a ``PeftModel`` handed to DPOTrainer/KTOTrainer without ``peft_config`` makes TRL
  add a second ("ref") adapter and compute the reference with it, which is not what the recipe trains;
- before the first step, what ``Trainer.train`` does (transformers 5.24 trainer.py): activation checkpointing on the
  trainer's model with the config's kwargs, ``current_gradient_accumulation_steps``, the optimizer
  (``model_setup.build_optimizer``: the one Trainer builds for ``optim``, foreach/fused as on CUDA) and
  ``accelerator.prepare(model, optimizer)`` (autocast per forward call, fp32 outputs);
- each step is ``trainer.training_step(model, batch, num_items_in_batch)`` on a batch of the trainer's own
  ``get_train_dataloader()`` (its sampler and data collator), ``num_items_in_batch`` from Trainer's
  ``_get_num_items_in_batch``, then ``fake_mode.optimizer_phase`` (Trainer's order: clip, step, zero_grad).

The data: full-length rows (``seq_len`` tokens with the EOS TRL appends) of deterministic token ids
(``sft_trainer_fake._rows``). DPOTrainer, ORPOTrainer and KTOTrainer 1.16 always tokenize text themselves (DPO/KTO's
``_prepare_dataset`` has no pre-tokenized branch, ORPO's ``tokenize_row`` takes text), so their rows are text of one
word per token id, ``"t17 t4 ..."``, under a word-level stand-in tokenizer (:func:`word_tokenizer`) whose word ``t<i>``
is id ``i``: the ids TRL builds are exactly those (ORPO adds EOS, and no BOS: the tokenizer has none). The prompt is
empty, so every label is a completion label (as trainer_fake.py and the estimator assume); KTO's labels alternate
desirable/undesirable. Reward rows are pre-tokenized (``chosen_ids``/``rejected_ids``). GRPO: emulation 6.

What a CPU build or fake tensors cannot run as a CUDA run does is emulated; each emulation:

1. ``fake_mode.gpu_routing`` (the attention kernel, TRL's chunked log-prob tiles as its Triton kernels allocate,
   dropout, bitsandbytes' 8-bit matmul), ``classic_module_apply`` and ``peft_fake`` (PEFT under fake tensors). ORPO on a
   quantized base: ``prepare_model_for_kbit_training`` (PEFT) casts every 16-bit parameter not of class ``Params4bit``
   to fp32, and the fake path's packed 4-bit weights are plain Parameters (recipes/model_setup.py ``_quantize_model``):
   they are put back after the call, as a real ``Params4bit`` is left alone (as ``model_setup``'s own wrapper does).
2. The all-ones ``attention_mask`` (KTO: ``KL_attention_mask`` too; ORPO: ``concatenated_attention_mask``) is not
   passed to the models (their forward drops it): the rows are unpadded, and on a GPU transformers reads the mask,
   finds no padding and drops it for ``is_causal``; it cannot read a fake mask, and would keep a 4-D mask that rules
   out the flash kernel. The trainer's own code still reads it from the batch (its token counts; ORPO's labels).
3. The batch's values are known. The dataloader runs on real CPU tensors outside the fake mode (host-side work, as in a
   GPU run), and each tensor of the batch enters the step as a fake *constant*: FakeTensorMode's own constant
   propagation (for tensors of one element in torch 2.13, ``CONSTANT_NUMEL_LIMIT``) is extended during the step to
   4 x the batch's largest tensor, so what is computed from the batch alone (labels from ``completion_mask``, KTO's
   ``torch.nonzero(labels)``, the boolean-mask indexing of the metrics and of the fused head's compact path, token
   counts, ORPO's concatenated inputs and its labels from the attention mask) is computed on the real values and gets
   its true shape. GRPO's ``torch.randperm`` (a CPU tensor in a GPU
   run too) is drawn for real and is a constant as well. Weights and activations stay fake.
4. A read of a fake scalar that is not a constant (``.item()`` of a metric computed from the model's outputs) returns 1,
   inside ``training_step`` only (the optimizer step still fails loudly on any read); a read of a constant returns its
   real value. Both are counted in the report (``scalar_reads``, ``known_scalar_reads``).
5. Precomputed reference log-probabilities (DPO/KTO ``precompute_ref_log_probs``): ``__init__`` runs a no-grad pass over
   the dataset and stores the results as dataset columns, which a fake run cannot write (nor can ``hash_module`` hash
   fake weights). The columns are put in its place (``ref_chosen_logps``/``ref_rejected_logps``; KTO ``ref_logps``/
   ``ref_KL_logps``; zeros). The pass runs before training (no optimizer state, no gradients); a real run
   (``fake=False``) runs TRL's own pass, and both count the same.
6. GRPO, the loss step: ``training_step`` runs GRPO's own ``_prepare_inputs`` (shuffle, split into
   ``steps_per_generation`` micro-batches, its buffer) and ``compute_loss``; the generation
   (``_generate_and_score_completions``: ``model.generate``, the reward, the reference and old log-probabilities) is
   replaced by its output as it returns it: ``prompt_ids``/``prompt_mask`` (``seq_len - max_completion_length``
   tokens), ``completion_ids``/``completion_mask`` (``max_completion_length`` tokens, no EOS before the end),
   ``advantages``, ``num_items_in_batch``, ``old_per_token_logps`` only where GRPO computes it
   (``gradient_accumulation_steps`` not a multiple of ``steps_per_generation x num_iterations``),
   ``ref_per_token_logps`` when ``beta`` is not 0. The generation's own memory is measured by
   ``trainer_fake.generation_peaks``. With full fine-tuning and beta > 0 GRPOTrainer loads its reference with
   ``create_model_from_path`` by the model's name; it is built here from the config like the policy (resident in the
   step; the loss step does not run it).
7. TRL's fused LM head as a CUDA build with Triton runs it (``compact``, the default): trl/trainer/utils.py
   ``add_fused_lm_head`` sets ``compact = _use_triton(device)``, True on CUDA, False on a CPU build, which scores every
   position. Compact, only the positions whose label is not -100 are gathered (``hidden_states[mask]``) and scored,
   and the outputs scattered back; the shapes come from the known mask (emulation 3). For DPO/KTO every label is valid
   here, so both paths score the same tokens; for GRPO the compact path leaves out the prompt positions (the CPU path,
   ``compact=False``, is what trainer_fake.py and the estimator count: an upper bound).
8. TRL's ``selective_log_softmax`` (trl/trainer/utils.py; ORPO's ``get_batch_logps`` calls it on the full logits) as a
   CUDA build with Triton runs it: ``is_triton_available() and _supports_trl_loss_kernel(logits, index)`` is True there
   (a cuda device, fp32 logits of unit last stride), False on a CPU build, whose fallback (a per-row logsumexp and
   ``torch.stack``) keeps other fp32 N x V tensors. trl/kernels/logprob_entropy.py (``_LogProbEntropyFunction``: its
   forward allocates four fp32 row tensors and saves the logits view, its backward allocates ``grad_logits``) is loaded
   under a stub ``triton`` whose ``@triton.jit`` kernels do nothing but count their launches (they only write into
   buffers the caller allocated), and ``trl.trainer.utils``' ``is_triton_available``, ``_supports_trl_loss_kernel``
   (its own conditions, the device's type left out) and ``_fused_logprob_entropy`` answer as on CUDA while the harness
   runs; the report's ``triton_kernel_launches`` proves the kernel ran (forward and backward). The same branch of
   ``entropy_from_logits`` and ``selective_log_softmax_and_entropy`` is routed too (DPO/KTO/reward/GRPO reach none of
   the three: their log-probabilities come from the fused LM head).

trainer_fake.py's hand-written steps (``--driver loop``) are kept beside these.

Usage (one case per process):
    python benchmarks/validation/pref_trainer_fake.py --plan plan.json --config config.json [--out result.json]
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

TRAINERS = ("dpo", "orpo", "kto", "reward", "grpo")


def _fake_mode_module():
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import fake_mode

    return fake_mode


# ---------------------------------------------------------------------------------------------- emulations


def _counter(fm):
    """The live-memory counter. While ``stub_scalars`` is set (inside ``training_step`` only): a read of a fake scalar
    is answered from its constant when it has one (``known_scalar_reads``), else with 1 (``scalar_reads``); a
    ``randperm`` is drawn for real (emulations 3 and 4)."""
    import torch

    class PreferenceStepCounter(_beside("sft_trainer_fake").scalar_read_counter_class(fm)):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if self.stub_scalars and func in (torch.ops.aten.randperm.default, torch.ops.aten.randperm.generator):
                # a host-side permutation (GRPO's shuffle_sequence_dict: torch.randperm on the CPU in a GPU run too):
                # drawn for real from the same generator, and a constant like the batch (emulation 3)
                real = _real(lambda: func(*args, **(kwargs or {})))
                out = torch.ops.aten.lift_fresh_copy.default(real)
                self.track(out)
                return out
            return super().__torch_dispatch__(func, types, args, kwargs)

    return PreferenceStepCounter()


@contextlib.contextmanager
def known_values(numel: int, active: bool = True):
    """FakeTensorMode propagates constants (real values) through ops whose inputs are all constants, for outputs of up
    to ``CONSTANT_NUMEL_LIMIT`` elements (1 in torch 2.13): raise the limit to ``numel`` while active."""
    from torch._subclasses import fake_tensor

    if not active:
        yield
        return
    saved = fake_tensor.CONSTANT_NUMEL_LIMIT
    fake_tensor.CONSTANT_NUMEL_LIMIT = max(saved, int(numel))
    try:
        yield
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = saved


def _real(fn):
    """Run ``fn()`` outside every dispatch mode (the fake mode and the counter): host-side work on real tensors."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return fn()


def _on_device(value, fake: bool):
    """The batch's host tensors as the step's tensors, counted as allocations (as ``_prepare_inputs`` moves a batch to
    the GPU): under the fake mode (with :func:`known_values` active) as fake constants carrying the real values, in a
    real run as copies."""
    import torch

    if isinstance(value, torch.Tensor):
        return torch.ops.aten.lift_fresh_copy.default(value) if fake else value.clone()
    if isinstance(value, dict):
        return {k: _on_device(v, fake) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_on_device(v, fake) for v in value)
    return value


def _largest_numel(value) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, dict):
        return max([_largest_numel(v) for v in value.values()] or [1])
    if isinstance(value, list | tuple):
        return max([_largest_numel(v) for v in value] or [1])
    return 1


def _without_mask(forward):
    """``forward`` without the all-ones attention mask of unpadded rows (emulation 2)."""

    def forward_without_mask(*args, attention_mask=None, **kwargs):
        return forward(*args, **kwargs)

    return forward_without_mask


@contextlib.contextmanager
def compact_fused_head(active: bool = True):
    """Emulation 7: ``compact = _use_triton(device)`` in TRL's fused LM head (trl/trainer/utils.py) answered as on CUDA
    with Triton (chunked_logprob's own ``_use_triton``, which picks the Triton tile kernels, is left alone:
    ``fake_mode.gpu_routing`` stands in for those)."""
    from trl.trainer import utils

    if not active:
        yield
        return
    saved = utils._use_triton
    utils._use_triton = lambda device: True
    try:
        yield
    finally:
        utils._use_triton = saved


@contextlib.contextmanager
def _precomputed_reference(trainer: str):
    """Emulation 5: the trainer's precompute pass replaced by its result (zero columns), ``hash_module`` by a name."""
    from trl.trainer import dpo_trainer, kto_trainer

    module, cls = (dpo_trainer, dpo_trainer.DPOTrainer) if trainer == "dpo" else (kto_trainer, kto_trainer.KTOTrainer)
    columns = ("ref_chosen_logps", "ref_rejected_logps") if trainer == "dpo" else ("ref_logps", "ref_KL_logps")

    def precompute(self, dataset, *args, **kwargs):
        names = columns if trainer == "dpo" or self.calculate_KL else columns[:1]
        for name in names:
            dataset = dataset.add_column(name, [0.0] * len(dataset))
        return dataset

    saved = (module.hash_module, cls._precompute_ref_logps)
    module.hash_module = lambda model: "canifinetune-fake-model"
    cls._precompute_ref_logps = precompute
    try:
        yield
    finally:
        module.hash_module, cls._precompute_ref_logps = saved


@contextlib.contextmanager
def _reference_from_config(plan, config: dict, active: bool):
    """GRPO with full fine-tuning and beta > 0 loads its reference by the model's name (``create_model_from_path``,
    in the policy's dtype and attention implementation): build it from the config as the policy is built."""
    if not active:
        yield
        return
    from trl.trainer import grpo_trainer

    def create_model_from_path(model_id, **kwargs):
        return load_base_model(plan, config)

    saved = grpo_trainer.create_model_from_path
    grpo_trainer.create_model_from_path = create_model_from_path
    try:
        yield
    finally:
        grpo_trainer.create_model_from_path = saved


class _TritonStub:
    """A stand-in ``triton`` package for importing trl/kernels/logprob_entropy.py on a CPU build: ``@triton.jit``
    kernels that do nothing when launched (``kernel[grid](...)``) but count their launches, ``triton.cdiv``, and a
    ``triton.language`` whose names (``tl.constexpr`` in the kernels' annotations) exist and are never used."""

    def __init__(self):
        import types

        self.launches: dict[str, int] = {}
        self.triton = types.ModuleType("triton")
        self.language = types.ModuleType("triton.language")
        self.language.__getattr__ = lambda name: object  # PEP 562: tl.constexpr, tl.float32, ... (annotations only)
        self.triton.language = self.language
        self.triton.jit = self.jit
        self.triton.cdiv = lambda a, b: -(-a // b)

    def jit(self, fn):
        launches, name = self.launches, fn.__name__

        class Kernel:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    launches[name] = launches.get(name, 0) + 1

                return launch

        return Kernel()


def _load_logprob_kernel(stub: _TritonStub):
    """trl/kernels/logprob_entropy.py as its own module, imported under ``stub`` (``sys.modules`` is restored)."""
    import importlib.util

    import trl.kernels

    path = os.path.join(os.path.dirname(trl.kernels.__file__), "logprob_entropy.py")
    saved = {name: sys.modules.get(name) for name in ("triton", "triton.language")}
    sys.modules["triton"], sys.modules["triton.language"] = stub.triton, stub.language
    try:
        spec = importlib.util.spec_from_file_location("canifinetune_fake_trl_logprob_entropy", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, value in saved.items():
            if value is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = value
    return module


@contextlib.contextmanager
def triton_log_softmax(active: bool = True):
    """Emulation 8: TRL's ``selective_log_softmax`` (and ``entropy_from_logits``, ``selective_log_softmax_and_entropy``)
    take their Triton branch, as on CUDA: ``_LogProbEntropyFunction`` from trl/kernels/logprob_entropy.py, loaded under
    :class:`_TritonStub`. Yields the kernels' launch counts."""
    import torch
    from trl.trainer import utils

    if not active:
        yield {}
        return
    stub = _TritonStub()
    kernel = _load_logprob_kernel(stub)

    def supports(logits, index=None, row_mask=None):
        # trl/trainer/utils.py _supports_trl_loss_kernel (TRL 1.16) less ``logits.device.type in ("cuda", "xpu")``
        ok = (logits.dtype in (torch.float16, torch.bfloat16, torch.float32) and 1 <= logits.ndim <= 3
              and logits.stride(-1) == 1 and logits.shape[-1] > 0)
        if index is not None:
            ok = (ok and index.shape == logits.shape[:-1] and index.dtype in (torch.int32, torch.int64)
                  and index.device == logits.device)
        if row_mask is not None:
            ok = (ok and index is not None and row_mask.shape == index.shape
                  and row_mask.dtype in (torch.bool, torch.int32, torch.int64) and row_mask.device == logits.device)
        return ok

    missing = object()
    names = ("is_triton_available", "_supports_trl_loss_kernel", "_fused_logprob_entropy")
    saved = {name: getattr(utils, name, missing) for name in names}
    utils.is_triton_available = lambda: True
    utils._supports_trl_loss_kernel = supports
    utils._fused_logprob_entropy = kernel.selective_log_softmax_and_entropy
    try:
        yield stub.launches
    finally:
        for name, value in saved.items():
            if value is missing:
                delattr(utils, name)
            else:
                setattr(utils, name, value)


@contextlib.contextmanager
def _kbit_preparation_keeps_packed_weights(active: bool):
    """Emulation 1, ORPO on a quantized base: ORPOTrainer.__init__'s ``prepare_model_for_kbit_training`` with the fake
    path's packed 4-bit weights put back, as PEFT leaves a real ``Params4bit`` alone (recipes/model_setup.py
    ``_prepare_model_for_kbit_training`` does the same for the recipe's own build)."""
    if not active:
        yield
        return
    from trl.experimental.orpo import orpo_trainer

    with _fake_mode_module().packed_weights_kept(orpo_trainer):
        yield


# ---------------------------------------------------------------------------------------------- model and data


def load_base_model(plan, config: dict, *, sequence_classification: bool = False):
    """The base model as recipes/trainers.load_model loads it (no adapters: the trainer applies ``peft_config``), with
    random weights from ``config``: the plan's dtype, its BitsAndBytesConfig (recipes/model_setup._quantize_model),
    ``num_labels=1`` for a reward model, every parameter trainable for full fine-tuning."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from canifinetune.recipes import model_setup

    qconfig = model_setup.quantization_config(plan)
    dtype = model_setup.weight_dtype(plan) if qconfig is None else model_setup.torch_dtype(plan)
    cfg = model_setup.hf_config(config)
    if sequence_classification:
        cfg.num_labels = 1  # RewardTrainer: one scalar per sequence
    cls = AutoModelForSequenceClassification if sequence_classification else AutoModelForCausalLM
    model = cls.from_config(cfg, dtype=dtype, attn_implementation=plan.attn_implementation)
    if qconfig is not None:  # the names are what model_setup.build_model records (resolved_settings reports them)
        model._canifinetune_unquantized = model_setup._quantize_model(model, plan, qconfig)
    if plan.method == "full":
        model.requires_grad_(True)
    return model


def word_tokenizer(folder: Path, vocab: int):
    """A tokenizer whose word ``t<i>`` is token id ``i`` (3 <= i < vocab), with <pad> 0, </s> 1, <unk> 2, split on
    whitespace: text ``"t5 t9</s>"`` tokenizes to [5, 9, 1]."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    words = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    words.update({f"t{i}": i for i in range(3, vocab)})
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def _text(ids: list[int]) -> str:
    return " ".join(f"t{i}" for i in ids)


def train_rows(plan, vocab: int, count: int):
    """``count`` rows of the trainer's columns, each ``seq_len`` tokens long once TRL appends EOS (grpo: prompts of
    ``seq_len - max_completion_length`` tokens)."""
    from datasets import Dataset

    from canifinetune.recipes import trainers

    rows = _beside("sft_trainer_fake")._rows(vocab, plan.seq_len, 2 * count)
    body = plan.seq_len - 1  # TRL appends EOS to each completion
    t = plan.trainer
    if t in ("dpo", "orpo"):
        return Dataset.from_dict({"prompt": [""] * count, "chosen": [_text(r[:body]) for r in rows[:count]],
                                  "rejected": [_text(r[:body]) for r in rows[count:]]})
    if t == "kto":
        return Dataset.from_dict({"prompt": [""] * count, "completion": [_text(r[:body]) for r in rows[:count]],
                                  "label": [i % 2 == 0 for i in range(count)]})
    if t == "reward":
        return Dataset.from_dict({"chosen_ids": rows[:count], "rejected_ids": rows[count:]})
    if t == "grpo":
        prompt = trainers.length_limit(plan)
        return Dataset.from_dict({"prompt": [_text(r[:prompt]) for r in rows[:count]]})
    raise ValueError(f"trainer {t}: not run by this harness (it runs {', '.join(TRAINERS)})")


def _beside(name: str):
    return _fake_mode_module()._beside(name)


def _generation_output(trainer, plan, rows: int, vocab: int) -> dict:
    """What GRPO's ``_generate_and_score_completions`` returns for ``rows`` prompts of full-length completions (real
    CPU tensors; emulation 6)."""
    import torch

    args = trainer.args
    completion = int(trainer.max_completion_length)
    prompt = plan.seq_len - completion
    g = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {
        "prompt_ids": torch.randint(3, vocab, (rows, prompt), generator=g),
        "prompt_mask": torch.ones(rows, prompt, dtype=torch.long),
        "completion_ids": torch.randint(3, vocab, (rows, completion), generator=g),
        "completion_mask": torch.ones(rows, completion, dtype=torch.long),
        "advantages": torch.zeros(rows),
        "num_items_in_batch": torch.tensor(rows * completion),
    }
    generate_every = args.steps_per_generation * trainer.num_iterations
    if args.gradient_accumulation_steps % generate_every != 0:
        out["old_per_token_logps"] = torch.zeros(rows, completion)
    if trainer.beta != 0.0:
        out["ref_per_token_logps"] = torch.zeros(rows, completion)
    return out


def _grpo_reward(prompts, completions, **kwargs):
    """The stand-in reward function (the recipe's reward.py runs in the generation, which the loss step does not)."""
    return [0.0] * len(completions)


# ---------------------------------------------------------------------------------------------- the run


def run_pref_trainer_steps(plan, config: dict, *, fake: bool = True, steps: int = 2, route_sdpa: bool = True,
                           compact: bool = True) -> dict:
    """Build the trainer as recipes/trainers.build_trainer does, over a model built from ``config``, and run ``steps``
    steps through ``trainer.training_step``, counting live memory (``fake``: under FakeTensorMode, else real CPU
    tensors: tiny models only). ``compact``: the fused LM head's CUDA path (emulation 7), else the CPU build's.
    TRL's Triton log-softmax (emulation 8) is routed in both (a real run's stub kernels leave its outputs unset)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from trl.trainer import dpo_trainer, kto_trainer

    from canifinetune.recipes import model_setup, runtime, trainers

    t = plan.trainer
    if t not in TRAINERS:
        raise ValueError(f"trainer {t}: not run by this harness (it runs {', '.join(TRAINERS)})")
    fm = _fake_mode_module()
    counter = _counter(fm)
    fake_mode = FakeTensorMode(allow_fallback_kernels=False) if fake else contextlib.nullcontext()
    model = ref_model = optimizer = None
    timeline: list[dict] = []
    state: dict[str, Any] = {}

    def category_tensors():
        # a reference copy's weights count as parameters (the counter's categories are fixed: fake_mode.py)
        ref_state = fm._model_state_tensors(ref_model) if ref_model is not None else []
        return {
            "parameters": (fm._model_state_tensors(model) if model is not None else []) + ref_state,
            "gradients": [p.grad for p in model.parameters()] if model is not None else [],
            "optimizer_states": fm._optimizer_state_tensors(optimizer),
        }

    counter.category_tensors = category_tensors
    folder = Path(tempfile.mkdtemp(prefix="canifinetune-pref-trainer-fake-"))
    vocab = int(config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size"))
    tokenizer = word_tokenizer(folder / "tokenizer", vocab)
    if t == "grpo":
        tokenizer.padding_side = "left"  # recipes/runtime._prepare_trainer
    reference = trainers.reference_of(plan)
    common = runtime.sft_config_kwargs(plan, output_dir=str(folder / "out"), use_cpu=True, max_steps=steps)
    args = trainers._config_class(t)(**trainers.config_kwargs(plan, common))
    per_step = plan.batch_size * (args.steps_per_generation if t == "grpo" else 1)
    dataset = train_rows(plan, vocab, per_step * steps)
    apply_ctx = fm.classic_module_apply() if fake else contextlib.nullcontext()
    peft_ctx = fm._beside("peft_fake").fake_peft_support(fake)
    precompute = t in ("dpo", "kto") and reference == "none"
    pre_ctx = _precomputed_reference(t) if precompute and fake else contextlib.nullcontext()
    grpo_ref_ctx = _reference_from_config(plan, config, t == "grpo" and reference == "copy")
    kbit_ctx = _kbit_preparation_keeps_packed_weights(t == "orpo" and fake)
    with fm.gpu_routing(route_sdpa) as routed, compact_fused_head(compact), triton_log_softmax() as launches, \
            apply_ctx, peft_ctx as build_ctx, fake_mode, counter:
        counter.set_phase("build")
        # recipes/trainers.build_trainer, with the model built from the config
        with build_ctx():
            base = load_base_model(plan, config, sequence_classification=(t == "reward"))
        kwargs: dict[str, Any] = {"model": base, "args": args, "train_dataset": dataset, "processing_class": tokenizer}
        lora = trainers.peft_config(plan)
        if lora is not None:
            kwargs["peft_config"] = lora
        if t in ("dpo", "kto") and reference == "copy":
            with build_ctx():
                ref = load_base_model(plan, config)  # a second frozen model, loaded like the policy
            ref.requires_grad_(False)
            ref.eval()
            kwargs["ref_model"] = ref
        if t == "reward":
            base.config.pad_token_id = tokenizer.pad_token_id
        if t == "grpo":
            kwargs["reward_funcs"] = _grpo_reward
        with build_ctx(), pre_ctx, grpo_ref_ctx, kbit_ctx:
            trainer = trainers._trainer_class(t)(**kwargs)
        del base, kwargs
        model = trainer.model
        ref_model = getattr(trainer, "ref_model", None)
        # what Trainer.train does before the first step (transformers 5.24 trainer.py)
        if trainer.args.activation_checkpointing:
            gc_kwargs = dict(trainer.args.activation_checkpointing_kwargs or {})
            every = gc_kwargs.pop("every_n_layers", 1)
            offload = gc_kwargs.pop("offload", False)
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=gc_kwargs or None,
                                                  every_n_layers=every, offload=offload)
        optimizer = model_setup.build_optimizer(plan, model)
        trainer.optimizer = optimizer
        # _inner_training_loop: the micro-batches of this optimizer step (every step here is a full one)
        trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
        resolved = model_setup.resolved_settings(plan, model, optimizer)
        model.forward = _without_mask(model.forward)
        wrapped, _ = trainer.accelerator.prepare(model, optimizer)
        trainable = [p for p in model.parameters() if p.requires_grad]
        step_now = {"n": 0}

        def phase(name):
            counter.set_phase(f"step{step_now['n']}.{name}")

        backward = trainer.accelerator.backward

        def backward_in_its_phase(loss, **kw):
            phase("backward")
            return backward(loss, **kw)

        trainer.accelerator.backward = backward_in_its_phase
        if ref_model is not None:  # the reference copy: no mask; its forward in the "reference" phase
            ref_forward = _without_mask(ref_model.forward)

            def reference_forward(*a, **kw):
                phase("reference")
                try:
                    return ref_forward(*a, **kw)
                finally:
                    phase("forward")

            ref_model.forward = reference_forward
        module = {"dpo": dpo_trainer, "kto": kto_trainer}.get(t)
        saved_use_adapter = module.use_adapter if module is not None else None
        if module is not None:  # the adapter-disabled reference: in the "reference" phase

            @contextlib.contextmanager
            def use_adapter(*a, **kw):
                with saved_use_adapter(*a, **kw):
                    phase("reference")
                    try:
                        yield
                    finally:
                        phase("forward")

            module.use_adapter = use_adapter
        if t == "grpo":
            trainer._generate_and_score_completions = lambda inputs: _on_device(
                _real(lambda: _generation_output(trainer, plan, len(inputs), vocab)), fake)
        batches = _real(lambda: _collated_batches(trainer, steps))
        # the largest tensor computed from the batch alone: the batch's largest (grpo: the generation's [rows, seq_len])
        # times 4 (nonzero of a mask makes ndim x numel indices)
        limit = 4 * max([_largest_numel(b) for b in batches]
                        + [plan.batch_size * args.steps_per_generation * plan.seq_len if t == "grpo" else 1])
        state["after_build"] = counter.current
        state["after_build_categories"] = counter.categories_now()
        counter.reset_peak()
        try:
            for step in range(1, steps + 1):
                step_now["n"] = step
                phase("forward")
                start = counter.current
                with known_values(limit, fake):
                    batch = _on_device(batches[step - 1], fake)
                    batches[step - 1] = None
                    num_items = trainer._get_num_items_in_batch([batch], trainer.args.device)
                    counter.stub_scalars = fake
                    try:
                        trainer.training_step(wrapped, batch, num_items)
                    finally:
                        counter.stub_scalars = False
                    del batch
                fm.optimizer_phase(counter, optimizer, trainable, step, steps, state)
                timeline.append({"step": step, "start": start, "end": counter.current})
        finally:
            if module is not None:
                module.use_adapter = saved_use_adapter
        counter.set_phase("done")
    report = fm.measurement_report(counter, state, timeline, routed, resolved)
    # ORPOTrainer keeps its metrics in _stored_metrics (store_metrics), the others in _metrics
    metrics = trainer._stored_metrics if t == "orpo" else trainer._metrics
    return {**report, "trainer": t, "reference": reference, "loss": f"trl_{t}", "fake": fake, "driver": "trainer",
            "trainer_class": type(trainer).__name__, "trainer_metrics": sorted(metrics["train"]),
            "fused_head": "compact" if compact else "every_position", "triton_kernel_launches": dict(launches),
            "scalar_reads": counter.scalar_reads, "known_scalar_reads": counter.known_scalar_reads}


def _collated_batches(trainer, steps: int) -> list:
    """``steps`` batches from the trainer's own dataloader (its sampler and data collator), on real CPU tensors."""
    loader = iter(trainer.get_train_dataloader())
    return [next(loader) for _ in range(steps)]


def measure_pref_trainer_fake(plan, config: dict) -> dict:
    """The measurement of ``plan`` (a TrainingPlan or a dict) on ``config`` (a config.json dict), with versions."""
    import time

    from canifinetune.estimator.plan import TrainingPlan

    if not isinstance(plan, TrainingPlan):
        plan = TrainingPlan(**plan)
    t0 = time.perf_counter()
    result = run_pref_trainer_steps(plan, config)
    result["wall_seconds"] = round(time.perf_counter() - t0, 2)
    result["versions"] = _fake_mode_module().library_versions()
    result["plan"] = plan.model_dump(mode="json")
    return result


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="a DPO/ORPO/KTO/reward/GRPO training step run by TRL's own trainer "
                                                 "under fake tensors")
    parser.add_argument("--plan", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    return _fake_mode_module().run_and_report(measure_pref_trainer_fake, args.plan, args.config, args.out)


if __name__ == "__main__":
    sys.exit(main())
