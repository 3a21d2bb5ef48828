"""Every setting is a ``HarnessConfig`` field: ``HarnessEnv``'s own keywords are its
components (code and objects), and each keyword it took before still works."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

from gym_harness import ConfigError, HarnessConfig, HarnessEnv
from gym_harness.rollout.keywords import config_fields, env_keywords

#: ``HarnessEnv``'s keywords that are code or objects, not values a config can hold.
COMPONENTS = {"harness", "tools", "reward_fn", "tasks", "render_mode", "on_event", "user_fn"}
#: The keywords ``HarnessEnv`` took by name before the settings moved into the config.
EARLIER_KEYWORDS = {
    *COMPONENTS,
    "workspace",
    "keep_workspace",
    "tool_prefix",
    "tool_timeout_s",
    "capture",
    "upstream",
    "upstream_api_key_env",
    "request_logprobs",
    "mode",
    "policy_timeout_s",
    "model_calls",
}


def test_every_keyword_but_the_components_is_a_config_field() -> None:
    fields = {field.name for field in dataclasses.fields(HarnessConfig)}
    own = set(inspect.signature(HarnessEnv).parameters) - {"kwargs"}
    assert own - {"config"} == COMPONENTS
    assert fields >= EARLIER_KEYWORDS - COMPONENTS
    # The generated reference lists exactly the fields, and the env's own keywords.
    assert {k.name for k in config_fields()} == fields
    assert {k.name for k in env_keywords()} == own


def test_the_moved_settings_reach_the_config(tmp_path: Path) -> None:
    env = HarnessEnv(
        "reference",
        workspace=tmp_path,
        keep_workspace=True,
        tool_prefix="x_",
        tool_timeout_s=5.0,
        mode="model",
        policy_timeout_s=7.0,
        model_calls="all",
    )
    try:
        config = env.config
        assert (config.workspace, config.keep_workspace) == (str(tmp_path), True)
        assert (config.tool_prefix, config.tool_timeout_s) == ("x_", 5.0)
        assert (config.mode, config.policy_timeout_s, config.model_calls) == ("model", 7.0, "all")
        assert HarnessConfig.from_dict(config.to_dict()) == config
    finally:
        env.close()


def test_a_whole_config_is_a_starting_point() -> None:
    base = HarnessConfig(turn_timeout_s=11.0, tool_timeout_s=3.0)
    env = HarnessEnv("command", config=base.replace(command=["cat"]), idle_timeout_s=4.0)
    try:
        assert (env.config.turn_timeout_s, env.config.tool_timeout_s) == (11.0, 3.0)
        assert env.config.idle_timeout_s == 4.0
    finally:
        env.close()


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"mode": "turn"}, "mode must be one of"),
        ({"model_calls": "side"}, "model_calls must be one of"),
        ({"mode": "model", "capture": True}, "drop capture=True"),
        ({"capture": True}, "needs upstream="),
        ({"capture_tokens": True}, "needs capture=True"),
        ({"tool_timeout_s": 0}, "tool_timeout_s must be a positive number"),
        ({"policy_timeout_s": -1.0}, "policy_timeout_s must be a positive number"),
        ({"keep_workspace": "yes"}, "keep_workspace must be a bool"),
        ({"tool_prefix": 3}, "tool_prefix must be a str"),
    ],
)
def test_a_bad_setting_says_what_to_fix(settings: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        HarnessConfig(**settings)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=says):
        HarnessEnv("reference", **settings)
