"""The shapes of model requests: Responses tool names made flat, sampling under common names.

Two request shapes are normalised, so that the policy sees one tool name per tool
whatever the wire API:

* OpenAI Responses ``namespace`` tools (Codex groups MCP tools as ``{"type":
  "namespace", "name": "mcp__env", "tools": [...]}``) become function tools named
  ``NAMESPACE__NAME`` (``mcp__env__add``, the name Codex itself gives MCP tools), and
  earlier ``function_call`` items with a ``namespace`` get the same name
  (:func:`flat_tools`, :func:`flat_item`).
* Responses ``custom`` (freeform) tools, such as Codex's ``apply_patch``, become function
  tools taking one string argument ``input``; earlier ``custom_tool_call`` items read
  back as calls with arguments ``{"input": ...}``.

:data:`SAMPLING` reads what a request asks of the sampler, per API, under common names.
Pure functions; no threads.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["SAMPLING", "WireTool", "flat_item", "flat_tools"]

_CUSTOM_INPUT = "input"


@dataclass(frozen=True)
class WireTool:
    """How a tool offered under one flat name is spelled on the wire.

    Attributes:
        name: The tool's own name in the request (``add`` inside namespace ``mcp__env``).
        namespace: The Responses namespace that held it ("" for none).
        custom: A Responses ``custom`` (freeform) tool: its call carries raw ``input`` text.
    """

    name: str
    namespace: str = ""
    custom: bool = False


def flat_tools(tools: Any) -> tuple[list[Any], dict[str, WireTool]]:
    """A Responses request's ``tools`` with flat names, and the flat name -> wire spelling."""
    flat: list[Any] = []
    wire: dict[str, WireTool] = {}
    for tool in tools or []:
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "namespace":
            space = str(tool.get("name") or "")
            for sub in tool.get("tools") or []:
                if isinstance(sub, dict) and sub.get("type") == "function":
                    name = _flat(space, str(sub.get("name") or ""))
                    wire[name] = WireTool(str(sub.get("name") or ""), space)
                    flat.append({**sub, "name": name})
        elif tool.get("type") == "custom":
            name = str(tool.get("name") or "")
            wire[name] = WireTool(name, custom=True)
            flat.append(_custom_as_function(tool))
        else:
            flat.append(tool)
    return flat, wire


def _flat(namespace: str, name: str) -> str:
    return f"{namespace}__{name}" if namespace else name


def _custom_as_function(tool: dict[str, Any]) -> dict[str, Any]:
    grammar = tool.get("format") if isinstance(tool.get("format"), dict) else {}
    hint = "The whole input, as free text"
    if grammar and grammar.get("definition"):
        hint += f" in this {grammar.get('syntax', '')} grammar:\n{grammar['definition']}"
    return {
        "type": "function",
        "name": tool.get("name"),
        "description": tool.get("description") or "",
        "parameters": {
            "type": "object",
            "properties": {_CUSTOM_INPUT: {"type": "string", "description": hint}},
            "required": [_CUSTOM_INPUT],
        },
    }


def flat_item(item: Any) -> Any:
    """A Responses ``input`` item with a flat tool name (the item itself when it has none)."""
    if not isinstance(item, dict):
        return item
    if item.get("type") == "function_call" and item.get("namespace"):
        return {**item, "name": _flat(str(item["namespace"]), str(item.get("name") or ""))}
    if item.get("type") == "custom_tool_call":
        arguments = json.dumps({_CUSTOM_INPUT: item.get("input", "")})
        return {**item, "type": "function_call", "arguments": arguments}
    return item


# -- sampling, per wire API --------------------------------------------------------------------

# Common name -> the request's key, per API. Only keys the request carries are reported.
_ANTHROPIC_KEYS = {
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "stop": "stop_sequences",
    "tool_choice": "tool_choice",
    "thinking": "thinking",
}
_RESPONSES_KEYS = {
    "max_tokens": "max_output_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "tool_choice": "tool_choice",
    "parallel_tool_calls": "parallel_tool_calls",
    "reasoning": "reasoning",
    "top_logprobs": "top_logprobs",
}
_CHAT_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "stop": "stop",
    "seed": "seed",
    "n": "n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "logprobs": "logprobs",
    "top_logprobs": "top_logprobs",
    "tool_choice": "tool_choice",
    "parallel_tool_calls": "parallel_tool_calls",
    "reasoning": "reasoning_effort",
}
_GEMINI_KEYS = {
    "max_tokens": "maxOutputTokens",
    "temperature": "temperature",
    "top_p": "topP",
    "top_k": "topK",
    "stop": "stopSequences",
    "seed": "seed",
    "n": "candidateCount",
    "presence_penalty": "presencePenalty",
    "frequency_penalty": "frequencyPenalty",
    "thinking": "thinkingConfig",
}


def _pick(source: Any, keys: dict[str, str]) -> dict[str, Any]:
    if not isinstance(source, dict):
        return {}
    return {common: source[wire] for common, wire in keys.items() if wire in source}


def _anthropic_sampling(body: dict[str, Any]) -> dict[str, Any]:
    out = _pick(body, _ANTHROPIC_KEYS)
    output_config = body.get("output_config")
    if isinstance(output_config, dict) and "effort" in output_config:
        out["reasoning"] = {"effort": output_config["effort"]}
    return out


def _responses_sampling(body: dict[str, Any]) -> dict[str, Any]:
    return _pick(body, _RESPONSES_KEYS)


def _chat_sampling(body: dict[str, Any]) -> dict[str, Any]:
    out = _pick(body, _CHAT_KEYS)
    # max_completion_tokens replaced max_tokens; either may come.
    for key in ("max_completion_tokens", "max_tokens"):
        if key in body:
            out["max_tokens"] = body[key]
            break
    return out


def _gemini_sampling(body: dict[str, Any]) -> dict[str, Any]:
    config = body.get("generationConfig") or body.get("generation_config")
    out = _pick(config, _GEMINI_KEYS)
    tool_config = body.get("toolConfig")
    calling = tool_config.get("functionCallingConfig") if isinstance(tool_config, dict) else None
    if isinstance(calling, dict) and calling.get("mode"):
        out["tool_choice"] = calling["mode"]
    return out


#: API -> ``sampling(body)``: what the request asks of the sampler, under common names.
SAMPLING: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "anthropic": _anthropic_sampling,
    "responses": _responses_sampling,
    "chat": _chat_sampling,
    "gemini": _gemini_sampling,
}
