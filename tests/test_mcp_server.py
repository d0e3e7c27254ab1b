"""The MCP server through the SDK's in-memory Client: every tool, resource, prompt, completion and error path."""

from __future__ import annotations

import json
import sys
import types

import anyio
import pytest
from mcp import Client
from mcp.types import PromptReference, ResourceTemplateReference

from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.search import suggest
from canifinetune.server import mcp_server, mcp_views
from canifinetune.server.hub import env_offline
from canifinetune.server.mcp_server import build_server, suggest_impl
from canifinetune.server.mcp_views import (
    MEMORY_FIELDS,
    PLAN_SCHEMA_URI,
    RECIPE_FIELDS,
    EstimateView,
    RecipeView,
    SuggestView,
    suggest_view,
)

pytestmark = pytest.mark.anyio

RENDER = "canifinetune.recipes.render"


@pytest.fixture
def anyio_backend():
    return "asyncio"


def text_of(result) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def call(name: str, **arguments):
    async with Client(build_server()) as client:
        return await client.call_tool(name, arguments)


# ------------------------------------------------------------------------------------------- listing


async def test_tools_listed_with_annotations_and_output_schemas():
    async with Client(build_server()) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"estimate_memory", "suggest_cheaper_config", "make_recipe"}
    for tool in tools.values():
        a = tool.annotations
        assert a.read_only_hint is True and a.idempotent_hint is True
        assert a.open_world_hint is not env_offline()  # open-world: Hub ids may be fetched (tests/test_hub.py)
        assert a.destructive_hint is False
        assert tool.output_schema and tool.output_schema.get("type") == "object"
        assert tool.description and tool.title
    # plus what reading the user's own config gave (issue 16, tests/test_configs.py)
    assert set(tools["estimate_memory"].output_schema["properties"]) == set(EstimateView.model_fields) | {"config"}
    assert set(tools["suggest_cheaper_config"].output_schema["properties"]) == (
        set(SuggestView.model_fields) | {"config", "config_edits"})
    assert set(tools["make_recipe"].output_schema["properties"]) == set(RecipeView.model_fields) | {"config"}


async def test_tool_inputs_are_the_plan_fields():
    """The flat arguments are plan fields with the plan's types, choices and defaults; every other field goes in
    the plan object, which the plan resource documents (issue 15.4: one plan, not 31 fields three times)."""
    plan_schema = mcp_views.compact_schema(TrainingPlan.model_json_schema(), arguments=True)  # as tools/list sends it
    async with Client(build_server()) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        doc = json.loads((await client.read_resource(PLAN_SCHEMA_URI)).contents[0].text)
    assert set(doc["properties"]) == set(TrainingPlan.model_fields)
    assert all(p.get("description") for p in doc["properties"].values())
    # every other plan field; the user's own config (issue 16); a model's config.json for a model not in the catalog
    extra = {"plan", "config", "config_format", "model_config"}
    expected = {
        "estimate_memory": set(MEMORY_FIELDS) | extra,
        "suggest_cheaper_config": set(MEMORY_FIELDS) | extra | {"keep"},
        "make_recipe": set(MEMORY_FIELDS) | set(RECIPE_FIELDS) | extra,
    }
    assert {"dataset", "learning_rate", "output_dir"}.isdisjoint(MEMORY_FIELDS)
    for name, schema in ((n, t.input_schema) for n, t in tools.items()):
        assert set(schema["properties"]) == expected[name], name
        assert not schema.get("required")  # model too is optional: a config can name it
        for field, prop in schema["properties"].items():
            if field not in TrainingPlan.model_fields:
                continue
            plan_prop = plan_schema["properties"][field]
            for key in ("enum", "type", "const"):
                assert prop.get(key) == plan_prop.get(key), (name, field, key)
            if field != "model" and plan_prop.get("default") is not None:
                assert prop["default"] == plan_prop["default"], (name, field)
        assert "canifinetune://schema/plan" in schema["properties"]["plan"]["description"]
        assert "ask" in schema["properties"]["framework"]["description"]
        # issue 21: the machine, flat
        assert schema["properties"]["num_gpus"]["description"] == "GPUs in the machine; sharding chosen if not given"
        assert schema["properties"]["host_ram_gb"]["description"] == "machine RAM in GiB, for offload"
        assert "config.json" in schema["properties"]["model_config"]["description"]
    keep = tools["suggest_cheaper_config"].input_schema["properties"]["keep"]
    assert keep.get("description") and keep["type"] == "array"


async def test_every_plan_field_is_reachable_through_the_plan_object_or_flat():
    """Every plan field not among a tool's arguments is accepted in plan, and also flat (taken as if in plan)."""
    values = {"lora_alpha": 64, "lora_dropout": 0.0, "use_dora": True, "gradient_accumulation_steps": 4,
              "lora_r": 32, "attn_implementation": "eager", "precision": "mixed", "sharding": "ddp"}
    async with Client(build_server()) as client:
        schema = {t.name: t.input_schema for t in (await client.list_tools()).tools}["estimate_memory"]
        assert set(values).isdisjoint(schema["properties"]) and "num_gpus" in schema["properties"]
        inside = await client.call_tool("estimate_memory", {"model": "Qwen/Qwen2.5-0.5B", "num_gpus": 2,
                                                            "plan": values})
        flat = await client.call_tool("estimate_memory", {"model": "Qwen/Qwen2.5-0.5B", "num_gpus": 2, **values})
        both = await client.call_tool("estimate_memory", {"model": "Qwen/Qwen2.5-0.5B", "seq_len": 512,
                                                          "plan": {"seq_len": 4096, "lora_r": 8}})
        default = {k: f.default for k, f in TrainingPlan.model_fields.items() if not f.is_required()}
        everything = await client.call_tool(
            "make_recipe",
            {
                "model": "Qwen/Qwen2.5-0.5B",
                "gpu": "RTX 4090",
                "plan": {k: v for k, v in default.items() if k not in schema["properties"]},
            },
        )
    for result in (inside, flat):
        assert not result.is_error, text_of(result)
        # only what differs
        assert result.structured_content["plan"] == {"model": "Qwen/Qwen2.5-0.5B", "num_gpus": 2, **values}
    assert both.structured_content["plan"] == {"model": "Qwen/Qwen2.5-0.5B", "seq_len": 512, "lora_r": 8}  # flat wins
    assert not everything.is_error, text_of(everything)


async def test_what_an_assistant_pays():
    """issue 15.4, over stdio as a host sees it: tools/list <= 16 KB, input schemas <= 6 KB, a typical answer's
    text <= 600 tokens, small structured content (no plan echoed), the recipe's files as resource links."""
    from benchmarks.bench_mcp_tokens import INPUT_SCHEMAS_GOAL, TEXT_TOKENS_GOAL, TOOLS_LIST_GOAL, measure

    m = await anyio.to_thread.run_sync(measure)
    assert m["tools_list_bytes"] <= TOOLS_LIST_GOAL and m["input_schemas_bytes"] <= INPUT_SCHEMAS_GOAL, m
    for name, t in m["tools"].items():
        assert not t["is_error"] and t["text_tokens"] <= TEXT_TOKENS_GOAL and t["text_bytes"] <= 2400, (name, t)
        # a search answers with up to five suggestions, each with its budget by component
        assert t["structured_bytes"] <= (6144 if name == "suggest_cheaper_config" else 4096), (name, t)
        assert t["description_bytes"] <= 400, (name, t)
    assert set(m["tools"]["make_recipe"]["other_content"]) == {"resource_link"}
    # issue 21: with the user's Axolotl config (8-bit LoRA of Mistral-7B at 8192 tokens), still <= 600 tokens
    t = m["with_config"]["suggest_cheaper_config + config"]
    assert not t["is_error"] and t["text_tokens"] <= TEXT_TOKENS_GOAL, t


