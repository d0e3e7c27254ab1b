"""Reading one or more config files into a TrainingPlan: each format's reader, the files combined, the
framework's defaults for what they leave out, and flags (or tool arguments) over everything."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ..errors import describe_validation_error, raised_field, safe_text
from ..plan import TrainingPlan
from . import accelerate, axolotl, deepspeed, detect, llama_factory, parse, peft_adapter, transformers_args, trl
from .reading import MAX_IGNORED_NAMES, Reading, deepspeed_from_name
from .types import FORMAT_VERSIONS, LAUNCHER_FORMATS, ConfigError, ConfigFile, ConfigOverride, ConfigReport, KeyUse

READERS = {"axolotl": axolotl, "llama_factory": llama_factory, "trl": trl, "transformers": transformers_args,
           "peft": peft_adapter, "accelerate": accelerate, "deepspeed": deepspeed}
FRAMEWORK = {"axolotl": "axolotl", "llama_factory": "llama_factory", "trl": "trl", "transformers": "transformers",
             "peft": "transformers"}
MODEL_KEYS = {"axolotl": "base_model", "llama_factory": "model_name_or_path", "trl": "model_name_or_path",
              "peft": "base_model_name_or_path", "transformers": None}
DISTRIBUTION = ("sharding", "offload_optimizer", "offload_params", "num_gpus")
MAX_FILES = 8


@dataclass
class LoadedConfig:
    """The files read, the plan they give, and the report of what was used."""

    readings: list[Reading]
    plan: TrainingPlan
    report: ConfigReport
    file_values: dict[str, Any] = field(default_factory=dict)  # the plan the files alone give (defaults + keys)
    overrides: dict[str, Any] = field(default_factory=dict)  # the flags (tool arguments) given beside the files

    def reading(self, fmt: str) -> Reading | None:
        return next((r for r in self.readings if r.format == fmt), None)

    @property
    def training(self) -> Reading | None:
        return next((r for r in self.readings if r.format not in LAUNCHER_FORMATS), None)


def _read_files(files: list[tuple[str, bytes | str]], formats: list[str | None],
                trainer: str | None = None) -> list[Reading]:
    if not files:
        raise ConfigError("no config file given")
    if len(files) > MAX_FILES:
        raise ConfigError(f"{len(files)} config files; at most {MAX_FILES} (a training config and its launcher "
                          "configs)")
    readings = []
    for (name, raw), fmt in zip(files, formats + [None] * len(files), strict=False):  # formats padded, then cut
        doc = parse.parse(name, raw)
        fmt = detect.check_format(name, fmt) if fmt else detect.detect(doc)
        reading = Reading(doc, fmt)
        reading.trainer = trainer
        module = READERS[fmt]
        try:
            module.read(reading)
        except (TypeError, AttributeError) as exc:  # a value of a shape no framework accepts (a mapping for a number)
            raise ConfigError(f"{name}: a value has a shape {fmt} configs never have ({safe_text(exc, 200)})") from None
        reading.finish(module.READS, module.IGNORED, module.NOT_MODELLED, module.SCHEMA)
        readings.append(reading)
    _check_combination(readings)
    return readings


def _check_combination(readings: list[Reading]) -> None:
    kinds = [r.format for r in readings]
    main = [r for r in readings if r.format in ("axolotl", "llama_factory", "trl")]
    if len(main) > 1 or (main and any(k in ("transformers", "peft") for k in kinds)):
        names = ", ".join(f"{r.doc.name} ({r.format})" for r in readings if r.format not in LAUNCHER_FORMATS)
        raise ConfigError(f"more than one training config: {names}; give one (plus its accelerate/DeepSpeed files)")
    for fmt in ("transformers", "peft", "accelerate", "deepspeed"):
        same = [r.doc.name for r in readings if r.format == fmt]
        if len(same) > 1:
            raise ConfigError(f"two {fmt} configs: {', '.join(same)}; give one")


def _resolve_refs(readings: list[Reading]) -> None:
    """A training or accelerate config naming a DeepSpeed JSON: the given file, or what its name says."""
    ds = next((r for r in readings if r.format == "deepspeed"), None)
    for r in readings:
        for key, path in r.refs:
            if ds is not None:
                if posixpath.basename(path.replace("\\", "/")) != posixpath.basename(ds.doc.name.replace("\\", "/")):
                    r.warn(key, f"names {path}; the DeepSpeed config given is {ds.doc.name}, which is read instead")
                continue
            guess = deepspeed_from_name(path)
            if guess is None:
                r.warn(key, f"names the DeepSpeed config {path}, which was not given: ZeRO is not estimated; pass "
                            "it as another --config")
                continue
            for field_name, value in guess.items():
                r.use(key, field_name, path, value)
            r.warn(key, f"ZeRO settings read from the file name {path} "
                        f"({', '.join(f'{k}={v}' for k, v in guess.items())}); "
                        "pass the file as another --config to read it")


def _defaults(readings: list[Reading]) -> tuple[str, dict[str, Any]]:
    kinds = [r.format for r in readings]
    framework, defaults = "trl", {}
    for fmt in ("transformers", "peft", "axolotl", "llama_factory", "trl"):
        if fmt in kinds:
            framework = FRAMEWORK[fmt]
            defaults.update(READERS[fmt].DEFAULTS)
    return framework, defaults


def _merge(readings: list[Reading]) -> dict[str, Any]:
    """Launcher soft values < training keys < launcher distribution keys (DeepSpeed JSON over accelerate)."""
    order = {"accelerate": 1, "deepspeed": 2}
    merged: dict[str, Any] = {}
    own_precision = any(r.format in ("trl", "axolotl") for r in readings)  # SFTConfig bf16 / Axolotl bf16: auto
    for r in readings:
        if r.format in LAUNCHER_FORMATS:
            if own_precision and "dtype" in r.soft and r.soft.pop("dtype") != "bf16":
                r.warn(None, "the launcher's precision is not used: the trainer's own setting (bf16 by default) "
                             "decides")
            merged.update(r.soft)
    for r in readings:
        if r.format not in LAUNCHER_FORMATS:
            merged.update(r.fields)
    for launcher in (r for r in readings if r.format in LAUNCHER_FORMATS):
        for name, value in launcher.soft.items():
            if merged.get(name) != value:
                launcher.warn(None, f"{name}: {value!r} here, {merged.get(name)!r} in the training config; the "
                                    "training config's value is used")
    for r in sorted((r for r in readings if r.format in LAUNCHER_FORMATS), key=lambda r: order[r.format]):
        merged.update(r.fields)
    return merged


def _distribution(values: dict[str, Any], readings: list[Reading], overrides: dict[str, Any]) -> None:
    first = readings[0]
    sharding, gpus = values.get("sharding"), overrides.get("num_gpus", values.get("num_gpus"))
    if "sharding" in overrides:
        return
    if sharding == "ddp" and gpus in (None, 1):
        values["sharding"] = "none"
        if gpus is None:
            first.warn(None, "data parallel, but no file says how many GPUs: estimated per GPU for 1 (give --num-gpus)")
    elif sharding not in (None, "none", "ddp") and gpus is None:
        first.warn(None, f"{sharding}, but no file says how many GPUs: estimated for 1 GPU (give --num-gpus, or pass "
                         "the accelerate config as another --config)")
    elif sharding in (None, "none") and values.get("num_gpus", 1) > 1:  # accelerate: several processes, no sharding
        values["sharding"] = "ddp"


def _fp16_full_is_mixed(values: dict[str, Any], overrides: dict[str, Any], readings: list[Reading]) -> None:
    """fp16 in a training file is mixed precision for a full fine-tune: transformers' Trainer (fp16=True) scales
    fp16 gradients of fp32 parameters and refuses fp16 ones, LLaMA-Factory upcasts the trainable parameters to fp32
    (model/adapter.py _setup_full_tuning) and Axolotl trains through the same Trainer; so fp32 master weights with
    fp16 compute (precision 'mixed'), never pure fp16 weights, which cannot be trained."""
    merged = {**values, **overrides}
    if merged.get("dtype") != "fp16" or merged.get("method") != "full" or "precision" in merged:
        return
    values["precision"] = "mixed"
    first = next((r for r in readings if r.format not in LAUNCHER_FORMATS), readings[0])
    first.use("fp16", "precision", first.get("fp16", True), "mixed")


def _no_model(readings: list[Reading]) -> ConfigError:
    r = next((r for r in readings if r.format not in LAUNCHER_FORMATS), readings[0])
    key = MODEL_KEYS.get(r.format)
    what = f"no base model ({key})" if key else "no model (TrainingArguments never names one)"
    return ConfigError(f"{r.doc.name} line 1: names {what}, so there is nothing to train; add it, or give --model")


def _plan(data: dict[str, Any], readings: list[Reading]) -> TrainingPlan:
    try:
        return TrainingPlan(**data)
    except ValidationError as exc:
        text = describe_validation_error(exc)
        errors = exc.errors()
        fields = ({e["loc"][0] for e in errors if e.get("loc")}  # a field's own check, or a cross-field one's field
                  | {named[0] for e in errors if (named := raised_field(e)) is not None})
        keys = [f"{u.key} ({r.doc.where(u.key)})" for r in readings for u in r.used if u.field in fields]
        where = f" (from {', '.join(keys[:4])})" if keys else ""
        raise ConfigError(safe_text(f"{text}{where}")) from None


def load_configs(files: list[tuple[str, bytes | str]], formats: list[str | None] | None = None,
                 overrides: dict[str, Any] | None = None) -> LoadedConfig:
    """Read ``files`` ((name, content) pairs) into a plan; ``overrides`` (flags) win over the files."""
    overrides = dict(overrides or {})
    trainer = overrides.get("trainer")
    readings = _read_files(files, list(formats or []), trainer if isinstance(trainer, str) else None)
    _resolve_refs(readings)
    framework, defaults = _defaults(readings)
    fields = _merge(readings)
    _distribution(fields, readings, overrides)
    if "model" not in fields and "model" not in overrides:
        raise _no_model(readings)
    file_values = {**defaults, "framework": framework, **fields}
    _fp16_full_is_mixed(file_values, overrides, readings)
    plan = _plan({**file_values, **overrides}, readings)
    report = _report(readings, framework, defaults, fields, overrides, file_values)
    return LoadedConfig(readings, plan, report, file_values, overrides)


def _report(readings, framework, defaults, fields, overrides, file_values) -> ConfigReport:
    used: list[KeyUse] = [u for r in readings for u in r.used]
    ignored = [((f"{r.doc.name}:{k}" if len(readings) > 1 else k)[:120], why)
               for r in readings for k, why in r.ignored_keys]
    overridden = [ConfigOverride(field=k, file_value=file_values[k], value=v)
                  for k, v in overrides.items() if k in file_values]
    return ConfigReport(
        files=[ConfigFile(name=r.doc.name, format=r.format, defaults_from=FORMAT_VERSIONS[r.format]) for r in readings],
        framework=framework, used=used,
        defaults={k: v for k, v in defaults.items() if k not in fields and k not in overrides},
        not_modelled=[w for r in readings for w in r.warnings], ignored=len(ignored),
        ignored_keys=[k for k, _ in ignored[:MAX_IGNORED_NAMES]], ignored_reasons=dict(ignored[:MAX_IGNORED_NAMES]),
        overrides=[o for o in overridden if o.file_value != o.value], plan_fields=dict(fields))
