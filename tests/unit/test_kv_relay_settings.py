"""The KV relay's settings and command: bad input named, upstream relays given."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from cli.app import main
from router.kv_relay.settings import KVRelaySettings, KVRelaySource
from router.settings import ServiceSettings


@pytest.mark.parametrize(
    "endpoint", ["tcp://host", "tcp://host:0", "tcp://host:70000", "udp://h:1", "ipc://", "h:1"]
)
def test_bad_endpoints_are_refused(endpoint: str) -> None:
    with pytest.raises(ValidationError, match="publish_endpoint"):
        KVRelaySettings(publish_endpoint=endpoint)


def test_a_relay_source_needs_a_port_and_instances_and_an_instance_one_relay() -> None:
    with pytest.raises(ValidationError, match="needs its port"):
        KVRelaySource(endpoint="tcp://b:*", instances=["md0"])
    with pytest.raises(ValidationError, match="at least 1"):
        KVRelaySource(endpoint="tcp://b:5600", instances=[])
    for bad in ("md 0", "md0\n"):
        with pytest.raises(ValidationError, match="not an instance id"):
            KVRelaySource(endpoint="tcp://b:5600", instances=[bad])
    one = {"endpoint": "tcp://b:5600", "instances": ["md0", "md1"]}
    two = {"endpoint": "tcp://c:5600", "instances": ["md1"]}
    with pytest.raises(ValidationError, match="'md1' is listed by two KV relays"):
        ServiceSettings.model_validate({"kv_relays": [one, two]})


def test_the_command_names_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    instances = tmp_path / "instances.json"
    instances.write_text('[{"instance_id": "md0", "tier": "md", "url": "http://b:1"}]')
    cases = [
        ([], "give --instances (or PDD_ROUTER_RELAY__INSTANCES_FILE), or relays to forward"),
        (["--instances", "nowhere.json"], "nowhere.json does not exist"),
        (["--instances", str(instances), "--publish", "tcp://b"], "--publish: Value error"),
        (["--instances", str(instances), "--replay", "tcp://*:1", "--no-replay"], "not both"),
        (["--instances", str(instances)], "no instance has a kv_events_endpoint"),
        (["--upstream", "[{endpoint"], "--upstream is not valid JSON"),
        (["--upstream", '[{"instances": ["md0"]}]'], "--upstream: Field required"),
    ]
    for args, message in cases:
        assert main(["kv-relay", *args]) == 2
        assert message in capsys.readouterr().err


def test_upstream_relays_come_from_the_command_line() -> None:
    from cli.kv_relay_cmd import _settings

    given = (
        '[{"endpoint": "tcp://b:5600", "replay_endpoint": "tcp://b:5601", "instances": ["md0"]}]'
    )
    upstream = _settings(None, None, None, None, None, False, given).relay.upstream
    assert [(u.endpoint, u.replay_endpoint, list(u.instances)) for u in upstream] == [
        ("tcp://b:5600", "tcp://b:5601", ["md0"])
    ]
