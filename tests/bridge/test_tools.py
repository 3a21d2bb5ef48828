"""Tests for gym_harness.bridge.tools: naming, loading, marking and sync listing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from fastmcp import FastMCP
from hypothesis import given
from hypothesis import strategies as st
from support import sample_tools

from gym_harness.bridge.tools import (
    INTERNAL_TAG,
    LOCKED_TAG,
    RESERVED_TOOL_NAMES,
    ToolSpec,
    load_tools,
    resolve_tool_conflicts,
    tool_tags,
)
from gym_harness.errors import BridgeError, ConfigError, ToolConflictError
from gym_harness.loopback.server import run_sync


def list_tool_specs(server: FastMCP) -> list[ToolSpec]:
    """Every tool of ``server``, hidden ones included, listed from synchronous code."""
    return [
        ToolSpec(t.name, t.description or "", dict(t.parameters), frozenset(t.tags))
        for t in run_sync(server.list_tools)
    ]


def served_tool_specs(server: FastMCP) -> list[ToolSpec]:
    """The tools a bridge may serve: all but the internal and reward ones."""
    return [spec for spec in list_tool_specs(server) if not spec.hidden]


# -- resolve_tool_conflicts -----------------------------------------------------------


def test_reserved_names_cover_the_env_api() -> None:
    assert {"reset", "step", "state", "close"} <= RESERVED_TOOL_NAMES


@pytest.mark.parametrize("reserved", ["reset", "step", "state", "close"])
def test_reserved_name_is_an_error_naming_the_tool(reserved: str) -> None:
    with pytest.raises(ToolConflictError, match=reserved):
        resolve_tool_conflicts(["read", reserved], ["bash"])


def test_duplicate_env_tools_are_an_error() -> None:
    with pytest.raises(ToolConflictError, match="'grep'"):
        resolve_tool_conflicts(["grep", "read", "grep"], [])


def test_clash_with_builtin_is_renamed_with_prefix() -> None:
    served = resolve_tool_conflicts(["read", "lookup"], ["read", "write"])
    assert served == {"env_read": "read", "lookup": "lookup"}


def test_custom_prefix() -> None:
    assert resolve_tool_conflicts(["bash"], ["bash"], prefix="mine_") == {"mine_bash": "bash"}


def test_rename_taken_by_another_env_tool_is_an_error() -> None:
    with pytest.raises(ToolConflictError, match=r"'read'.*'env_read'"):
        resolve_tool_conflicts(["read", "env_read"], ["read"])


def test_rename_taken_by_a_builtin_is_an_error() -> None:
    with pytest.raises(ToolConflictError, match="env_read"):
        resolve_tool_conflicts(["read"], ["read", "env_read"])


def test_empty_prefix_cannot_resolve_a_clash() -> None:
    with pytest.raises(ToolConflictError, match="read"):
        resolve_tool_conflicts(["read"], ["read"], prefix="")


_names = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)


@given(env=st.lists(_names, max_size=8), builtins=st.sets(_names, max_size=6), prefix=_names)
def test_resolution_is_a_renaming_that_avoids_builtins(
    env: list[str], builtins: set[str], prefix: str
) -> None:
    try:
        served = resolve_tool_conflicts(env, builtins, prefix=prefix)
    except ToolConflictError:
        return
    assert sorted(served.values()) == sorted(env)  # every tool exactly once
    assert not set(served) & builtins
    assert not set(served) & RESERVED_TOOL_NAMES
    for new, old in served.items():
        assert new == (prefix + old if old in builtins else old)


@given(env=st.sets(st.text(alphabet="ijkl", min_size=1, max_size=4), max_size=6))
def test_no_builtins_means_no_renames(env: set[str]) -> None:
    assert resolve_tool_conflicts(sorted(env), []) == {n: n for n in sorted(env)}


# -- load_tools and listing ---------------------------------------------------------


def test_load_a_fastmcp_server_returns_it() -> None:
    assert load_tools(sample_tools.server) is sample_tools.server


def test_load_callables_keeps_names_and_tags() -> None:
    specs = {s.name: s for s in list_tool_specs(load_tools(sample_tools.TOOLS))}
    assert set(specs) == {"echo", "add", "peek_answer", "score"}
    assert specs["peek_answer"].hidden and specs["score"].hidden
    assert not specs["echo"].hidden
    assert specs["add"].input_schema["required"] == ["a", "b"]
    assert specs["add"].description == "Add two integers."


def test_served_specs_drop_internal_and_reward() -> None:
    names = [s.name for s in served_tool_specs(load_tools(sample_tools.TOOLS))]
    assert names == ["echo", "add"]


@pytest.mark.parametrize("spec", ["support.sample_tools:TOOLS", "support.sample_tools:server"])
def test_load_import_string(spec: str) -> None:
    names = {s.name for s in served_tool_specs(load_tools(spec))}
    assert names == {"echo", "add"}


@pytest.mark.parametrize(
    "spec",
    [
        "support.sample_tools",
        "support.sample_tools:missing",
        "no_such_module_xyz:TOOLS",
        ":x",
        42,
        [1],
    ],
)
def test_bad_specs_are_config_errors(spec: object) -> None:
    with pytest.raises(ConfigError):
        load_tools(spec)


def test_duplicate_callables_are_a_conflict() -> None:
    def first() -> str:
        return "1"

    def second() -> str:
        return "2"

    second.__name__ = "first"
    with pytest.raises(ToolConflictError, match="first"):
        load_tools([first, second])


def test_tool_tags_accumulate_and_return_the_function() -> None:
    def fn() -> None:
        return None

    marked = tool_tags(LOCKED_TAG)(tool_tags(INTERNAL_TAG)(fn))
    assert marked is fn
    (spec,) = list_tool_specs(load_tools([fn]))
    assert spec.tags == {INTERNAL_TAG, LOCKED_TAG}


def test_listing_works_inside_a_running_loop() -> None:
    server = FastMCP("in-loop")

    @server.tool
    def ping() -> str:
        return "pong"

    async def jupyter_like() -> list[str]:
        return [s.name for s in list_tool_specs(server)]  # sync call, loop running

    assert asyncio.run(jupyter_like()) == ["ping"]


def test_run_sync_propagates_errors_and_bounds_the_wait() -> None:
    async def fails() -> None:
        raise KeyError("nope")

    with pytest.raises(KeyError):
        run_sync(fails)

    async def slow() -> None:
        await asyncio.sleep(0.3)

    with pytest.raises(BridgeError, match="did not finish"):
        run_sync(slow, timeout_s=0.05)
    time.sleep(0.4)  # let the private loop finish before the next test


def test_importing_the_modules_does_not_import_fastmcp() -> None:
    code = (
        "import sys, gym_harness, gym_harness.bridge.tools, gym_harness.bridge.server;"
        "sys.exit('fastmcp' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], timeout=60, check=False)
    assert done.returncode == 0
