"""The canifinetune command line: the same core and the same JSON as the MCP tools.

Exit codes: 0 success (fits, or no GPU given); 2 bad input (one line on stderr); 3 the plan does not
fit; 4 the plan is tight; 1 an unexpected internal error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import types
import typing
from typing import Any, get_args, get_origin

from canifinetune.estimator.errors import UsageError as UsageError  # declared in errors.py (the one error tree)
from canifinetune.estimator.errors import safe_text

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_DOES_NOT_FIT = 3
EXIT_TIGHT = 4

# Fields the CLI takes as subcommand options; everything in TrainingPlan is one.
OFFLINE_HELP = ("never touch the network: the catalog, local folders and the local Hugging Face cache only "
                "(as HF_HUB_OFFLINE=1 does); without it, other Hub ids are read from the Hub (config.json and "
                "safetensors headers, never weights)")
_LIST_FIELDS = {"target_modules"}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        raise UsageError(message)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    from canifinetune.estimator.plan import TrainingPlan

    for name, field in TrainingPlan.model_fields.items():
        annotation = field.annotation
        help_text = field.description or ""
        if name == "model":
            parser.add_argument("--model", default=argparse.SUPPRESS,
                                help=help_text + " Required unless --config names it.")
            parser.add_argument("--config", action="append", default=[], metavar="FILE",
                                help="your training config (Axolotl, LLaMA-Factory, TRL, TrainingArguments JSON, PEFT "
                                     "adapter_config.json), plus its accelerate/DeepSpeed files (repeatable); flags "
                                     "given beside it win over its values (docs/configs.md)")
            parser.add_argument("--config-format", action="append", default=[], metavar="FORMAT", dest="config_format",
                                help="the format of each --config, in order, when its keys do not say: axolotl, "
                                     "llama_factory, trl, transformers, peft, accelerate, deepspeed")
            continue
        kwargs: dict = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        base = _unwrap_optional(annotation)
        if name in _LIST_FIELDS:
            kwargs["metavar"] = "NAMES"
            kwargs["help"] = help_text + " Comma-separated, or 'all-linear'."
            parser.add_argument(_flag(name), **kwargs)
        elif base is bool:
            parser.add_argument(_flag(name), action=argparse.BooleanOptionalAction, **kwargs)
        elif get_origin(base) is typing.Literal:
            parser.add_argument(_flag(name), choices=[str(c) for c in get_args(base)], type=str.lower, **kwargs)
        elif base in (int, float):
            parser.add_argument(_flag(name), type=_number(base, name), **kwargs)
        else:
            parser.add_argument(_flag(name), **kwargs)


def _unwrap_optional(annotation):
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _unwrap_optional(args[0])
    if get_origin(annotation) is typing.Annotated:
        return get_args(annotation)[0]
    return annotation


# Numbers on the command line are plain ASCII decimals: no '+', '_', other scripts' digits, hex or 'inf'.
MAX_NUMBER_CHARS = 32
_INT_TEXT = re.compile(r"-?[0-9]+")
_FLOAT_TEXT = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]-?[0-9]{1,3})?")


def _number(kind, name):
    def parse(text: str):
        what = "an integer" if kind is int else "a number"
        pattern = _INT_TEXT if kind is int else _FLOAT_TEXT
        if len(text) > MAX_NUMBER_CHARS or not text.isascii() or not pattern.fullmatch(text):
            raise argparse.ArgumentTypeError(
                f"expected {what} in plain decimal digits; got {safe_text(repr(text), 80)}")
        value = kind(text)
        if kind is float and (not math.isfinite(value) or (value != 0 and abs(value) < sys.float_info.min)
                              or (value == 0 and re.search(r"[1-9]", text.split("e")[0].split("E")[0]))):
            raise argparse.ArgumentTypeError(f"expected {what} between 1e-300 and 1e300; got {text!r}")
        return value
    parse.__name__ = name
    return parse


def _plan_from_args(args: argparse.Namespace):
    from canifinetune.estimator.plan import TrainingPlan

    data = {k: v for k, v in vars(args).items() if k in TrainingPlan.model_fields}
    targets = data.get("target_modules")
    if isinstance(targets, str):
        data["target_modules"] = targets if targets == "all-linear" else [t for t in targets.split(",") if t.strip()]
    if getattr(args, "config", None):  # the user's own config, with the flags over it (server/config_face.py)
        from .config_face import load_from_paths

        args.loaded_config = load_from_paths(args.config, data, args.config_format)
        return args.loaded_config.plan
    if "model" not in data:
        raise UsageError("the following arguments are required: --model (or --config FILE)")
    return TrainingPlan(**data)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="canifinetune",
        description=("Will this fine-tune fit my GPU? Itemized GPU-memory estimates for full, LoRA and QLoRA "
                     "fine-tuning."),
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    est = sub.add_parser("estimate", help="estimate the peak GPU memory of a plan and judge it against a GPU")
    _add_plan_arguments(est)
    est.add_argument("--json", action="store_true", help="print the estimate as JSON (the MCP tool's structure)")
    est.add_argument("--training-tokens", type=_number(int, "training_tokens"), default=None, dest="training_tokens",
                     help="tokens to train on: adds the approximate time and GPU-hours to train (also from "
                          "--max-steps, or --dataset FILE.jsonl with --num-train-epochs)")
    est.add_argument("--offline", action="store_true", help=OFFLINE_HELP)

    models = sub.add_parser("models", help="search the built-in model catalog")
    models.add_argument("query", nargs="*", default=[], help="words to match, e.g. 'qwen 7b'")
    models.add_argument("--json", action="store_true")

    gpus = sub.add_parser("gpus", help="search the built-in GPU catalog")
    gpus.add_argument("query", nargs="*", default=[], help="words to match, e.g. '4090' or 'a100'")
    gpus.add_argument("--json", action="store_true")

    sug = sub.add_parser("suggest", help="the cheapest changes that make a plan fit, ranked, each with its cost")
    _add_plan_arguments(sug)
    sug.add_argument("--keep", action="append", default=[], metavar="FIELD",
                     help="pin a plan field (repeatable): e.g. --keep seq_len --keep method")
    sug.add_argument("--max-suggestions", type=_number(int, "max_suggestions"), default=5, dest="max_suggestions")
    sug.add_argument("--training-tokens", type=_number(int, "training_tokens"), default=None, dest="training_tokens",
                     help="tokens to train on: adds each plan's approximate training time")
    sug.add_argument("--json", action="store_true", help="print the result as JSON (the MCP tool's structure)")
    sug.add_argument("--write-config", default=None, metavar="OUT",
                     help="with --config: write suggestion #1 as an edited copy of your config to OUT (a folder when "
                          "several files change); never your original, and an existing OUT only with --force")
    sug.add_argument("--force", action="store_true", help="let --write-config replace an existing OUT")
    sug.add_argument("--offline", action="store_true", help=OFFLINE_HELP)

    serve = sub.add_parser("serve", help="run the MCP server (stdio; --http for streamable HTTP)")
    serve.add_argument("--http", action="store_true", help="speak streamable HTTP instead of stdio")
    serve.add_argument("--host", default="127.0.0.1",
                       help="HTTP bind address (default 127.0.0.1: this machine only; any other needs --auth-token)")
    serve.add_argument("--auth-token", default=None, metavar="TOKEN",
                       help="HTTP: every request must send 'Authorization: Bearer TOKEN' (default: the environment "
                            "variable CANIFINETUNE_AUTH_TOKEN; required when --host is not a loopback address)")
    serve.add_argument("--allowed-host", action="append", default=None, metavar="NAME",
                       help="HTTP: accept only requests whose Host is NAME (any port) or this machine's; repeatable. "
                            "Bound beyond this machine (with --auth-token) any Host name is accepted by default")
    serve.add_argument("--port", type=_number(int, "port"), default=8765, help="HTTP port (default 8765)")
    serve.add_argument("--offline", action="store_true",
                       help="the tools never reach the Hugging Face Hub (catalog, local folders and the local cache "
                            "only)")
    _add_recipe_commands(sub)
    return parser


def _add_recipe_commands(sub) -> None:
    """`recipe` (write a runnable recipe) and `train` (run one, or --probe it): recipes/render.py, recipes/train.py."""
    rec = sub.add_parser("recipe", help="write a runnable recipe for a plan: recipe.yaml, launch command, requirements")
    _add_plan_arguments(rec)
    rec.add_argument("--out", required=True, metavar="DIR",
                     help="folder to write the recipe's files into (created if missing); existing files are never "
                          "replaced unless --force is given")
    rec.add_argument("--force", action="store_true", help="replace recipe files that already exist in --out")
    rec.add_argument("--json", action="store_true", help="also print the recipe as JSON")
    rec.add_argument("--offline", action="store_true", help=OFFLINE_HELP)
    tr = sub.add_parser("train",
                        help="train a recipe (needs the train extra: pip install -e \".[train]\" in the checkout); "
                             "--probe N measures N steps")
    tr.add_argument("recipe", metavar="RECIPE.yaml", help="the recipe file `canifinetune recipe` wrote")
    tr.add_argument("--dataset", default=None, metavar="PATH",
                    help="JSONL file or dataset folder (overrides the recipe's)")
    tr.add_argument("--probe", type=_number(int, "probe"), default=None, metavar="N",
                    help="run N steps on the GPU and print the measured peaks beside the estimate (CUDA only)")
    tr.add_argument("--device", choices=["cuda", "cpu"], default=None,
                    help="the device (default: CUDA; a machine without a CUDA GPU needs --device cpu)")


def _cmd_estimate(args) -> int:
    from canifinetune.estimator.tiers import estimate_with_tiers

    from .text import format_estimate

    plan = _plan_from_args(args)
    if args.training_tokens is not None and not 1 <= args.training_tokens <= 10**15:
        raise UsageError(f"--training-tokens: must be a positive number of tokens, at most 1e15; got "
                         f"{args.training_tokens}")
    result = estimate_with_tiers(plan, _resolve_model(plan, args), training_tokens=args.training_tokens)
    from .config_face import cli_json, cli_text

    if args.json:
        print(cli_json(args, result))
    else:
        if not _show_rich("estimate", result):
            print(format_estimate(result))
        text = cli_text(args)
        if text:
            print("\n" + text)
    return {"does_not_fit": EXIT_DOES_NOT_FIT, "tight": EXIT_TIGHT}.get(result.verdict, EXIT_OK)


def _show_rich(kind: str, result, *extra) -> bool:
    """Render with rich when stdout is a terminal (server/rich_view.py); False: print plain text instead."""
    if not sys.stdout.isatty():  # pipes, files and tests: plain text, and rich is never imported
        return False
    from .rich_view import show_estimate, show_suggestions, terminal_console

    console = terminal_console()
    if console is None:
        return False
    (show_estimate if kind == "estimate" else show_suggestions)(console, result, *extra)
    return True


def _cmd_models(args) -> int:
    from canifinetune.estimator.catalog import search_models
    from canifinetune.estimator.spec import ModelSpec

    args.query = " ".join(args.query)  # `canifinetune models qwen 7b`: the words, unquoted
    found = search_models(args.query)
    rows: list[dict[str, Any]] = []
    for entry in found:
        spec = ModelSpec.from_config(entry.config_dict())
        rows.append({"id": entry.id, "family": entry.model_type, "params": spec.total_params, "gated": entry.gated})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        if not rows:
            print(f"no catalog model matches {args.query!r}")
        for row in rows:
            gated = "  (gated)" if row["gated"] else ""
            print(f"{row['id']:<48} {row['family']:<12} {row['params'] / 1e9:7.2f}B{gated}")
    return EXIT_OK


def _cmd_gpus(args) -> int:
    from canifinetune.estimator.catalog import search_gpus

    args.query = " ".join(args.query)
    found = search_gpus(args.query)
    rows: list[dict[str, Any]] = [
        {"name": g.name, "memory_gb": g.memory_gb, "usable_bytes": g.total_memory_bytes, "bf16": g.bf16,
         "tflops_bf16_dense": g.tflops_bf16_dense, "tflops_fp16_dense": g.tflops_fp16_dense,
         "memory_bandwidth_gbs": g.memory_bandwidth_gbs}
        for g in found
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        if not rows:
            print(f"no catalog GPU matches {args.query!r}")
        for row in rows:
            print(f"{row['name']:<28} {row['memory_gb']:6g} GB  usable {row['usable_bytes'] / 2**30:7.2f} GiB  "
                  f"bf16 {'yes' if row['bf16'] else 'no '}  {row['tflops_fp16_dense']:7g} TFLOPS fp16")
    return EXIT_OK


def _cmd_serve(args) -> int:
    from .mcp_server import run_http, run_stdio

    if not 0 < args.port < 65536:
        raise UsageError(f"--port: must be between 1 and 65535; got {args.port}")
    if args.http:
        from canifinetune.estimator.errors import CanIFinetuneError

        from .mcp_server import AUTH_TOKEN_ENV, allowed_host_name, check_http_exposure

        token = args.auth_token if args.auth_token is not None else (os.environ.get(AUTH_TOKEN_ENV) or None)
        problem = check_http_exposure(args.host, token)
        if problem is not None:
            raise UsageError(problem)
        try:
            allowed = [allowed_host_name(name) for name in args.allowed_host or ()]
        except CanIFinetuneError as exc:
            raise UsageError(str(exc)) from None
        run_http(args.host, args.port, offline=args.offline, auth_token=token, allowed_hosts=allowed)
    else:
        if args.allowed_host:
            raise UsageError("--allowed-host: only with --http (stdio has no Host header)")
        run_stdio(offline=args.offline)
    return EXIT_OK


def _resolve_model(plan, args):
    """Catalog -> local folder -> Hugging Face cache -> Hub (server/hub.py); huggingface_hub loads only if needed."""
    from .hub import resolve_any

    return resolve_any(plan.model, offline=bool(getattr(args, "offline", False)))


def _cmd_suggest(args) -> int:
    from canifinetune.estimator.search import suggest

    from .text import format_suggestions

    plan = _plan_from_args(args)
    result = suggest(plan, keep=args.keep, max_suggestions=args.max_suggestions, training_tokens=args.training_tokens,
                     model=_resolve_model(plan, args))
    from .config_face import cli_json, cli_text, cli_write

    if args.json:  # the suggest_cheaper_config tool's structured content
        print(cli_json(args, result, search=True))
    else:
        if not _show_rich("suggest", result, format_suggestions(result)):
            print(format_suggestions(result))
        text = cli_text(args, result)
        if text:
            print("\n" + text)
    written = cli_write(args, result)
    if written:
        print(written, file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK if (result.fits_already or result.suggestions) else EXIT_DOES_NOT_FIT


COMMANDS = {"estimate": _cmd_estimate, "models": _cmd_models, "gpus": _cmd_gpus, "serve": _cmd_serve}
COMMANDS["suggest"] = _cmd_suggest


def _cmd_recipe(args) -> int:
    from canifinetune.estimator.estimate import estimate
    from canifinetune.recipes.render import make_recipe, recipe_json, write_recipe

    if not args.out.strip():
        raise UsageError("--out: must name a folder (use --out . for the current folder); got ''")
    plan = _plan_from_args(args)
    est = estimate(plan, model=_resolve_model(plan, args))
    recipe = make_recipe(est.plan, est)  # the plan with what the estimate chose for the hardware (dtype, sharding)
    paths = write_recipe(recipe, args.out, force=args.force)
    if args.json:
        print(recipe_json(recipe))
    else:
        print(recipe.estimate_summary.rstrip())
        print("wrote: " + ", ".join(str(p) for p in paths))
        import shlex

        # recipes/render.py next_step: a command `canifinetune train` accepts for this trainer and GPU count
        print(f"next: cd {shlex.quote(str(paths[0].parent))}, then {recipe.next_step}")
        from .config_face import cli_text

        text = cli_text(args)
        if text:
            print("\n" + text)
    return EXIT_OK


def _cmd_train(args) -> int:
    from canifinetune.recipes.train import train

    train(args.recipe, dataset=args.dataset, probe_steps=args.probe, device=args.device)
    return EXIT_OK


COMMANDS["recipe"] = _cmd_recipe
COMMANDS["train"] = _cmd_train


def main(argv: list[str] | None = None) -> int:
    from pydantic import ValidationError

    from canifinetune.estimator.errors import CanIFinetuneError, describe_validation_error

    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"canifinetune: error: {safe_text(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except ValidationError as exc:
        print(f"canifinetune: error: {safe_text(describe_validation_error(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except CanIFinetuneError as exc:
        print(f"canifinetune: error: {safe_text(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # never a traceback for a user; say what broke
        print(f"canifinetune: internal error: {type(exc).__name__}: {safe_text(exc, 300)} (please report it)",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
