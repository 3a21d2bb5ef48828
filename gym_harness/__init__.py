"""gym_harness: agentic harnesses (Claude Code, Codex, ACP agents, any line-protocol
command) as Gymnasium environments.

Importing the package registers the env ids (``gym_harness/Reference-v0``,
``gym_harness/Command-v0``, ``gym_harness/ClaudeCode-v0`` ...) and stays cheap:
fastmcp is imported only when an env first starts its MCP bridge.

Example:
    >>> import gymnasium, gym_harness
    >>> env = gymnasium.make("gym_harness/Reference-v0")
"""

from __future__ import annotations

import importlib
import typing

from gym_harness.bridge.tools import (
    RESERVED_TOOL_NAMES,
    ToolSpec,
    resolve_tool_conflicts,
    tool_tags,
)
from gym_harness.config import DEFAULT_INHERIT_ENV, HarnessConfig, ProcessSpec, TurnLimits
from gym_harness.env import HarnessEnv
from gym_harness.errors import (
    BridgeError,
    CallbackError,
    CaptureError,
    ConfigError,
    ForkDiverged,
    ForkError,
    ForkFailed,
    ForkUnsupported,
    HarnessCrashed,
    HarnessError,
    HarnessStartError,
    PolicyError,
    ProtocolError,
    ToolConflictError,
    TurnTimeout,
    WorkerLost,
)
from gym_harness.harnesses.base import EpisodeContext, Feed, Harness, HarnessSession, Launch
from gym_harness.harnesses.line import CommandHarness, ReferenceHarness
from gym_harness.harnesses.registry import HARNESSES, harness_class
from gym_harness.lifecycle import Lifecycle, Liveness
from gym_harness.outcome import Outcome
from gym_harness.policies.chat_completions import ChatCompletionsPolicy
from gym_harness.process.harness_process import HarnessProcess, ProcessUsage
from gym_harness.readiness import start_ready
from gym_harness.records.chat_format import (
    exchange_messages,
    exchange_records,
    exchange_tools,
    llm_exchanges,
)
from gym_harness.records.events import EventType, HarnessEvent, TurnResult
from gym_harness.records.exchanges import ModelExchange, SSEEvent, TokenLogprob, ToolCallRecord
from gym_harness.records.training import record_trace
from gym_harness.records.trajectory import RewardContext, RewardFn, StepInfo, Trajectory, TurnRecord
from gym_harness.registration import register_envs
from gym_harness.spaces.text import UnicodeText
from gym_harness.tasks import Task, load_tasks
from gym_harness.training.chain import TokenChain
from gym_harness.vector.async_env import HarnessVectorEnv
from gym_harness.vector.factory import make_vector_env

if typing.TYPE_CHECKING:
    from gym_harness.bridge.server import MCPBridge, ToolCallResult
    from gym_harness.capture.proxy import ModelProxy

__version__ = "0.1.0"

# The bridge and the model proxy import asyncio, and with it ssl and concurrent.futures:
# a sixth of this package's import time. Their names load on first use (PEP 562).
_LAZY = {
    "MCPBridge": "gym_harness.bridge.server",
    "ModelProxy": "gym_harness.capture.proxy",
    "ToolCallResult": "gym_harness.bridge.server",
}


def __getattr__(name: str) -> typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gym_harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BridgeError",
    "CallbackError",
    "CaptureError",
    "ChatCompletionsPolicy",
    "CommandHarness",
    "ConfigError",
    "DEFAULT_INHERIT_ENV",
    "EpisodeContext",
    "EventType",
    "Feed",
    "ForkDiverged",
    "ForkError",
    "ForkFailed",
    "ForkUnsupported",
    "HARNESSES",
    "Harness",
    "HarnessConfig",
    "HarnessCrashed",
    "HarnessEnv",
    "HarnessError",
    "HarnessEvent",
    "HarnessProcess",
    "HarnessSession",
    "HarnessStartError",
    "HarnessVectorEnv",
    "Launch",
    "Lifecycle",
    "Liveness",
    "MCPBridge",
    "ModelExchange",
    "ModelProxy",
    "Outcome",
    "PolicyError",
    "ProcessSpec",
    "ProcessUsage",
    "ProtocolError",
    "RESERVED_TOOL_NAMES",
    "ReferenceHarness",
    "RewardContext",
    "RewardFn",
    "SSEEvent",
    "StepInfo",
    "Task",
    "TokenChain",
    "TokenLogprob",
    "ToolCallRecord",
    "ToolCallResult",
    "ToolConflictError",
    "ToolSpec",
    "Trajectory",
    "TurnLimits",
    "TurnRecord",
    "TurnResult",
    "TurnTimeout",
    "UnicodeText",
    "WorkerLost",
    "__version__",
    "exchange_messages",
    "exchange_records",
    "exchange_tools",
    "harness_class",
    "llm_exchanges",
    "load_tasks",
    "make_vector_env",
    "record_trace",
    "register_envs",
    "resolve_tool_conflicts",
    "start_ready",
    "tool_tags",
]

register_envs()
