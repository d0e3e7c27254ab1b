"""Published peak-memory measurements that state their stack, scored with that stack (issue 24 item 5).

    python benchmarks/validation/score_published.py [--json] [--data benchmarks/validation/published-memory.json]

Reads published-memory.json (several sources: each row a published figure or a published OOM, its source, its stack,
the run as the source states it, and the TrainingPlan that says the same run, or why none can) and
published-litgpt.json (LitGPT's config-hub table). Every plan is estimated offline (the catalog, or a config the file
gives for a model the catalog does not hold) and compared in the published figure's own terms: max_memory_allocated
with peak_allocated_bytes, max_memory_reserved with peak_reserved_bytes, nvidia-smi (or a measure the source does not
state) with total_bytes. Error = (estimate - published) / published. A published OOM has no figure: the estimate's
verdict on the run's GPU must not be 'fits' (promise 1). Prints a markdown table, the rows that cannot be expressed
with why, and the tables left out with why; --json prints the same as JSON. The output depends on the files and the
estimator only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from functools import cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DATA = HERE / "published-memory.json"
LITGPT_DATA = HERE / "published-litgpt.json"
GIB = 2 ** 30
UNITS = {"GB": 1e9, "G": 1e9, "GiB": float(GIB)}
# The estimate's field that says what each published measure measures (published-memory.json "measures")
OURS = {"max_allocated": "peak_allocated_bytes", "max_reserved": "peak_reserved_bytes", "nvidia_smi": "total_bytes",
        "unstated": "total_bytes"}
# An estimate below a published measured peak by more than this is reported (the project's -2% bound)
UNDER_PCT = -2.0


def load(path: Path = DATA, litgpt_path: Path | None = LITGPT_DATA) -> dict:
    """published-memory.json, with published-litgpt.json's rows and exclusions added in the same form."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if litgpt_path is not None and Path(litgpt_path).exists():
        data = {**data, "rows": [*data["rows"], *_litgpt_rows(json.loads(Path(litgpt_path).read_text("utf-8")))],
                "excluded": [*data.get("excluded", []), *_litgpt_excluded(json.loads(
                    Path(litgpt_path).read_text("utf-8")))]}
    return data


def _litgpt_rows(lit: dict) -> list[dict]:
    stack = {"framework": "LitGPT finetune scripts (config_hub/finetune/<model>/<method>.yaml)",
             "versions": "LitGPT at the table's commit", "framework_value": "litgpt"}
    out = []
    for row in lit["rows"]:
        plan = dict(row["plan"])
        out.append({"id": "litgpt-config-hub-" + row["config"].replace("/", "-").removesuffix(".yaml"),
                    "source": "litgpt-config-hub", "url": lit["source"], "where": f"row '{row['config']}'",
                    "quote": f"{row['peak_gb']} GB",
                    "published": {"value": row["peak_gb"], "unit": "GB", "measure": "max_allocated"},
                    "outcome": "ran", "stack": stack,
                    "run": {"model": plan["model"], "method": plan["method"], "seq_len": plan["seq_len"],
                            "batch_size": plan["batch_size"], "gpu": "A10G", "num_gpus": 1},
                    "plan": plan, "notes": lit["measure"]})
    return out


def _litgpt_excluded(lit: dict) -> list[dict]:
    return [{"source": lit["source"], "what": e["configs"], "why": e["why"]} for e in lit.get("not_expressible", [])]


@cache
def _file_model(name: str, config_json: str):
    from canifinetune.estimator.model_sources import ResolvedModel
    from canifinetune.estimator.spec import ModelSpec

    config = json.loads(config_json)
    return ResolvedModel(name, "published-memory.json", config, ModelSpec.from_config(dict(config)))


def _estimate(plan: dict, models: dict):
    from canifinetune.estimator.estimate import estimate
    from canifinetune.estimator.plan import TrainingPlan

    model = None
    if plan["model"] in models:
        model = _file_model(plan["model"], json.dumps(models[plan["model"]], sort_keys=True))
    return estimate(TrainingPlan(**plan), model=model)


def settings(plan: dict) -> str:
    """The plan's memory-relevant settings in a few words."""
    parts = [f"seq {plan['seq_len']} x b{plan.get('batch_size', '?')}"]
    if plan.get("method") in ("lora", "qlora"):
        targets = plan.get("target_modules")
        t = "all-linear" if targets == "all-linear" else ",".join(
            x.removesuffix("_proj") for x in targets) if targets else "default"
        parts.append(f"r{plan.get('lora_r', '?')} {t}")
        if plan.get("modules_to_save"):
            parts.append("+" + ",".join(plan["modules_to_save"]))
    parts.append("gc" if plan.get("gradient_checkpointing") else "no gc")
    gpu, gpus = plan.get("gpu") or (f"{plan['gpu_vram_gb']:g} GiB" if plan.get("gpu_vram_gb") else None), \
        plan.get("num_gpus", 1)
    if gpu or gpus > 1:
        parts.append(f"{gpus} x {gpu or 'GPU'}" if gpus > 1 else gpu)
    if plan.get("sharding") and plan["sharding"] != "none":
        parts.append(plan["sharding"] + (" offload" if plan.get("offload_params") else ""))
    return ", ".join(parts)


