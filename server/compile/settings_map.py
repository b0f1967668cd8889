"""Maps a version's flat per-platform compile settings (strings, ints, bools, as uploaded in
`metadata.platforms`) to the pipeline's settings. Pure.

Recognised keys, per platform block:
- all: `min_cosine`, `min_snr_db`, `max_abs_diff`, `min_topk_agreement`, `topk`, `margin_db`
  (overrides of the numeric gate's faithful check for whatever precision the platform
  builds); `precision_gate` ("off" default | "seed": the precision cost must meet the seed
  thresholds); `numeric_samples` (how many reference samples the numeric gate runs, default
  16); `layer_diff` ("on" default | "off": the per-layer diff against the FP32 source);
  `task` (the model's task, set by the worker: top-k is checked for "classification");
  `search_budget_seconds` (compile + gate seconds all `precision: auto` searches of one
  version may spend, default 900: the worker gives each build its share,
  server/jobs/search_budget.py; a Pipeline run alone spends it on its one build);
  `deny_ops` / `allow_ops`
  (comma-separated operator names added to / removed from the operator gate's list).
- onnx: `quantized` (keep | fp32: what a quantized upload ships, quantized_upload.py).
- coreml: `precision` (fp16 | fp32 | auto), `minimum_deployment_target`, `weight_compression`,
  `keep_ops`; with auto: `mixed`, `mixed_max_layers`, `search_candidates`.
- qnn: `precision` (int8 | w8a8 | w8a16 | w4a16 | w8a8-pt | w8a16-pt | fp16 | auto),
  `activation_bits`, `keep_float_nodes`, `quantizer` (ort | aimet | aimet-seqmse |
  aimet-adaround), `min_htp_share`, `precision_islands` (auto | off), `fp32_nodes`; with
  auto: `mixed`, `mixed_max_layers`, `search_candidates`; and the target(s): `soc` alone for
  a known SoC
  ("SM8650"), or `soc_model` + `htp_arch` (+ optional `soc` name), or `targets` =
  "SM8550,SM8650" / "SM8550:43:73,SM8650:57:75"; `target_precision` = "SM8350=int8,
  SM8650=fp16" builds each named target at its own precision (target_precision.py).
- qnn-hub: `device`, `chipset`, `target_runtime`, `options`.
"""

from __future__ import annotations

from typing import Any

from server.compile.errors import InvalidSourceError

# SoC name -> (QNN soc_model, HTP arch), from the QNN SDK's "Supported Snapdragon devices".
KNOWN_SOCS = {
    "SM8350": ("30", "68"), "SM8450": ("36", "69"), "SM8475": ("42", "69"),
    "SM8550": ("43", "73"), "SM8650": ("57", "75"), "SM8750": ("69", "79"),
    "SM8850": ("87", "81"), "SA8295": ("39", "68"),
}
NUMERIC_KEYS = ("min_cosine", "min_snr_db", "max_abs_diff", "min_topk_agreement", "topk",
                "margin_db")
TOP_LEVEL_KEYS = ("numeric_samples", "precision_gate", "task", "layer_diff",
                  "search_budget_seconds")
PRECISIONS = ("fp32", "fp16", "int8")


def _ops(value: Any) -> list[str]:
    return [v.strip() for v in str(value).split(",") if v.strip()]


def _known(name: str) -> dict[str, str]:
    try:
        soc_model, arch = KNOWN_SOCS[name.upper()]
    except KeyError:
        raise InvalidSourceError(
            f"unknown SoC {name!r}: give soc_model and htp_arch, or one of "
            f"{', '.join(sorted(KNOWN_SOCS))}") from None
    return {"name": name.upper(), "soc_model": soc_model, "htp_arch": arch}


def _qnn_targets(flat: dict[str, Any]) -> list[dict[str, str]] | None:
    if "targets" in flat:
        out = []
        for item in str(flat["targets"]).split(","):
            parts = item.strip().split(":")
            if len(parts) == 1 and parts[0]:
                out.append(_known(parts[0]))
                continue
            if len(parts) != 3 or not all(parts):
                raise InvalidSourceError(
                    f"qnn targets entry {item!r} must be a known SoC name (e.g. SM8650) or "
                    "NAME:SOC_MODEL:HTP_ARCH, e.g. SM8650:57:75")
            out.append({"name": parts[0], "soc_model": parts[1], "htp_arch": parts[2]})
        return out
    if "soc_model" in flat or "htp_arch" in flat:
        if "soc_model" not in flat or "htp_arch" not in flat:
            raise InvalidSourceError("qnn needs both soc_model and htp_arch (e.g. 57 and 75)")
        soc = str(flat["soc_model"])
        return [{"name": str(flat.get("soc", f"soc{soc}")), "soc_model": soc,
                 "htp_arch": str(flat["htp_arch"])}]
    if "soc" in flat:
        return [_known(str(flat["soc"]))]
    return None


def _with_precisions(targets: list[dict[str, str]], spec: Any) -> list[dict[str, str]]:
    if spec is None:
        return targets
    wanted = {}
    for item in str(spec).split(","):
        name, _, precision = item.strip().partition("=")
        if not precision:
            raise InvalidSourceError(f"qnn target_precision entry {item!r} must be "
                                     "SOC=precision, e.g. SM8350=int8")
        wanted[name.strip().upper()] = precision.strip().lower()
    names = {t["name"].upper() for t in targets}
    unknown = sorted(set(wanted) - names)
    if unknown:
        raise InvalidSourceError(f"qnn target_precision names {unknown}, which are not among "
                                 f"the targets {sorted(names)}")
    return [{**t, **({"precision": wanted[t["name"].upper()]}
                     if t["name"].upper() in wanted else {})} for t in targets]


def pipeline_settings(platform: str, flat: dict[str, Any]) -> dict[str, Any]:
    block = {k: v for k, v in flat.items()
             if k not in NUMERIC_KEYS and k not in TOP_LEVEL_KEYS
             and k not in ("deny_ops", "allow_ops", "targets", "soc_model", "htp_arch", "soc")}
    if platform == "qnn":
        targets = _qnn_targets(flat) or ([] if "target_precision" not in flat else
                                         [dict(_known("SM8650"))])
        block.pop("target_precision", None)
        if targets:
            block["targets"] = _with_precisions(targets, flat.get("target_precision"))
    settings: dict[str, Any] = {platform: block}
    settings.update({k: flat[k] for k in TOP_LEVEL_KEYS if k in flat})
    overrides = {k: flat[k] for k in NUMERIC_KEYS if k in flat}
    if overrides:
        settings["numeric"] = {p: dict(overrides) for p in PRECISIONS}
    gate = {}
    if "deny_ops" in flat:
        gate["deny"] = _ops(flat["deny_ops"])
    if "allow_ops" in flat:
        gate["allow"] = _ops(flat["allow_ops"])
    if gate:
        settings["operator_gate"] = gate
    return settings
