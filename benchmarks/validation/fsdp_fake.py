"""Measure one GPU's peak of an FSDP2 training step over N ranks, in one CPU process, under fake tensors.

PyTorch's fake process group (``dist.init_process_group("fake")``) lets ``fully_shard`` run with a world size of N
in a single process; every collective returns at once and allocates what it would allocate on one rank. The model
is built by ``recipes/model_setup.build_model`` for the plan (as the training runtime builds it) and sharded as
accelerate 1.15's ``fsdp2_prepare_model`` does for the recipe's ``fsdp_version: 2`` config:

* with ``mixed_precision`` bf16/fp16 (every bf16/fp16 plan): trainable parameters that are not fp32 are upcast to
  fp32 master weights, and ``MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype, output_dtype=dtype)``
  all-gathers them in the compute dtype (accelerate ``FullyShardedDataParallelPlugin.set_mixed_precision``);
* ``fully_shard`` on every decoder layer (``TRANSFORMER_BASED_WRAP`` over ``_no_split_modules``), with
  ``reshard_after_forward`` = True for FULL_SHARD and False for SHARD_GRAD_OP;
* the input embedding in its own unit (untied), the tail ``[final norm, lm_head]`` (plus the embedding when
  tied) in one unit with ``reshard_after_forward=False``, then the root with torch's default (False for the root);
* the forward runs under ``torch.autocast`` (accelerate ``prepare_model`` with native AMP).

The counting is ``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker``: two steps (forward with TRL's
fused LM-head loss, backward, gradient clipping, ``optimizer.step()``, ``zero_grad(set_to_none=True)``),
``reset_mod_stats()`` and a peak reset after the first, and the peak snapshot of the second step's device.

Usage (one case per process):
    python benchmarks/validation/fsdp_fake.py --plan plan.json --config config.json [--out result.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_mode import classic_module_apply, gpu_routing, report_run


def _decoder_layer_classes(model) -> set[str]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return set(getattr(base, "_no_split_modules", None) or [])


def _final_norm(base):
    inner = getattr(base, "model", None)
    return getattr(inner, "norm", None) if inner is not None else None


def shard_like_accelerate(model, plan, mesh):
    """fully_shard the model the way accelerate 1.15's fsdp2_prepare_model does (see the module docstring)."""
    import torch
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    from canifinetune.recipes import model_setup

    mixed = plan.dtype in ("bf16", "fp16")
    mp = MixedPrecisionPolicy()
    if mixed:
        dt = model_setup.torch_dtype(plan)
        mp = MixedPrecisionPolicy(param_dtype=dt, reduce_dtype=dt, output_dtype=dt)
        for p in model.parameters():
            if p.requires_grad and p.dtype != torch.float32:
                p.data = p.data.to(torch.float32)
    reshard = plan.sharding in ("fsdp_full_shard", "fsdp_hybrid_shard")
    kwargs = {"mesh": mesh, "mp_policy": mp, "reshard_after_forward": reshard}
    layer_names = _decoder_layer_classes(model)
    wrapped = 0
    for module in reversed(list(model.modules())):  # bottom-up, as get_module_children_bottom_up
        if module is model:
            continue
        if type(module).__name__ in layer_names and not isinstance(module, FSDPModule):
            fully_shard(module, **kwargs)
            wrapped += 1
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    emb = base.get_input_embeddings()
    head = base.get_output_embeddings()
    tied = emb is not None and head is not None and emb.weight is head.weight
    if not tied and emb is not None:
        fully_shard(emb, **kwargs)
    tail = [m for m in ((_final_norm(base), emb, head) if tied else (_final_norm(base), head)) if m is not None]
    if tail:
        fully_shard(tail, **{**kwargs, "reshard_after_forward": False})
    root_kwargs = {k: v for k, v in kwargs.items() if k != "reshard_after_forward"}
    fully_shard(model, **root_kwargs)
    return wrapped, tied