# ------------------------------------------------------------------------------------------- estimate_memory


async def test_estimate_fits_structured_and_text():
    result = await call("estimate_memory", model="Qwen/Qwen2.5-1.5B-Instruct", gpu="RTX 4090")
    assert not result.is_error
    est = EstimateView.model_validate(result.structured_content)
    assert est.verdict == "fits" and est.gpu.name == "RTX 4090"
    assert est.plan == {"model": "Qwen/Qwen2.5-1.5B-Instruct", "gpu": "RTX 4090"}  # only what differs from defaults
    assert sum(p.bytes for p in est.breakdown) == est.budget_bytes and all(p.explanation for p in est.breakdown)
    text = text_of(result)
    lines = text.splitlines()
    assert len(text) <= 2400
    # the verdict, need vs have, full / LoRA / QLoRA on this GPU, the plan, the stack, the top three
    assert lines[0].startswith("FITS on RTX 4090")
    assert lines[1].startswith("need ") and "have 23.88 GiB usable" in lines[1] and lines[1].endswith("free")
    assert lines[2].startswith("full / LoRA / QLoRA on RTX 4090: ")
    assert lines[4].startswith("stack: ")
    # the approximate speed in one line (issue 25), in the text and the structured content alike
    assert lines[5].startswith("speed on RTX 4090: ~") and "tokens/s" in lines[5] and est.speed == lines[5]
    top = sorted((p for p in est.breakdown if p.name != "safety_margin"), key=lambda p: -p.bytes)[:3]
    assert lines[6].startswith("largest: ") and all(p.name in lines[6] for p in top)
    assert lines[-1].startswith("next:") and "make_recipe" in lines[-1]


async def test_estimate_does_not_fit_points_to_suggest():
    result = await call("estimate_memory", model="Qwen/Qwen2.5-7B", method="full", gpu="RTX 4090")
    assert not result.is_error
    assert result.structured_content["verdict"] == "does_not_fit"
    text = text_of(result)
    assert text.startswith("DOES NOT FIT")
    assert "suggest_cheaper_config" in text.splitlines()[-1]


async def test_estimate_with_gpu_vram_and_without_gpu():
    r = await call("estimate_memory", model="qwen2.5 0.5b", gpu_vram_gb=16)
    assert not r.is_error and r.structured_content["gpu"]["name"] == "16 GB GPU"
    r = await call("estimate_memory", model="Qwen/Qwen2.5-0.5B")
    assert r.structured_content["verdict"] == "unknown"
    assert "gpu" in text_of(r).splitlines()[-1]


async def test_every_plan_field_is_accepted():
    args = dict(model="meta-llama/Llama-3.1-8B", method="qlora", lora_r=8, lora_alpha=16, lora_dropout=0.0,
                target_modules=["q_proj", "v_proj"], bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                dtype="bf16", optim="paged_adamw_8bit", seq_len=2048, batch_size=2, gradient_accumulation_steps=8,
                gradient_checkpointing=True, attn_implementation="sdpa", loss_implementation="chunked",
                num_gpus=2, sharding="ddp", gpu="A100 80GB", dataset="data.jsonl", learning_rate=2e-4,
                max_steps=100, output_dir="out")
    r = await call("estimate_memory", **args)
    assert not r.is_error, text_of(r)
    plan = r.structured_content["plan"]  # the fields that differ from the defaults
    defaults = {k: f.default for k, f in TrainingPlan.model_fields.items()}
    for key, value in args.items():
        assert plan.get(key, defaults[key]) == value, key
    assert r.structured_content["per_gpu"] is True


async def test_seq_len_beyond_context_is_a_warning_not_a_clamp():
    r = await call("estimate_memory", model="microsoft/Phi-3-mini-4k-instruct", target_modules="all-linear",
                   seq_len=8192, gpu="H100 SXM")
    assert not r.is_error, text_of(r)
    assert r.structured_content["plan"]["seq_len"] == 8192
    assert any("max_position_embeddings" in w for w in r.structured_content["warnings"])
    assert "warning: seq_len 8192" in text_of(r)


# ------------------------------------------------------------------------------------------- errors


ERROR_CASES = [
    # (arguments, substrings the message must hold: the field, the bad value, the alternative)
    ({"model": "qwen2.5 7b instrct"}, ["model", "qwen2.5 7b instrct", "Qwen/Qwen2.5-7B-Instruct"]),
    ({"model": "Qwen/Qwen2.5-7B", "gpu": "rtx 4900"}, ["gpu", "rtx 4900", "RTX 4090"]),
    ({"model": "Qwen/Qwen2.5-7B", "gpu": "T4", "dtype": "bf16"}, ["dtype", "bf16", "fp16"]),  # asked for: refused
    ({"model": "Qwen/Qwen2.5-7B", "method": "qlroa"}, ["method", "qlroa", "'qlora'"]),
    ({"model": "Qwen/Qwen2.5-7B", "optim": "adamw"}, ["optim", "'adamw'", "adamw_torch"]),
    ({"model": "Qwen/Qwen2.5-7B", "lora_rank": 8}, ["lora_rank", "lora_r"]),
    ({"model": "Qwen/Qwen2.5-7B", "batch_size": 0}, ["batch_size", "greater than or equal to 1", "0"]),
    ({"model": "Qwen/Qwen2.5-7B", "seq_len": -5}, ["seq_len", "-5"]),
    ({"model": "Qwen/Qwen2.5-7B", "gpu": "2x RTX 4090", "num_gpus": 4}, ["2", "4", "num_gpus"]),
    ({"model": "Qwen/Qwen2.5-7B", "host_ram_gb": 0}, ["host_ram_gb", "0"]),
    ({"model": "Qwen/Qwen2.5-7B", "gpu": "RTX 4090", "gpu_vram_gb": 24}, ["gpu", "gpu_vram_gb", "not both"]),
    ({"model": "Qwen/Qwen2.5-7B", "method": "full", "load_in_4bit": True}, ["method", "qlora"]),
    ({"model": "Qwen/Qwen2.5-7B", "offload_params": True}, ["offload_params", "zero3"]),
    ({"model": "Qwen/Qwen2.5-7B", "target_modules": ["q_proj;rm -rf"]}, ["target_modules", "q_proj;rm -rf"]),
    ({"model": "Qwen/Qwen2.5-7B", "gpu_vram_gb": -1}, ["gpu_vram_gb", "-1"]),
    ({"model": "Qwen/Qwen2.5-7B", "lora_dropout": 1.5}, ["lora_dropout", "1.5"]),
    ({"model": "Qwen/Qwen2.5-7B", "batch_size": "eight"}, ["batch_size", "eight"]),
    ({"model": ""}, ["model"]),
    ({}, ["model", "required", "Qwen/Qwen2.5-7B-Instruct"]),
    ({"model": "microsoft/Phi-3-mini-4k-instruct"}, ["target_modules", "qkv_proj", "all-linear"]),
    ({"model": "/nonexistent/folder"}, ["model", "/nonexistent/folder"]),
    # issue 15.6: the field, the bad value and the valid choices, from pydantic's structured errors
    (
        {"model": "Qwen/Qwen2.5-7B", "target_modules": 5},
        ["target_modules", "5", "'all-linear'", "a list", "q_proj,v_proj"],
    ),
    (
        {"model": "Qwen/Qwen2.5-7B", "dtype": "bf17"},
        ["dtype", "'bf17'", "'bf16', 'fp16', 'fp32'", "did you mean 'bf16'"],
    ),
    ({"model": "Qwen/Qwen2.5-7B", "seq_len": "long"}, ["seq_len", "'long'", "whole number"]),
    (
        {"model": "Qwen/Qwen2.5-7B", "plan": {"lora_rnk": 8}},
        ["plan", "'lora_rnk'", "lora_r", "canifinetune://schema/plan"],
    ),
    ({"model": "Qwen/Qwen2.5-7B", "plan": {"sharding": "zero9"}}, ["sharding", "'zero9'", "'zero3'"]),
    ({"model": "Qwen/Qwen2.5-7B", "plan": 5}, ["plan", "5", "an object"]),
    # issue 21: a model's config.json as text; what is wrong with it, and what to give instead
    ({"model_config": "{not json"}, ["model_config", "not valid JSON", "config.json"]),
    ({"model_config": "[1, 2]"}, ["model_config", "JSON object", "config.json"]),
    ({"model_config": '{"model_type": "llama", "hidden_size": 64}'}, ["model_config", "num_hidden_layers",
                                                                       "config.json", "catalog"]),
]