def score_row(row: dict, models: dict) -> dict:
    """One row scored: status 'scored' (a figure, compared), 'oom' (a published OOM, the verdict checked) or
    'not_expressible' (with why)."""
    from pydantic import ValidationError

    from canifinetune.estimator.errors import CanIFinetuneError

    base = {"id": row["id"], "source": row["source"], "url": row["url"], "stack": row["stack"]["framework"],
            "stack_value": row["stack"].get("framework_value"), "model": row["run"]["model"],
            "method": row["run"]["method"], "outcome": row["outcome"], "published": row.get("published")}
    if "plan" not in row:
        return {**base, "status": "not_expressible", "why": row["not_expressible"]}
    plan = row["plan"]
    try:
        est = _estimate(plan, models)
    except (CanIFinetuneError, ValidationError) as exc:  # the plan is refused: the row cannot be said (yet)
        return {**base, "status": "not_expressible", "why": f"the plan is refused: {exc}", "plan": plan}
    out = {**base, "plan": plan, "plan_model": plan["model"], "settings": settings(plan),
           "estimate": {"peak_allocated_bytes": est.peak_allocated_bytes,
                        "peak_reserved_bytes": est.peak_reserved_bytes, "total_bytes": est.total_bytes,
                        "peak_phase": est.peak_phase, "verdict": est.verdict, "gpu": est.gpu.name if est.gpu else None,
                        "used_fraction": None if est.used_fraction is None else round(est.used_fraction, 4)}}
    if row["outcome"] == "oom":
        return {**out, "status": "oom", "fits_but_ooms": est.verdict == "fits"}
    pub = row["published"]
    measure = pub["measure"]
    if measure not in OURS:
        return {**base, "status": "not_expressible", "plan": plan,
                "why": f"the published measure ({measure}) has no estimate field to compare with"}
    published_bytes = pub["value"] * UNITS[pub["unit"]]
    ours = getattr(est, OURS[measure])
    error = 100.0 * (ours - published_bytes) / published_bytes
    return {**out, "status": "scored", "measure": measure, "compared_with": OURS[measure],
            "published_bytes": round(published_bytes), "ours_bytes": ours, "error_pct": round(error, 2),
            "underestimate": error < UNDER_PCT}


def evaluate(data: dict | None = None) -> list[dict]:
    data = data or load()
    return [score_row(row, data.get("models", {})) for row in data["rows"]]


def summary(results: list[dict]) -> dict:
    """Per source: rows, scored, OOM rows, not expressible, median and worst error, underestimates, OOMs judged fits."""
    out = {}
    for source in dict.fromkeys(r["source"] for r in results):
        rs = [r for r in results if r["source"] == source]
        scored = [r for r in rs if r["status"] == "scored"]
        errors = [r["error_pct"] for r in scored]
        out[source] = {
            "rows": len(rs), "scored": len(scored), "oom_rows": sum(r["status"] == "oom" for r in rs),
            "not_expressible": sum(r["status"] == "not_expressible" for r in rs),
            "stack_values": sorted({r["stack_value"] for r in rs if r["stack_value"]}),
            "median_error_pct": round(statistics.median(errors), 2) if errors else None,
            "median_abs_error_pct": round(statistics.median(abs(e) for e in errors), 2) if errors else None,
            "min_error_pct": min(errors) if errors else None, "max_error_pct": max(errors) if errors else None,
            "underestimates": [r["id"] for r in scored if r["underestimate"]],
            "oom_judged_fits": [r["id"] for r in rs if r["status"] == "oom" and r["fits_but_ooms"]],
        }
    return out


def _in_unit(nbytes: float, unit: str) -> str:
    return f"{nbytes / UNITS[unit]:.2f} {unit}"


