"""Stock model-mode policies: callables that answer a harness's model calls.

This part owns policies a user need not write: :class:`ChatCompletionsPolicy` sends each
model call (the normalised request model mode observes: messages, tools, sampling) to any
OpenAI-compatible chat-completions server (vLLM, llama.cpp, SGLang, a hosted API) and
returns the server's answer as the action. Every harness then runs against that server,
whatever its own wire API (Anthropic Messages, Responses, Gemini).

A policy keeps only its configuration in its state (it pickles to a Ray actor); its HTTP
client is made on first use. It imports nothing of the env or the rollout: a rollout
hands it requests, and it returns actions.
"""

from __future__ import annotations

from gym_harness.policies.chat_completions import ChatCompletionsPolicy

__all__ = ["ChatCompletionsPolicy"]