@pytest.mark.parametrize("tool", ["estimate_memory", "suggest_cheaper_config", "make_recipe"])
@pytest.mark.parametrize("arguments,expected", ERROR_CASES, ids=[str(i) for i in range(len(ERROR_CASES))])
async def test_bad_input_is_an_actionable_tool_error(tool, arguments, expected):
    result = await call(tool, **arguments)
    assert result.is_error
    text = text_of(result)
    assert not text.startswith("Error executing tool"), text
    assert text.startswith(f"{tool}: ") or text.startswith(f"{tool}:"), text
    for part in expected:
        assert part in text, (part, text)


async def test_unknown_tool_names_the_closest():
    async with Client(build_server()) as client:
        result = await client.call_tool("estimate_mem", {"model": "x"})
    assert result.is_error and "estimate_memory" in text_of(result)


async def test_a_crash_in_the_core_is_reported_with_its_message(monkeypatch):
    def boom(plan, offline, *args, **kwargs):
        raise RuntimeError("the calibration table is corrupt")

    monkeypatch.setattr(mcp_server, "_estimate", boom)
    result = await call("estimate_memory", model="Qwen/Qwen2.5-7B", gpu="RTX 4090")
    assert result.is_error
    text = text_of(result)
    assert "internal error" in text and "RuntimeError" in text and "calibration table is corrupt" in text


async def test_an_invalid_structured_result_is_reported(monkeypatch):
    monkeypatch.setattr(mcp_server, "estimate_view", lambda est: {"verdict": "nope"})  # not an EstimateView
    result = await call("estimate_memory", model="Qwen/Qwen2.5-0.5B", gpu="RTX 4090")
    assert result.is_error and "estimate_memory" in text_of(result)
    assert text_of(result) != "Error executing tool estimate_memory"


@pytest.mark.parametrize(
    "arguments,expected",
    [
        ({"model": "Qwen/Qwen2.5-7B", "method": "QLoRA"}, {"method": "qlora"}),
        (
            {"model": "Qwen/Qwen2.5-7B", "target_modules": "q_proj,v_proj,o_proj"},
            {"target_modules": ["o_proj", "q_proj", "v_proj"]},
        ),
        ({"model": "Qwen/Qwen2.5-7B", "optim": " PAGED_ADAMW_8BIT"}, {"optim": "paged_adamw_8bit"}),
        (
            {"model": "Qwen/Qwen2.5-7B", "plan": {"sharding": "ZeRO3", "num_gpus": 2}},
            {"sharding": "zero3", "num_gpus": 2},
        ),
    ],
)
async def test_arguments_are_read_as_people_write_them(arguments, expected):
    result = await call("estimate_memory", **arguments)
    assert not result.is_error, text_of(result)
    assert expected.items() <= result.structured_content["plan"].items()


# ------------------------------------------------------------------------------------------- suggest (adapter)


def _same(tool_content: dict, result) -> bool:
    return tool_content == json.loads(json.dumps(suggest_view(result)))


async def test_suggest_returns_the_search_result_unchanged():
    """A thin adapter: the structured content is estimator.search.suggest's SuggestResult, made small (no plan
    repeated, the suggestions' changes rather than their plans; server/mcp_views.py suggest_view)."""
    args = dict(model="Qwen/Qwen2.5-7B-Instruct", gpu="RTX 4090", seq_len=2048)
    result = await call("suggest_cheaper_config", **args)
    assert not result.is_error, text_of(result)
    assert _same(result.structured_content, suggest(TrainingPlan(**args)))
    assert "plan" not in result.structured_content and all(
        "plan" not in s for s in result.structured_content["suggestions"]
    )
    assert len(text_of(result)) <= 2400
    out = SuggestView.model_validate(result.structured_content)
    assert out.original.verdict == "does_not_fit" and out.suggestions and out.keep == []
    first = out.suggestions[0]
    assert first.estimate.verdict == "fits" and first.changes and first.cost.summary
    lines = text_of(result).splitlines()
    assert lines[0].startswith("DOES NOT FIT on RTX 4090")  # the verdict, then the first move
    assert lines[1].startswith(f"{len(out.suggestions)} configuration(s) fit; apply the first: ")
    assert all(f"{c.field} {json.dumps(c.old)} -> {json.dumps(c.new)}" in lines[1] for c in first.changes)
    assert "1. [same_math]" in text_of(result) and first.cost.summary in text_of(result)
    assert lines[-1].startswith("next:") and "apply the first suggestion" in lines[-1]


async def test_suggest_passes_keep_and_a_hub_model_to_the_search(monkeypatch):
    from canifinetune.estimator import search

    seen = {}
    real = search.suggest

    def spy(plan, keep=(), **kwargs):
        seen.update(keep=tuple(keep), **kwargs)
        return real(plan, keep=keep, **kwargs)

    monkeypatch.setattr(search, "suggest", spy)
    result = await call("suggest_cheaper_config", model="Qwen/Qwen2.5-7B-Instruct", gpu="RTX 4090", seq_len=2048,
                        keep=["batch_size", "seq_len"])
    assert not result.is_error, text_of(result)
    assert seen == {"keep": ("batch_size", "seq_len")}  # a catalog model: the search resolves it itself
    out = SuggestView.model_validate(result.structured_content)
    assert out.keep == ["batch_size", "seq_len"] and "pinned (never changed): batch_size, seq_len" in text_of(result)
    assert out.suggestions and not any(c.field in out.keep for s in out.suggestions for c in s.changes)


async def test_suggest_default_keep_is_the_searchs_own():
    """Nothing pinned by default: more GPUs may be suggested, ranked after every same-GPU change."""
    result = await call("suggest_cheaper_config", model="Qwen/Qwen2.5-7B", method="full", gpu="RTX 4090")
    out = SuggestView.model_validate(result.structured_content)
    assert out.keep == [] and _same(result.structured_content,
                                    suggest(TrainingPlan(model="Qwen/Qwen2.5-7B", method="full", gpu="RTX 4090")))
    hardware = [s.cost.kind in ("more_gpus", "larger_gpu") for s in out.suggestions]
    assert hardware == sorted(hardware) and not hardware[0]


async def test_suggest_unknown_keep_field_is_an_error_naming_keep():
    result = await call("suggest_cheaper_config", model="Qwen/Qwen2.5-7B", gpu="RTX 4090", keep=["seqlen"])
    assert result.is_error and "keep" in text_of(result), text_of(result)
    # past the input schema, the search's own check (validate_keep) is a ToolError naming keep too
    with pytest.raises(mcp_server.ToolError) as info:
        suggest_impl({"model": "Qwen/Qwen2.5-7B", "gpu": "RTX 4090", "keep": ["seqlen"]})
    assert str(info.value).startswith("suggest_cheaper_config: keep: 'seqlen' is not a plan field")


