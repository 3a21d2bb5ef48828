"""The env ids gym_harness registers with gymnasium (import is cheap)."""

from __future__ import annotations

from pathlib import Path

import gymnasium

__all__ = ["register_envs"]

_DATA = Path(__file__).resolve().parent / "data"
_ENTRY = "gym_harness.env:HarnessEnv"
_VECTOR = "gym_harness.vector.factory:make_vector_env"
#: Envs whose entry points are not ``HarnessEnv``'s: id -> (entry point, vector entry point).
_ENTRIES = {
    "gym_harness/BFCL-v0": (
        "gym_harness.suites.bfcl:BFCLEnv",
        "gym_harness.suites.bfcl.vector:make_vector_env",
    )
}

#: id -> (kwargs, max_episode_steps, nondeterministic)
ENV_IDS: dict[str, tuple[dict[str, object], int | None, bool]] = {
    "gym_harness/Reference-v0": (
        {
            "harness": "reference",
            "tools": "gym_harness.agents.demo:DEMO_TOOLS",
            "tasks": str(_DATA / "demo_tasks.jsonl"),
            "reward_fn": "gym_harness.agents.demo:demo_reward",
        },
        20,
        True,  # replies are deterministic, but info carries timings and episode ids
    ),
    "gym_harness/Command-v0": ({"harness": "command"}, None, True),
    "gym_harness/ClaudeCode-v0": ({"harness": "claude_code"}, None, True),
    "gym_harness/Codex-v0": ({"harness": "codex"}, None, True),
    "gym_harness/OpenCode-v0": ({"harness": "opencode"}, None, True),
    "gym_harness/QwenCode-v0": ({"harness": "qwen_code"}, None, True),
    "gym_harness/GeminiCLI-v0": ({"harness": "gemini_cli"}, None, True),
    "gym_harness/ACP-v0": ({"harness": "acp"}, None, True),
    # BFCL v4 multi-turn (gym_harness.suites.bfcl; needs the extra gym_harness[bfcl]).
    "gym_harness/BFCL-v0": ({"category": "base", "harness": "reference"}, None, True),
}


def register_envs() -> None:
    """Register every gym_harness env id (idempotent)."""
    for env_id, (kwargs, max_steps, nondeterministic) in ENV_IDS.items():
        if env_id in gymnasium.registry:
            continue
        entry_point, vector_entry_point = _ENTRIES.get(env_id, (_ENTRY, _VECTOR))
        gymnasium.register(
            id=env_id,
            entry_point=entry_point,
            vector_entry_point=vector_entry_point,
            kwargs=kwargs,
            max_episode_steps=max_steps,
            nondeterministic=nondeterministic,
        )
