from pathlib import Path

import pytest

from strata import switches
from strata.errors import StrataError


def test_every_switch_is_documented():
    table = (Path(__file__).resolve().parents[1] / "docs" / "SWITCHES.md").read_text()
    for name in switches.SWITCHES:
        assert f"`{name}`" in table


def test_values_parse_by_type_and_bad_ones_are_one_line_errors(monkeypatch):
    switch = switches.SWITCHES["STRATA_PF_FUSED"]
    assert switches._parse(switch, "1") is True and switches._parse(switch, "off") is False
    with pytest.raises(StrataError, match="STRATA_PF_FUSED='maybe' is not a valid bool"):
        switches._parse(switch, "maybe")


def test_override_restores_the_previous_value():
    before = switches.get("STRATA_PF_FUSED")
    with switches.override(STRATA_PF_FUSED=not before):
        assert switches.get("STRATA_PF_FUSED") is (not before)
    assert switches.get("STRATA_PF_FUSED") is before
    with pytest.raises(KeyError):
        switches.get("STRATA_NOT_A_SWITCH")