async def test_suggest_without_a_gpu_asks_for_one():
    result = await call("suggest_cheaper_config", model="Qwen/Qwen2.5-7B", method="full")
    text = text_of(result)
    assert result.is_error and text.startswith("suggest_cheaper_config: gpu:"), text
    assert "gpu_vram_gb" in text and "internal error" not in text


async def test_suggest_nothing_fits_names_a_gpu_and_a_gpu_count():
    args = dict(model="Qwen/Qwen2.5-7B", method="full", gpu="RTX 4090")
    result = await call("suggest_cheaper_config", **args, keep=["method", "offload_optimizer", "offload_params"])
    assert not result.is_error, text_of(result)
    out = SuggestView.model_validate(result.structured_content)
    text = text_of(result)
    assert out.nothing_fits and all(s.cost.tier == "more_hardware" for s in out.suggestions)
    assert "nothing fits on the RTX 4090" in text.splitlines()[1]
    assert out.smallest_gpu and out.min_gpus and out.min_gpus_sharding
    assert f"smallest catalog GPU for the plan unchanged: {out.smallest_gpu}" in text
    assert (
        f"fewest GPUs for the plan unchanged: {out.min_gpus} x RTX 4090 with sharding '{out.min_gpus_sharding}'" in text
    )
    r = await call("estimate_memory", **{**args, "gpu": out.smallest_gpu})
    assert r.structured_content["verdict"] == "fits"
    r = await call("estimate_memory", **args, num_gpus=out.min_gpus, sharding=out.min_gpus_sharding)
    assert r.structured_content["verdict"] == "fits"


async def test_suggest_when_nothing_fits_at_all():
    result = await call("suggest_cheaper_config", model="Qwen/Qwen2.5-7B", method="full", gpu="RTX 4090",
                        keep=["method", "sharding", "gpu"])
    out = SuggestView.model_validate(result.structured_content)
    text = text_of(result)
    assert out.nothing_fits and not out.suggestions and out.smallest_gpu
    assert text.splitlines()[1] == "nothing fits on the RTX 4090 with the allowed changes"
    assert out.smallest_gpu in text and "unpin a field" in text.splitlines()[-1]


async def test_suggest_when_it_already_fits():
    result = await call("suggest_cheaper_config", model="Qwen/Qwen2.5-0.5B", gpu="H100 SXM")
    assert not result.is_error
    out = SuggestView.model_validate(result.structured_content)
    assert out.fits_already and not out.suggestions
    assert "as it is: nothing to change" in text_of(result).splitlines()[1]
    assert "make_recipe" in text_of(result).splitlines()[-1]


# ------------------------------------------------------------------------------------------- make_recipe


async def test_make_recipe_adapter(monkeypatch):
    def fake_recipe(plan, est=None):
        files = {"recipe.yaml": f"model: {plan.model}\n", "train.sh": "canifinetune train recipe.yaml\n"}
        return types.SimpleNamespace(plan=plan, files=files, launch_command="canifinetune train recipe.yaml",
                                     framework_note=None, next_step="canifinetune train recipe.yaml --probe 3")

    fake = types.ModuleType(RENDER)
    fake.make_recipe = fake_recipe
    monkeypatch.setitem(sys.modules, RENDER, fake)
    async with Client(build_server()) as client:
        result = await client.call_tool("make_recipe", {"model": "Qwen/Qwen2.5-0.5B", "gpu": "RTX 4090"})
        assert not result.is_error, text_of(result)
        out = RecipeView.model_validate(result.structured_content)
        links = [c for c in result.content if c.type == "resource_link"]
        assert [link.name for link in links] == out.files == ["recipe.yaml", "train.sh"]
        read = await client.read_resource(str(links[0].uri))
    assert read.contents[0].text == "model: Qwen/Qwen2.5-0.5B\n" and out.verdict == "fits"
    assert text_of(result).startswith("FITS") and "recipe.yaml, train.sh" in text_of(result)


async def test_make_recipe_real():
    """The files come as resource links (issue 15.4), each readable, equal to what the renderer makes; the text
    names them, the command that writes them and the launch command, never their content."""
    from canifinetune.recipes.render import make_recipe

    args = {"model": "Qwen/Qwen2.5-0.5B", "method": "qlora", "gpu": "RTX 4090", "dataset": "data.jsonl",
            "learning_rate": 2e-4, "plan": {"lora_alpha": 16}}
    async with Client(build_server()) as client:
        result = await client.call_tool("make_recipe", args)
        assert not result.is_error, text_of(result)
        out = RecipeView.model_validate(result.structured_content)
        links = {c.name: c for c in result.content if c.type == "resource_link"}
        read = {name: (await client.read_resource(str(link.uri))).contents[0].text for name, link in links.items()}
        with pytest.raises(Exception) as err:
            await client.read_resource("canifinetune://recipe/AAAA/recipe.yaml")
    plan = TrainingPlan(model="Qwen/Qwen2.5-0.5B", method="qlora", gpu="RTX 4090", dataset="data.jsonl",
                        learning_rate=2e-4, lora_alpha=16)
    assert read == make_recipe(plan).files and list(links) == out.files and "recipe.yaml" in links
    for uri in (str(link.uri) for link in links.values()):  # each URI once: in its link, never in the text or structure
        assert uri not in text_of(result) and uri not in json.dumps(result.structured_content)
    assert all(links[n].size == len(read[n].encode()) and links[n].mime_type for n in links)
    assert "recipe.yaml" in text_of(result) and "plan:" not in text_of(result)  # no file inlined
    assert out.cli_command.startswith("canifinetune recipe --model Qwen/Qwen2.5-0.5B --method qlora")
    assert "--lora-alpha 16" in out.cli_command and out.launch_command in text_of(result)
    assert "not a recipe this server made" in str(err.value)


# ------------------------------------------------------------------------------------------- trainers (issue 17)


async def test_trainer_is_flat_and_its_fields_go_in_the_plan_object():
    """trainer is a flat argument whose description says to ask for its fields; those fields go in plan (the plan
    resource documents them); a field of another trainer is refused naming it; the tool says when to ask."""
    async with Client(build_server()) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        doc = json.loads((await client.read_resource(PLAN_SCHEMA_URI)).contents[0].text)
        for name in ("estimate_memory", "suggest_cheaper_config", "make_recipe"):
            prop = tools[name].input_schema["properties"]["trainer"]
            assert prop["enum"] == ["sft", "dpo", "orpo", "kto", "reward", "grpo"] and prop["default"] == "sft"
            assert "ask" in prop["description"]
        assert (
            "reference model" in tools["estimate_memory"].description and "vLLM" in tools["estimate_memory"].description
        )
        for field in ("precompute_ref_log_probs", "reference_model", "num_generations", "max_completion_length",
                      "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization"):
            assert field in doc["properties"] and field not in tools["estimate_memory"].input_schema["properties"]
        wrong = await client.call_tool("estimate_memory", {"model": "Qwen/Qwen2.5-0.5B", "trainer": "dpo",
                                                           "plan": {"num_generations": 4}})
        flat = await client.call_tool("estimate_memory", {"model": "Qwen/Qwen2.5-0.5B", "trainer": "GRPO",
                                                          "num_generations": 4, "gpu": "RTX 4090"})
    assert wrong.is_error and "num_generations" in text_of(wrong) and "grpo" in text_of(wrong)
    assert not flat.is_error, text_of(flat)  # GRPO is estimated (trainer_memory.py): an error here is a failure
    assert flat.structured_content["plan"]["trainer"] == "grpo"
    assert flat.structured_content["plan"]["num_generations"] == 4