def markdown(results: list[dict], excluded: list[dict]) -> str:
    lines = ["| source | stack value | model | method | settings | measure | published | ours | error |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        if r["status"] == "scored":
            unit = r["published"]["unit"]
            flag = " (under)" if r["underestimate"] else ""
            lines.append(f"| {r['source']} | {r['stack_value']} | {r['plan_model']} | {r['plan']['method']} | "
                         f"{r['settings']} | {r['measure']} | {r['published']['value']} {unit} | "
                         f"{_in_unit(r['ours_bytes'], unit)} | {r['error_pct']:+.1f}%{flag} |")
        elif r["status"] == "oom":
            e = r["estimate"]
            flag = " **fits: promise 1 broken**" if r["fits_but_ooms"] else ""
            lines.append(f"| {r['source']} | {r['stack_value']} | {r['plan_model']} | {r['plan']['method']} | "
                         f"{r['settings']} | outcome | OOM | {e['verdict']} ({e['total_bytes'] / GIB:.1f} GiB, "
                         f"{e['used_fraction']:.0%} of the GPU){flag} | - |")
    lines += ["", "Per source:", ""]
    for source, s in summary(results).items():
        err = (f"median error {s['median_error_pct']:+.1f}% (median |error| {s['median_abs_error_pct']:.1f}%, "
               f"{s['min_error_pct']:+.1f}% to {s['max_error_pct']:+.1f}%)" if s["scored"] else "no row scored")
        lines.append(f"- {source} ({', '.join(s['stack_values']) or 'no stack value'}): {s['rows']} rows, "
                     f"{s['scored']} scored, {s['oom_rows']} OOM, {s['not_expressible']} not expressible; {err}; "
                     f"{len(s['underestimates'])} below the published peak by more than {-UNDER_PCT:g}%; "
                     f"{len(s['oom_judged_fits'])} OOM judged fits")
    lines += ["", "Rows not expressed:", ""]
    for r in results:
        if r["status"] == "not_expressible":
            pub = r["published"]
            fig = f"{pub['value']} {pub['unit']}" if pub else "OOM"
            lines.append(f"- {r['id']} ({r['source']}, {fig}): {r['why']}")
    lines += ["", "Left out before rows:", ""]
    for e in excluded:
        lines.append(f"- {e['what']} ({e['source']}): {e['why']}")
    return "\n".join(lines)


DOC_HEADING = "## Published measurements"

DOC_INTRO = """\
Published GPU-memory figures of fine-tuning runs that state their stack, each scored with that stack's `framework`
value (`benchmarks/validation/published-memory.json`, commit-pinned sources with the quoted rows, and
`published-litgpt.json`; `python benchmarks/validation/score_published.py --doc docs/validation.md` rewrites this
section). Error = ours / published - 1, in the published figure's own terms: a max-allocated figure against our peak
allocated, a max-reserved one against our peak reserved, nvidia-smi or an unstated measure against our process
total; an out-of-memory row must not be judged "fits". These are other people's runs on GPUs we did not hold: their
scripts, versions and data differ from our recipe's, and what they measured is read from their text.

What they show. No published out-of-memory run is judged "fits" (8 of 8 expressible). Where the source gives max
allocated (LitGPT's tables, two Answer.AI rows) we are +0.0% to +4.3%. The misses: Answer.AI's fsdp_qlora peaks
*reserved* are up to 35.5% above our reserved figure (15 of 19 rows more than 2% under), while their allocated
figures are +0.7% and +4.3%: the gap is the caching allocator's reserve in their own training loop (which loads and
quantizes layer by layer on the GPU, and fills 24 GB cards to the edge by choice of batch size), far beyond our
allocator allowance (`ALLOCATOR_OVERHEAD_FRACTION`), which no GPU has measured for us yet; and Qwen's README
(measure and unit unstated, compared with our process total, its own model code) is up to 10.7% above us on
Qwen-1.8B LoRA. Rows we cannot express are listed with the reason; torchtune's are the largest group: its README
reports its runs with `torch.compile`, configs it does not state, its distributed recipes or "Peak Memory Active"
(torch's active-bytes peak), none of which `framework: torchtune` (its single-device recipes, cohort v19) expresses.
"""


def render_doc(results: list[dict], excluded: list[dict]) -> str:
    return f"{DOC_HEADING}\n\n{DOC_INTRO}\n{markdown(results, excluded)}\n"


def write_doc(path: Path, results: list[dict], excluded: list[dict]) -> None:
    """Replace (or append) the "Published measurements" section of ``path``, leaving the rest as it is."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    section = render_doc(results, excluded)
    start = text.find("\n" + DOC_HEADING + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + 1)
        text = text[:start + 1] + section + (text[end:] if end >= 0 else "")
    path.write_text(text, encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--litgpt-data", default=str(LITGPT_DATA))
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--doc", help="write the results as the 'Published measurements' section of this file")
    args = parser.parse_args(argv)
    data = load(Path(args.data), Path(args.litgpt_data))
    results = evaluate(data)
    if args.doc:
        write_doc(Path(args.doc), results, data.get("excluded", []))
    elif args.json:
        print(json.dumps({"results": results, "summary": summary(results), "excluded": data.get("excluded", [])},
                         indent=1, sort_keys=True, ensure_ascii=False))
    else:
        print(markdown(results, data.get("excluded", [])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
