"""Which sampling `kog bench` asks for, and how the header and the JSON say which settings were in force.

By default the bench sets no sampling field, as a client that sets none: vLLM (`--generation-config auto`, its
default) then applies the model's generation_config.json (Llama 3.x Instruct: temperature 0.6, top-p 0.9;
Qwen3: temperature 0.6, top-k 20, top-p 0.95; a model whose file sets none: vLLM's temperature 1.0).
Offline, each engine process starts from vLLM's own defaults for the model (`LLM.get_default_sampling_params()`)
and lays the explicit flags over them; over HTTP the request carries only the explicit flags and the server
applies its defaults. `--greedy` is temperature 0, as a client that sends `"temperature": 0`.

Standard library only: the bench's parent process imports neither torch nor vLLM.
"""

from __future__ import annotations

from typing import Any, Mapping

# SamplingParams fields the bench can set, with vLLM's neutral value of each (a field at its neutral value
# changes nothing and is not named). The first five are those vLLM takes from a generation config.
NEUTRAL: dict[str, float] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
FIELDS = tuple(NEUTRAL)
GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS: a temperature below it is greedy decoding


def overrides(greedy: bool = False, **explicit: Any) -> dict[str, Any]:
    """The fields the bench sets itself: those given on the command line (None: not given), or temperature 0
    for --greedy."""
    unknown = set(explicit) - set(FIELDS)
    if unknown:
        raise ValueError(f"not a sampling field: {sorted(unknown)}")
    out = {k: v for k, v in explicit.items() if v is not None}
    if greedy:
        out["temperature"] = 0.0
    return out


def is_greedy(params: Mapping[str, Any]) -> bool:
    return float(params.get("temperature", 1.0)) < GREEDY_EPS


def in_force(params: Mapping[str, Any]) -> dict[str, Any]:
    """The fields that change what is drawn (not at their neutral value), in FIELDS order; greedy decoding is
    {"temperature": 0.0} (vLLM ignores top-p, top-k and min-p then)."""
    if is_greedy(params):
        out: dict[str, Any] = {"temperature": 0.0}
        skip = {"temperature", "top_p", "top_k", "min_p"}
    else:
        out, skip = {}, set()
    for k in FIELDS:
        if k in skip or k not in params or params[k] is None:
            continue
        v = params[k]
        if k == "top_k" and int(v) <= 0:
            continue
        if k == "temperature" or v != NEUTRAL[k]:
            out[k] = v
    return out


def describe(params: Mapping[str, Any]) -> str:
    """"greedy" or "temperature 0.6, top_p 0.9"."""
    shown = in_force(params)
    if is_greedy(shown):
        rest = [f"{k} {_num(v)}" for k, v in shown.items() if k != "temperature"]
        return "greedy" + (f" ({', '.join(rest)})" if rest else "")
    return ", ".join(f"{k} {_num(v)}" for k, v in shown.items())


def _num(v: Any) -> str:
    return str(v)


def _flags(over: Mapping[str, Any]) -> str:
    return ", ".join(f"--{k.replace('_', '-')} {_num(v)}" for k, v in over.items())


def request_text(settings: Mapping[str, Any]) -> str:
    """What the bench asked for, before any engine answered (settings["sampling"])."""
    greedy, over = bool(settings.get("greedy")), dict(settings.get("overrides") or {})
    if greedy:
        over.pop("temperature", None)
        return "greedy (--greedy)" + (f" with {_flags(over)}" if over else "")
    if over:
        return f"{_flags(over)} over the model's generation config"
    return "the model's generation config as vLLM applies it (no sampling field set, as a client that sets none)"


def _seed_text(seed: Any) -> str:
    return "unseeded" if seed is None else f"seed {seed}"


def model_text(settings: Mapping[str, Any], sampling: Mapping[str, Any] | None) -> str:
    """The settings in force for one model, as the engines reported them (ModelResult.sampling), e.g.
    "model generation config: temperature 0.6, top_p 0.9; unseeded"."""
    if not sampling or sampling.get("params") is None:
        return f"{request_text(settings)} (no engine reported the values in force)"
    params, gen = sampling["params"], dict(sampling.get("generation_config") or {})
    gen_text = describe({**NEUTRAL, **gen}) if gen else ""
    seed = _seed_text(sampling.get("seed"))
    if settings.get("greedy"):
        text = "greedy (--greedy)"
        if not is_greedy(params):  # cannot happen with vLLM; say so if it does
            text += f" but the engines ran {describe(params)}"
        over = {k: v for k, v in (settings.get("overrides") or {}).items() if k != "temperature"}
        if over:
            text += f" with {_flags(over)}"
        return f"{text}; {seed}"
    over = dict(settings.get("overrides") or {})
    if over:
        base = f"the model generation config: {gen_text}" if gen else "vLLM's defaults (no generation config sampling field in force)"
        return f"{describe(params)} ({_flags(over)} over {base}); {seed}"
    if gen:
        return f"model generation config: {describe(params)}; {seed}"
    return f"vLLM's defaults, no generation config sampling field in force: {describe(params)}; {seed}"


def header_lines(report_settings: Mapping[str, Any], models: list[tuple[str, Mapping[str, Any] | None]], http: bool) -> list[str]:
    """The header's sampling line(s): one when every model ran the same settings, else one per model."""
    s = report_settings.get("sampling")
    if s is None:  # a JSON written before the bench recorded its sampling: the explicit flags were all there was
        t = report_settings.get("temperature")
        if t is None:
            return []
        if not t:
            return ["sampling: greedy"]
        return [f"sampling: temperature {t} top-p {report_settings.get('top_p')} top-k {report_settings.get('top_k')}"]
    if http:
        greedy, over = bool(s.get("greedy")), dict(s.get("overrides") or {})
        sent = ", ".join(f'"{k}": {_num(v)}' for k, v in over.items())
        if s.get("seed") is not None:
            sent += (", " if sent else "") + f'"seed": {s["seed"]}'
        if greedy:
            text = f"greedy (--greedy): the requests set {sent}"
        elif sent:
            text = f"the requests set {sent}; every other field is each server's default (its model's generation config)"
        else:
            text = "each server's default: its model's generation config as vLLM applies it (the requests set no sampling field)"
        return [f"sampling: {text}"]
    texts = [(name, model_text(s, sampling)) for name, sampling in models]
    if not texts:
        return [f"sampling: {request_text(s)}; {_seed_text(s.get('seed'))}"]
    if len({t for _, t in texts}) == 1:
        return [f"sampling: {texts[0][1]}"]
    return [f"sampling ({name}): {t}" for name, t in texts]


def short_text(report_settings: Mapping[str, Any], models: list[tuple[str, Mapping[str, Any] | None]], http: bool) -> str:
    """A few words for the chart's title: "temperature 0.6, top_p 0.9 (generation config)", "greedy", ..."""
    s = report_settings.get("sampling")
    if s is None:
        t = report_settings.get("temperature")
        return "" if t is None else ("greedy" if not t else f"temperature {t}")
    over = {k: v for k, v in (s.get("overrides") or {}).items() if not (s.get("greedy") and k == "temperature")}
    if s.get("greedy"):
        return "greedy" + (f", {_flags(over)}" if over else "")
    if http:
        return f"{_flags(over)} + server defaults" if over else "server defaults (generation config)"
    texts = {describe(m["params"]) for _, m in models if m and m.get("params") is not None}
    if len(texts) != 1:
        return "per model generation config" if not over else f"{_flags(over)} over the generation config"
    return texts.pop() + ("" if over else " (generation config)")