async def test_make_recipe_for_a_trainer_ships_its_example_data():
    args = {"model": "Qwen/Qwen2.5-0.5B", "gpu": "RTX 4090", "trainer": "grpo", "seq_len": 1024,
            "plan": {"num_generations": 4, "max_completion_length": 256}}
    async with Client(build_server()) as client:
        result = await client.call_tool("make_recipe", args)
        assert not result.is_error, text_of(result)
        out = RecipeView.model_validate(result.structured_content)
        links = {c.name: c for c in result.content if c.type == "resource_link"}
        assert list(links) == out.files
        data = (await client.read_resource(str(links["example_data.jsonl"].uri))).contents[0].text
        reward = (await client.read_resource(str(links["reward.py"].uri))).contents[0].text
    assert (
        links["example_data.jsonl"].mime_type == "application/jsonl" and links["reward.py"].mime_type == "text/x-python"
    )
    assert all(set(json.loads(line)) == {"prompt"} for line in data.splitlines())
    assert "def reward(prompts, completions" in reward
    assert "--trainer grpo" in out.cli_command and "--num-generations 4" in out.cli_command


# ------------------------------------------------------------------------------------------- resources


async def test_resources_and_template_listed():
    async with Client(build_server()) as client:
        resources = {str(r.uri): r for r in (await client.list_resources()).resources}
        templates = (await client.list_resource_templates()).resource_templates
    assert set(resources) == {"canifinetune://catalog/gpus", "canifinetune://catalog/models", "canifinetune://docs/memory-model",
                              "ui://canifinetune/budget.html",  # the MCP App (tests/test_mcp_app.py)
                              PLAN_SCHEMA_URI}  # every plan field: what the plan argument takes
    assert [t.uri_template for t in templates] == ["canifinetune://spec/{+model_id}", "canifinetune://recipe/{key}/{name}"]
    assert all(r.description and r.mime_type for r in resources.values())


async def test_read_catalogs_and_doc():
    async with Client(build_server()) as client:
        gpus = json.loads((await client.read_resource("canifinetune://catalog/gpus")).contents[0].text)["gpus"]
        models = json.loads((await client.read_resource("canifinetune://catalog/models")).contents[0].text)["models"]
        doc = (await client.read_resource("canifinetune://docs/memory-model")).contents[0].text
    assert any(g["name"] == "RTX 4090" and g["bf16"] for g in gpus)
    assert any(g["name"] == "Tesla T4" and not g["bf16"] for g in gpus)
    assert any(m["id"] == "Qwen/Qwen2.5-7B-Instruct" and m["params"] > 7e9 for m in models)
    assert "memory" in doc.lower() and len(doc) > 500


async def test_read_model_spec_template():
    async with Client(build_server()) as client:
        spec = json.loads((await client.read_resource("canifinetune://spec/Qwen/Qwen2.5-7B-Instruct")).contents[0].text)
        assert spec["id"] == "Qwen/Qwen2.5-7B-Instruct" and spec["num_layers"] == 28
        assert "q_proj" in spec["linear_modules"] and spec["config"]["model_type"] == "qwen2"
        with pytest.raises(Exception) as err:
            await client.read_resource("canifinetune://spec/Qwen/Qwen9-7B")
    assert "not in the catalog" in str(err.value)


# ------------------------------------------------------------------------------------------- prompt, completions


async def test_prompt():
    async with Client(build_server()) as client:
        prompts = (await client.list_prompts()).prompts
        assert [p.name for p in prompts] == ["fit_finetune"]
        assert {a.name for a in prompts[0].arguments} == {"model", "gpu", "goal"}
        assert all(a.description for a in prompts[0].arguments)  # issue 15.6: the arguments described
        assert [a.name for a in prompts[0].arguments if a.required] == ["model", "gpu"]
        got = await client.get_prompt(
            "fit_finetune", {"model": "Qwen/Qwen2.5-7B", "gpu": "RTX 4090", "goal": "a chat model"}
        )
    text = got.messages[0].content.text
    for word in (
        "estimate_memory",
        "suggest_cheaper_config",
        "make_recipe",
        "Qwen/Qwen2.5-7B",
        "RTX 4090",
        "a chat model",
    ):
        assert word in text


@pytest.mark.parametrize("name,arguments,needles", [
    ("fit_finetun", {}, ["'fit_finetun'", "did you mean 'fit_finetune'", "prompts: fit_finetune"]),
    ("fit_finetune", {"model": "Qwen/Qwen2.5-7B"}, ["gpu is required", "model, gpu, goal?"]),
    ("fit_finetune", {"model": "m", "gpu": "g", "goals": "x"}, ["'goals' is not an argument"]),
])
async def test_prompt_errors_are_invalid_params(name, arguments, needles):
    """JSON-RPC -32602 (invalid params) with a message naming what was wrong, not code 0 or -32603."""
    from mcp import MCPError
    from mcp.types import INVALID_PARAMS

    async with Client(build_server()) as client:
        with pytest.raises(MCPError) as err:
            await client.get_prompt(name, arguments)
    assert err.value.code == INVALID_PARAMS
    assert all(n in err.value.message for n in needles), err.value.message


def test_protocol_error_codes_over_stdio():
    """The same over stdio with raw JSON-RPC, as any client sees it: unknown method -32601, unknown prompt and a
    prompt missing an argument -32602; and serve vs serve --offline: openWorldHint true vs false."""
    from benchmarks.bench_mcp import SERVER, Session

    def raw(s, method, params):
        s.next_id += 1
        s.send({"jsonrpc": "2.0", "id": s.next_id, "method": method, "params": params})
        while True:
            msg = json.loads(s.proc.stdout.readline())
            if msg.get("id") == s.next_id:
                return msg

    hints = {}
    for offline in (False, True):
        s = Session(SERVER + (["--offline"] if offline else []))
        try:
            s.initialize()
            hints[offline] = {t["annotations"]["openWorldHint"] for t in raw(s, "tools/list", {})["result"]["tools"]}
            if offline:
                continue
            assert raw(s, "nope/nope", {})["error"]["code"] == -32601
            assert raw(s, "prompts/get", {"name": "nope"})["error"]["code"] == -32602
            missing = raw(s, "prompts/get", {"name": "fit_finetune", "arguments": {"model": "m"}})["error"]
            assert missing["code"] == -32602 and "gpu is required" in missing["message"]
        finally:
            s.close()
    assert hints == {False: {not env_offline()}, True: {False}}


async def test_completions():
    async with Client(build_server()) as client:
        prompt = PromptReference(type="ref/prompt", name="fit_finetune")
        r = await client.complete(prompt, {"name": "model", "value": "Qwen/Qwen2.5-7"})
        assert r.completion.values and all(v.startswith("Qwen/Qwen2.5-7") for v in r.completion.values)
        r = await client.complete(prompt, {"name": "gpu", "value": "RTX 40"})
        assert set(r.completion.values) >= {"RTX 4090", "RTX 4080", "RTX 4070"}
        r = await client.complete(prompt, {"name": "gpu", "value": "a100"})
        assert "A100 80GB SXM" in r.completion.values
        r = await client.complete(prompt, {"name": "model", "value": "llama 3.1"})
        assert "meta-llama/Llama-3.1-8B" in r.completion.values
        r = await client.complete(prompt, {"name": "gpu", "value": ""})
        assert len(r.completion.values) == r.completion.total > 20
        template = ResourceTemplateReference(type="ref/resource", uri="canifinetune://spec/{+model_id}")
        r = await client.complete(template, {"name": "model_id", "value": "google/gemma-2"})
        assert "google/gemma-2-9b-it" in r.completion.values
        r = await client.complete(prompt, {"name": "goal", "value": "x"})
        assert r.completion.values == []


