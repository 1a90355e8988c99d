"""The version skew window between agents and the control plane (runplane/domain/versions.py)."""

from __future__ import annotations

import pytest

from runplane.domain.versions import agent_refusal, oldest_agent, series


@pytest.mark.parametrize(
    ("agent", "stack"),
    [
        ("0.1.0", "0.2.0"),  # one series older
        ("0.1.0", "0.2.7"),
        ("0.1.9", "0.2.0"),
        ("0.2.0", "0.2.0"),
        ("0.2.3", "0.2.0"),  # a later patch of the same series
        ("0.2.0.dev1", "0.2.0"),  # a development build of the series
        ("0.2.0+local", "0.2.1rc1"),
        ("1.0.0", "1.0.0"),
        ("0.9.0", "0.9.0.dev2"),
    ],
)
def test_agents_of_the_stacks_series_or_the_one_before_are_allowed(agent: str, stack: str) -> None:
    assert agent_refusal(agent, stack) is None


@pytest.mark.parametrize(
    ("agent", "stack", "reason"),
    [
        ("0.0.9", "0.2.0", "agent 0.0.9 is older than this stack allows (>= 0.1)"),
        ("0.4.2", "0.6.0", "agent 0.4.2 is older than this stack allows (>= 0.5)"),
        ("0.3.0", "0.2.5", "agent 0.3.0 is newer than this stack (0.2.5): upgrade the functions first"),
        ("0.7.0", "0.6.1", "agent 0.7.0 is newer than this stack (0.6.1): upgrade the functions first"),
        ("0.3.0.dev1", "0.2.0", "agent 0.3.0.dev1 is newer than this stack (0.2.0): upgrade the functions first"),
        ("1.0.0", "0.9.0", "agent 1.0.0 is newer than this stack (0.9.0): upgrade the functions first"),
        ("0.9.0", "1.0.0", "agent 0.9.0 is older than this stack allows (>= 1.0)"),  # no skew across a major
        ("0.10.0", "0.12.1", "agent 0.10.0 is older than this stack allows (>= 0.11)"),  # numbers, not text
    ],
)
def test_agents_outside_the_window_are_refused_with_the_reason(agent: str, stack: str, reason: str) -> None:
    assert agent_refusal(agent, stack) == reason


def test_the_stack_may_say_its_own_oldest_agent() -> None:
    """An agent applies the window its stack states (a later policy may widen or narrow it)."""
    assert agent_refusal("0.4.0", "0.6.0", oldest="0.4") is None
    assert agent_refusal("0.5.0", "0.6.0", oldest="0.6") == "agent 0.5.0 is older than this stack allows (>= 0.6)"
    assert agent_refusal("0.4.0", "0.6.0", oldest="") == "agent 0.4.0 is older than this stack allows (>= 0.5)"


@pytest.mark.parametrize(("agent", "stack"), [("", "0.2.0"), ("0.2.0", ""), ("unknown", "0.2.0"), ("0", "0.2.0")])
def test_a_version_without_a_series_is_not_refused(agent: str, stack: str) -> None:
    assert agent_refusal(agent, stack) is None


def test_series_and_the_oldest_agent_of_a_stack() -> None:
    assert series("0.2.0") == (0, 2)
    assert series("v1.12.3.post1") == (1, 12)
    assert series("0.2") == (0, 2)
    assert series("") is None and series("0") is None and series("dev") is None
    assert oldest_agent("0.2.5") == "0.1"
    assert oldest_agent("1.0.0") == "1.0"
    assert oldest_agent("") == ""
