"""``understudy.wire.settings``: flags > UNDERSTUDY_* environment > defaults; unknown warned."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from understudy.wire.settings import resolve, warn_unknown


class _Demo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    port: int = Field(8000, ge=0, lt=65536)
    run_dir: Path = Path("runs/x")
    token: str | None = None
    capacity: dict[str, float] = Field(default_factory=dict)


PREFIX = "UNDERSTUDY_CONTROLLER_"


@pytest.mark.parametrize(("flags", "environ", "port"), [
    ({}, {}, 8000),                                                   # default
    ({}, {"UNDERSTUDY_CONTROLLER_PORT": "9000"}, 9000),               # environment
    ({"port": 7000}, {"UNDERSTUDY_CONTROLLER_PORT": "9000"}, 7000),   # flag wins
    ({"port": None}, {"UNDERSTUDY_CONTROLLER_PORT": "9000"}, 9000),   # None = not given
])
def test_precedence_is_flag_then_environment_then_default(
        flags: dict[str, object], environ: dict[str, str], port: int) -> None:
    assert resolve(_Demo, flags, PREFIX, environ=environ).port == port


def test_a_field_may_read_a_shared_variable_and_mappings_take_json() -> None:
    settings = resolve(_Demo, {}, PREFIX, env_names={"token": "UNDERSTUDY_TOKEN"},
                       environ={"UNDERSTUDY_TOKEN": "s3cret",
                                "UNDERSTUDY_CONTROLLER_CAPACITY": '{"memory_mb": 512}'})
    assert settings.token == "s3cret"
    assert settings.capacity == {"memory_mb": 512.0}


def test_environment_values_are_validated_like_flags() -> None:
    with pytest.raises(ValidationError):
        resolve(_Demo, {}, PREFIX, environ={"UNDERSTUDY_CONTROLLER_PORT": "70000"})


def test_unknown_variables_are_warned_but_other_processes_and_known_ones_are_not(
        caplog: pytest.LogCaptureFixture) -> None:
    environ = {"UNDERSTUDY_CONTROLLER_PROT": "1",       # a typo of this process's own
               "UNDERSTUDY_SOLVR": "cbc",               # nobody's
               "UNDERSTUDY_AGENT_HEARTBEAT_MS": "20",   # the agent's business
               "UNDERSTUDY_TRITON_BIN": "/x",           # read elsewhere
               "UNDERSTUDY_CONTROLLER_PORT": "1", "HOME": "/root"}
    with caplog.at_level(logging.WARNING):
        unknown = warn_unknown(_Demo, PREFIX, {}, environ)
    assert unknown == ["UNDERSTUDY_CONTROLLER_PROT", "UNDERSTUDY_SOLVR"]
    assert "UNDERSTUDY_SOLVR" in caplog.text