# ------------------------------------------------------------------------------------------- the assistant's loop

LOOP_PLANS = [
    dict(model="Qwen/Qwen2.5-7B", method="full", gpu="RTX 4090"),
    dict(model="meta-llama/Llama-3.1-8B", seq_len=2048, batch_size=16, gpu="RTX 4090"),
    dict(model="mistralai/Mistral-7B-v0.3", gpu_vram_gb=8),
    dict(model="Qwen/Qwen2.5-14B", gpu="A100 40GB PCIe", batch_size=16, seq_len=2048),
    dict(model="meta-llama/Llama-3.1-70B", method="qlora", gpu="A100 80GB SXM", batch_size=16, seq_len=4096),
    dict(model="google/gemma-2-9b-it", method="full", batch_size=16, gpu="A100 80GB SXM"),
    dict(model="Qwen/Qwen2.5-32B", gpu="H100 SXM", batch_size=16, seq_len=2048),
    dict(model="microsoft/Phi-3-medium-4k-instruct", target_modules="all-linear", gpu="RTX 3090"),
    dict(model="Qwen/Qwen3-8B", method="full", gpu="L40S"),
    dict(model="meta-llama/Llama-3.2-3B", method="full", gpu="RTX 4060 Ti 16GB"),
    dict(model="Qwen/Qwen2.5-1.5B", method="full", seq_len=4096, batch_size=16, gpu="RTX 3060 12GB"),
    dict(model="mistralai/Mixtral-8x7B-v0.1", gpu="A100 80GB SXM"),
    dict(model="meta-llama/Llama-2-13b-hf", gpu="RTX 4090"),
    dict(model="google/gemma-2-27b-it", method="qlora", seq_len=2048, gpu="RTX 4090"),
    dict(model="Qwen/Qwen2.5-72B-Instruct", method="qlora", gpu="RTX A6000", batch_size=8, seq_len=2048),
    dict(model="meta-llama/Llama-3.2-1B", method="full", gpu="Tesla T4", batch_size=16, seq_len=2048),  # fp16 chosen
    dict(model="mistralai/Mistral-7B-v0.1", dtype="fp16", gpu="Tesla V100 16GB"),
    dict(model="allenai/OLMo-2-1124-13B", method="full", gpu="H100 SXM"),
    dict(model="Qwen/Qwen2.5-7B-Instruct", gradient_checkpointing=False, seq_len=4096, gpu="A10G"),
    dict(model="HuggingFaceTB/SmolLM2-1.7B", method="full", batch_size=32, gpu="RTX 3080"),
    dict(model="meta-llama/Llama-3.1-70B", method="full", gpu="A100 80GB SXM"),
    dict(model="Qwen/Qwen3-30B-A3B", target_modules=["q_proj", "v_proj"], gpu="RTX 5090"),
    dict(model="google/gemma-3-1b-it", method="full", seq_len=8192, batch_size=8, gpu_vram_gb=8),
    dict(
        model="Qwen/Qwen2.5-0.5B",
        method="full",
        seq_len=16384,
        batch_size=4,
        loss_implementation="standard",
        gpu_vram_gb=8,
    ),
]


def _frugal_fits(args: dict) -> bool:
    """Oracle: does the thriftiest configuration (same model, GPU and seq_len) fit? Then a suggestion must exist."""
    from canifinetune.estimator.errors import CanIFinetuneError
    from canifinetune.estimator.estimate import estimate

    plan = TrainingPlan(**args).replace(method="qlora", load_in_4bit=None, load_in_8bit=False, batch_size=1,
                                        optim="paged_adamw_8bit", gradient_checkpointing=True,
                                        loss_implementation="chunked", precision="pure")
    for targets in (plan.target_modules, "all-linear"):
        try:
            return estimate(plan.replace(target_modules=targets)).verdict == "fits"
        except CanIFinetuneError:
            continue
    return False


def test_loop_plans_span_models_methods_and_gpus():
    from canifinetune.estimator.estimate import estimate

    assert len(LOOP_PLANS) >= 20
    assert len({p["model"] for p in LOOP_PLANS}) >= 18 and {p.get("method", "lora") for p in LOOP_PLANS} == {
        "full",
        "lora",
        "qlora",
    }
    sizes = [estimate(TrainingPlan(**p)).gpu_usable_bytes / 2**30 for p in LOOP_PLANS]
    assert min(sizes) <= 8.1 and max(sizes) >= 79
    for p in LOOP_PLANS:
        assert estimate(TrainingPlan(**p)).verdict == "does_not_fit", p


@pytest.mark.parametrize(
    "args", LOOP_PLANS, ids=[f"{p['model'].split('/')[-1]}-{p.get('gpu', p.get('gpu_vram_gb'))}" for p in LOOP_PLANS]
)
async def test_assistant_loop(args):
    """Plays an assistant: estimate, one suggest_cheaper_config call, apply the first suggestion, confirm."""
    async with Client(build_server()) as client:
        first = await client.call_tool("estimate_memory", args)
        assert first.structured_content["verdict"] == "does_not_fit"
        answer = await client.call_tool("suggest_cheaper_config", args)
        assert not answer.is_error, text_of(answer)
        out = SuggestView.model_validate(answer.structured_content)
        text = text_of(answer)
        assert len(text) <= 2400
        if out.suggestions:
            top = out.suggestions[0]
            assert "apply the first: " in text.splitlines()[1]
            applied = {**args, **{c.field: c.new for c in top.changes}}  # what an assistant does with the changes
            # the changes are the whole difference to the search's own plan (any plan field may be given flat), once
            # the estimate has chosen what the plan leaves to the GPU (fp16 on a T4), as it did for the original
            from canifinetune.estimator.estimate import estimate

            assert estimate(TrainingPlan(**applied)).plan == suggest(TrainingPlan(**args)).suggestions[0].plan
            confirm = await client.call_tool("estimate_memory", applied)
            assert not confirm.is_error, text_of(confirm)
            assert confirm.structured_content["verdict"] == "fits", text_of(confirm)
            want = top.estimate.model_dump(mode="json")  # the suggestion's own estimate, as a fresh one gives it
            got = {k: confirm.structured_content[k] for k in want}
            for d in (want, got):
                d["breakdown"] = [{"name": p["name"], "bytes": p["bytes"]} for p in d["breakdown"]]
            assert got == want
            if not out.nothing_fits:
                return
        else:
            assert not _frugal_fits(args), f"a fitting configuration exists but none was suggested: {text}"
        assert out.nothing_fits and "nothing fits" in text.splitlines()[1]
        assert out.smallest_gpu or out.min_gpus, text
        if out.smallest_gpu:
            assert f"smallest catalog GPU for the plan unchanged: {out.smallest_gpu}" in text
            on = {**args, "gpu": out.smallest_gpu, "gpu_vram_gb": None}
            assert (await client.call_tool("estimate_memory", on)).structured_content["verdict"] == "fits"
        if out.min_gpus:
            assert f"fewest GPUs for the plan unchanged: {out.min_gpus} x" in text
            on = {**args, "num_gpus": out.min_gpus, "sharding": out.min_gpus_sharding}
            assert (await client.call_tool("estimate_memory", on)).structured_content["verdict"] == "fits"