def _tracker_class():
    """FSDPMemTracker that also accepts FSDP units whose forward never ran: TRL's fused LM head reads lm_head.weight
    without calling lm_head, so the tail unit's pre-backward would find no stats entry (KeyError in torch 2.13)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPModMemStats

    class Tracker(FSDPMemTracker):
        def _ensure(self, fsdp_mod):
            if fsdp_mod not in self.memory_tracking:
                fqn = self._mod_tracker.get_known_fqn(fsdp_mod) or type(fsdp_mod).__name__
                self.memory_tracking[fsdp_mod] = _FSDPModMemStats(fqn)

        def reset_peak(self):
            """Start the peak afresh from the live set now (reset_mod_stats clears only the module stats: without
            this, the first step's optimizer-state creation would stay the peak)."""
            self._peak_mem_snap = self.get_tracker_snapshot()
            self._peak_mem = {dev: snap["Total"] for dev, snap in self._peak_mem_snap.items()}

        def _fsdp_param_group_pre_backward(self, fsdp_mod, orig):
            inner = super()._fsdp_param_group_pre_backward(fsdp_mod, orig)

            def wrapped(*args, **kwargs):
                self._ensure(fsdp_mod)
                return inner(*args, **kwargs)

            return wrapped

        def _fsdp_param_group_post_backward(self, fsdp_mod, orig):
            inner = super()._fsdp_param_group_post_backward(fsdp_mod, orig)

            def wrapped(*args, **kwargs):
                self._ensure(fsdp_mod)
                return inner(*args, **kwargs)

            return wrapped

    return Tracker


def measure(plan, config: dict, steps: int = 2) -> dict:
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from canifinetune.recipes import model_setup

    n = plan.num_gpus
    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=n, store=FakeStore())
    if plan.sharding == "fsdp_hybrid_shard":  # HSDP: replicated over the nodes, sharded over each node's GPUs
        mesh = init_device_mesh("cpu", (plan.num_nodes, plan.node_gpus), mesh_dim_names=("dp_replicate", "dp_shard"))
    else:
        mesh = init_device_mesh("cpu", (n,))  # before FakeTensorMode: the mesh calls .tolist()
    ac = model_setup.autocast_dtype(plan)
    with gpu_routing(True), classic_module_apply(), FakeTensorMode(allow_fallback_kernels=False):
        model = model_setup.build_model(plan, config)
        from trl.trainer.utils import add_fused_lm_head

        base = model.get_base_model() if plan.uses_adapters else model
        add_fused_lm_head(base, outputs=("log_probs", "entropy", "is_top1"))
        wrapped, tied = shard_like_accelerate(model, plan, mesh)
        optimizer = model_setup.build_optimizer(plan, model)
        vocab = int(model.config.get_text_config().vocab_size)
        input_ids = torch.randint(0, vocab, (plan.batch_size, plan.seq_len))
        labels = input_ids.clone()
        trainable = [p for p in model.parameters() if p.requires_grad]
        tracker = _tracker_class()(model, optimizer)
        tracker.track_inputs((input_ids, labels))
        with tracker:
            for step in range(steps):
                autocast = torch.autocast("cpu", dtype=ac) if ac is not None else contextlib.nullcontext()
                with autocast:
                    out = model(input_ids=input_ids, labels=labels, use_cache=False, fused_lm_head=True)
                    loss = (-out.log_probs).sum() / out.label_mask.sum().clamp(min=1)
                loss.backward()
                del out, loss
                torch.nn.utils.clip_grad_norm_(trainable, 1.0, foreach=True)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if step == 0:
                    tracker.reset_mod_stats()
                    tracker.reset_peak()
        snap = tracker.get_tracker_snapshot("peak")
    devices = {str(dev): stats for dev, stats in snap.items()}
    dev = next(k for k in devices if "cpu" in k)
    stats = {str(getattr(k, "value", k)): int(v) for k, v in devices[dev].items()}
    total = stats.pop("Total")
    return {"peak_allocated_bytes": total, "peak_categories": stats, "fsdp_units": wrapped, "tied": tied,
            "trainable_params_local": sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                                          for p in trainable)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--out")
    args = parser.parse_args(argv)

    def run() -> dict:
        from canifinetune.estimator.plan import TrainingPlan

        plan = TrainingPlan(**json.loads(Path(args.plan).read_text(encoding="utf-8")))
        if not plan.sharding.startswith("fsdp"):
            raise ValueError(f"sharding: this harness measures FSDP plans; got {plan.sharding!r}")
        config = json.loads(Path(args.config).read_text(encoding="utf-8"))
        t0 = time.perf_counter()
        result = measure(plan, config)
        result["wall_seconds"] = round(time.perf_counter() - t0, 2)
        result["plan"] = plan.model_dump(mode="json")
        return result

    return report_run(run, args.out)


if __name__ == "__main__":
    sys.exit(main())