async def test_each_server_keeps_its_own_offline_setting(monkeypatch):
    """The setting travels as a value: building a second server does not change the first one's tools."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    offline, online = build_server(offline=True), build_server(offline=False)
    assert {t.annotations.open_world_hint for t in offline._tool_manager.list_tools()} == {False}
    assert {t.annotations.open_world_hint for t in online._tool_manager.list_tools()} == {True}
    assert not hasattr(mcp_server, "_HUB_OFFLINE") and not hasattr(mcp_server, "_ANNOTATIONS")


# ------------------------------------------------------------------------------------------- one glance (issue 21)


async def test_estimate_carries_the_tier_row():
    """full / LoRA / QLoRA on the user's GPU, in the text (one line) and compactly in the structured content; each
    tier is what estimate_memory says for that method."""
    args = {"model": "Qwen/Qwen2.5-7B-Instruct", "gpu": "RTX 4090", "seq_len": 2048}
    async with Client(build_server()) as client:
        result = await client.call_tool("estimate_memory", args)
        others = {m: (await client.call_tool("estimate_memory", {**args, "method": m})).structured_content
                  for m in ("full", "qlora")}
    sc = result.structured_content
    tiers = {t["method"]: t for t in sc["tiers"]}
    assert list(tiers) == ["full", "lora", "qlora"]
    assert tiers["lora"] == {"method": "lora", "verdict": sc["verdict"], "budget_bytes": sc["budget_bytes"],
                             "used_fraction": sc["used_fraction"]}
    for method, other in others.items():
        assert (tiers[method]["verdict"], tiers[method]["budget_bytes"]) == (other["verdict"], other["budget_bytes"])
    assert "full / LoRA / QLoRA on RTX 4090: does not fit (71.1 GiB) / does not fit (26.4 GiB) / fits (69%)" in (
        text_of(result).splitlines())
    assert "chosen_defaults" not in sc and "chose:" not in text_of(result)  # nothing was left to the hardware


async def test_what_the_gpu_decides_is_said_and_used():
    """dtype unset on a GPU without bf16, sharding unset on several GPUs (num_gpus flat, or '2x' in gpu): the
    estimate chooses, says so (text and chosen_defaults), and its plan is the chosen one."""
    async with Client(build_server()) as client:
        t4 = await client.call_tool("estimate_memory", {"model": "Qwen/Qwen2.5-1.5B-Instruct", "gpu": "T4"})
        two = await client.call_tool("estimate_memory", {"model": "Qwen/Qwen2.5-7B-Instruct", "gpu": "RTX 4090",
                                                         "num_gpus": 2})
        named = await client.call_tool("estimate_memory", {"model": "Qwen/Qwen2.5-7B-Instruct", "gpu": "2x RTX 4090"})
    assert not t4.is_error, text_of(t4)
    assert t4.structured_content["plan"]["dtype"] == "fp16"
    assert t4.structured_content["chosen_defaults"][0].startswith("dtype fp16: the Tesla T4 has no bf16")
    assert text_of(t4).splitlines()[1].startswith("chose: dtype fp16")
    for result in (two, named):
        sc = result.structured_content
        assert not result.is_error and sc["per_gpu"] and sc["plan"]["num_gpus"] == 2, text_of(result)
        assert sc["plan"]["sharding"] in ("ddp", "zero2", "zero3")
        assert sc["chosen_defaults"][0].startswith(f"sharding {sc['plan']['sharding']} over 2 GPUs")
        assert f"chose: sharding {sc['plan']['sharding']}" in text_of(result)
    assert named.structured_content["budget_bytes"] == two.structured_content["budget_bytes"]


async def test_host_ram_gb_is_flat_and_judges_offload():
    args = {"model": "Qwen/Qwen2.5-7B", "method": "full", "gpu": "RTX 4090",
            "plan": {"sharding": "zero3", "offload_optimizer": True, "offload_params": True}}
    async with Client(build_server()) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        small = await client.call_tool("estimate_memory", {**args, "host_ram_gb": 64})
        large = await client.call_tool("estimate_memory", {**args, "host_ram_gb": 512})
    assert all("host_ram_gb" in t.input_schema["properties"] for t in tools.values())
    assert small.structured_content["verdict"] == "does_not_fit" and "host_ram_gb" in text_of(small).splitlines()[0]
    assert large.structured_content["verdict"] == "fits", text_of(large)
    assert small.structured_content["plan"]["host_ram_gb"] == 64


async def test_make_recipe_renders_the_plan_the_estimate_chose():
    """The recipe trains what the estimate judged: fp16 on a T4, the chosen sharding on two GPUs (the CLI's
    make_recipe(est.plan, est))."""
    import yaml

    async with Client(build_server()) as client:
        answers = {}
        for name, args in (("t4", {"model": "Qwen/Qwen2.5-0.5B", "gpu": "T4"}),
                           ("two", {"model": "Qwen/Qwen2.5-7B-Instruct", "gpu": "RTX 4090", "num_gpus": 2})):
            result = await client.call_tool("make_recipe", args)
            assert not result.is_error, text_of(result)
            links = {c.name: str(c.uri) for c in result.content if c.type == "resource_link"}
            recipe = yaml.safe_load((await client.read_resource(links["recipe.yaml"])).contents[0].text)
            answers[name] = (result, recipe["plan"])
    (t4, t4_plan), (two, two_plan) = answers["t4"], answers["two"]
    assert t4_plan["dtype"] == "fp16" and "chose: dtype fp16" in text_of(t4).splitlines()[1]
    assert t4.structured_content["chosen_defaults"][0].startswith("dtype fp16")
    chosen = two.structured_content["chosen_defaults"][0].split()[1]
    assert two_plan["num_gpus"] == 2 and two_plan["sharding"] == chosen != "none"


async def test_a_config_is_accounted_for_once():
    """With a config, its account (keys used, not modelled, ignored) is in the structured content once, compact;
    the text says it in one line, keeps the warnings about keys not modelled, and stays within 2,400 characters."""
    from benchmarks.bench_mcp_tokens import AXOLOTL_MISTRAL_LORA

    args = {"config": AXOLOTL_MISTRAL_LORA, "gpu": "RTX 4090"}
    async with Client(build_server()) as client:
        est = await client.call_tool("estimate_memory", args)
        sug = await client.call_tool("suggest_cheaper_config", args)
    for result in (est, sug):
        assert not result.is_error, text_of(result)
        text, sc = text_of(result), result.structured_content
        config = sc["config"]
        config_lines = [line for line in text.splitlines() if line.startswith("config: ")]
        assert config_lines == [f"config: axolotl file, {len(config['used'])} keys used, {len(config['not_modelled'])} "
                                f"not modelled (warned), {config['ignored']} ignored; details in structured content"]
        assert "used  " not in text and "sequence_len" not in text  # no key-by-key account in the text
        for warning in config["not_modelled"]:  # but every key not modelled is warned about there
            assert f"warning: {warning['key'] + ': ' if warning['key'] else ''}{warning['message']}" in text
        assert "warning: bf16: bf16 'auto'" in text
        assert text.splitlines()[-1].startswith("next:") and len(text) <= 2400
        assert config["files"] == [{"name": "config", "format": "axolotl",
                                    "defaults_from": config["files"][0]["defaults_from"]}]
        assert config["used"]["sequence_len"] == "seq_len" and config["used"]["micro_batch_size"] == "batch_size"
        assert config["ignored"] >= len(config["ignored_keys"]) > 0 and len(config["ignored_keys"]) <= 12
        key = '"sequence_len"'  # the file's key: once in the account, then only in the edits that change it
        assert json.dumps(sc).count('"not_modelled"') == 1
        assert json.dumps(sc).count(key) == 1 + json.dumps(sc.get("config_edits", [])).count(key)
    edits = sug.structured_content["config_edits"]
    assert [g["rank"] for g in edits] == [s["rank"] for s in sug.structured_content["suggestions"]]
    assert all(e["file"] == "config" and "format" not in e for g in edits for e in g["edits"])
    first = "; ".join(f"{e['key']}: {json.dumps(e['old'])} -> {json.dumps(e['new'])}".replace('"', "'")
                      for e in edits[0]["edits"])
    assert f"as edits to your config, #1: {first} (all: config_edits)" in text_of(sug)


async def test_a_json_config_reaches_the_tool_as_text():
    """The SDK parses a string argument holding JSON into an object; a JSON config (TrainingArguments, DeepSpeed)
    and a model_config still arrive as the text the client sent."""
    from pathlib import Path

    text = (Path(__file__).parent / "data" / "configs" / "training_args.json").read_text()
    async with Client(build_server()) as client:
        result = await client.call_tool("estimate_memory", {"config": text, "model": "Qwen/Qwen2.5-0.5B",
                                                            "gpu": "RTX 4090"})
    assert not result.is_error, text_of(result)
    assert result.structured_content["config"]["files"][0]["format"] == "transformers"


def _mistral_config(**extra) -> dict:
    from canifinetune.estimator.catalog import find_model

    return {**find_model("mistralai/Mistral-7B-v0.1", forgiving=False).config_dict(), **extra}


async def test_model_config_over_stdio():
    """A model that is not in the catalog, offline, from the text of its config.json, through a real client over
    stdio: it estimates as the same architecture does from the catalog, under the name the config or the call
    gives; suggest_cheaper_config and make_recipe (whose links read back) take it too; bad text is an error naming
    model_config and what to give."""
    from mcp import StdioServerParameters
    from mcp_helpers import ROOT, SERVE

    named = json.dumps(_mistral_config(_name_or_path="acme/mistral-7b-internal"))
    anonymous = json.dumps(_mistral_config())
    params = StdioServerParameters(command=sys.executable, args=[*SERVE[1:], "--offline"], cwd=str(ROOT))
    async with Client(params) as client:
        catalog = await client.call_tool("estimate_memory", {"model": "mistralai/Mistral-7B-v0.1", "gpu": "RTX 4090"})
        est = await client.call_tool("estimate_memory", {"model_config": named, "gpu": "RTX 4090"})
        plain = await client.call_tool("estimate_memory", {"model_config": anonymous, "gpu": "RTX 4090"})
        given = await client.call_tool("estimate_memory", {"model_config": anonymous, "model": "my-mistral",
                                                           "gpu": "RTX 4090"})
        sug = await client.call_tool("suggest_cheaper_config", {"model_config": named, "gpu": "RTX 4090",
                                                                "seq_len": 4096})
        recipe = await client.call_tool("make_recipe", {"model_config": named, "gpu": "RTX 4090"})
        links = {c.name: str(c.uri) for c in recipe.content if c.type == "resource_link"}
        recipe_yaml = (await client.read_resource(links["recipe.yaml"])).contents[0].text
        bad_json = await client.call_tool("estimate_memory", {"model_config": "{\"model_type\": ", "gpu": "RTX 4090"})
        encoder = await client.call_tool("suggest_cheaper_config", {"model_config": json.dumps(
            {"model_type": "t5", "d_model": 512, "num_layers": 6, "vocab_size": 32128}), "gpu": "RTX 4090"})
    for result in (catalog, est, plain, given, sug, recipe):
        assert not result.is_error, text_of(result)
    sc = est.structured_content
    assert (sc["model"], sc["model_source"]) == ("acme/mistral-7b-internal", "model_config")
    assert sc["budget_bytes"] == catalog.structured_content["budget_bytes"] and sc["tiers"]
    assert text_of(est).splitlines()[3].startswith("acme/mistral-7b-internal (7.24B params, model_config)")
    assert plain.structured_content["model"] == "custom model" and given.structured_content["model"] == "my-mistral"
    assert sug.structured_content["suggestions"]
    assert sug.structured_content["original"]["model_source"] == "model_config"
    assert "model: acme/mistral-7b-internal" in recipe_yaml and "note: model_config" in text_of(recipe)
    assert bad_json.is_error and text_of(bad_json).startswith("estimate_memory: model_config: is not valid JSON")
    assert "config.json" in text_of(bad_json)
    assert encoder.is_error and text_of(encoder).startswith("suggest_cheaper_config: model_config: ")
    assert "decoder" in text_of(encoder) and "canifinetune://catalog/models" in text_of(encoder)


def test_a_recipe_from_a_model_config_is_kept_by_its_server():
    """The links of a recipe made from a model_config name it by digest: this process reads them back; a digest it
    does not hold is refused, saying to call make_recipe again."""
    from canifinetune.estimator.errors import CanIFinetuneError

    config = _mistral_config(_name_or_path="acme/kept")
    plan = TrainingPlan(model="acme/kept", gpu="RTX 4090")
    key = mcp_views.recipe_key(plan, config)
    assert mcp_views.recipe_from_key(key) == (plan, config) and len(key) < 200
    with pytest.raises(CanIFinetuneError) as err:
        mcp_views.recipe_from_key(key[:-22] + "A" * 22)
    assert "call make_recipe again with the model_config" in str(err.value)


async def test_model_config_beside_a_training_config():
    """The training config's model name (or, when it names none, the model_config's) with the model_config's
    architecture."""
    model_config = json.dumps(_mistral_config())
    trl = "per_device_train_batch_size: 2\nmax_length: 512\nuse_peft: true\n"
    async with Client(build_server(offline=True)) as client:
        unnamed = await client.call_tool("estimate_memory", {"config": trl, "config_format": "trl",
                                                             "model_config": model_config, "gpu": "RTX 4090"})
        named = await client.call_tool("estimate_memory", {"config": trl + "model_name_or_path: acme/m7\n",
                                                           "model_config": model_config, "gpu": "RTX 4090"})
    for result, name in ((unnamed, "custom model"), (named, "acme/m7")):
        assert not result.is_error, text_of(result)
        sc = result.structured_content
        assert (sc["model"], sc["model_source"], sc["plan"]["seq_len"]) == (name, "model_config", 512)


def test_recipe_keys_read_back_whatever_zlib_window_made_them():
    """A recipe key is the plan's delta, deflated with a 4 KiB window (mcp_views.RECIPE_KEY_WINDOW_BITS, cheaper to set
    up than zlib's default): it reads back as the same plan, and so does a key another server made with zlib's default
    window (zlib.decompress reads any window), including a plan with long text fields."""
    import base64
    import json as json_module
    import zlib

    plans = [TrainingPlan(model="Qwen/Qwen2.5-7B-Instruct", gpu="RTX 4090", method="qlora", seq_len=4096),
             TrainingPlan(model="Qwen/Qwen2.5-7B-Instruct", gpu="H100 SXM", num_gpus=8, sharding="zero3",
                          method="full", dataset="d" * 500, output_dir="o" * 500)]
    for plan in plans:
        key = mcp_views.recipe_key(plan)
        assert mcp_views.recipe_from_key(key) == (plan, None)
        raw = json_module.dumps(mcp_views.plan_delta(plan), separators=(",", ":"), sort_keys=True).encode()
        default_window = base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode().rstrip("=")
        assert default_window != key and mcp_views.recipe_from_key(default_window) == (plan, None)
        assert len(key) <= len(default_window) + 4  # the small window costs nothing on a plan's few hundred bytes
