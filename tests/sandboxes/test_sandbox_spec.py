"""SandboxSpec validation: every error names the field, what was expected and what was given."""

from __future__ import annotations

import hashlib

import pytest

from sandboxes import SandboxSpec, SpecError
from sandboxes.spec import format_size, parse_size


def test_sizes_are_normalised_so_equal_specs_share_a_pool() -> None:
    a = SandboxSpec(image="img", memory="1g", env={"B": "2", "A": "1"})
    b = SandboxSpec(image="img", memory="1024m", env=[("A", "1"), ("B", "2")])
    assert a == b
    assert hash(a) == hash(b)
    assert a.spec_hash == b.spec_hash
    assert len({a, b}) == 1
    assert a.memory == 1 << 30
    assert a.spec_hash != SandboxSpec(image="img", memory="2g").spec_hash


def test_defaults_are_locked_down() -> None:
    spec = SandboxSpec(image="img")
    assert spec.network == "none"
    assert spec.user == "1000:1000"
    assert spec.workdir == "/workspace"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("memory", "-1", 'memory: expected a size like "512m" or "2g", got "-1"'),
        ("memory", "lots", 'memory: expected a size like "512m" or "2g", got "lots"'),
        ("workspace_size", True, 'workspace_size: expected a size like "512m" or "2g", got True'),
        ("cpus", "abc", 'cpus: expected a number, got "abc"'),
        ("cpus", 0, "cpus: expected a number of cores between 0.01 and 256, got 0"),
        ("pids", 3, "pids: expected a process limit between 32 and 1048576, got 3"),
        ("user", "0:0", 'user: expected a non-root numeric "uid:gid" like "1000:1000", got "0:0"'),
        ("user", "root", 'user: expected a non-root numeric "uid:gid" like "1000:1000", got "root"'),
        ("workdir", "relative", 'workdir: expected an absolute directory like "/workspace"'),
        ("workdir", "/proc/x", 'workdir: expected an absolute directory like "/workspace"'),
        ("env", {"1BAD": "x"}, "env: expected NAME=value pairs with NAME like FOO_BAR, got ('1BAD', 'x')"),
        ("max_lifetime_s", 5, "max_lifetime_s: expected seconds between 30 and 604800, got 5"),
        ("command_timeout_s", 0, "command_timeout_s: expected seconds above 0 and at most max_lifetime_s"),
        ("output_head", 0, "output_head + output_tail: expected between 64 bytes and capture_size"),
        ("colour", "red", "colour: expected one of the known fields"),
    ],
)
def test_invalid_fields_say_what_was_expected_and_given(field: str, value: object, message: str) -> None:
    kwargs = {"output_tail": 0} if field == "output_head" else {}
    with pytest.raises(SpecError) as caught:
        SandboxSpec(image="img", **{field: value}, **kwargs)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_network_other_than_none_is_rejected_unless_allowed() -> None:
    with pytest.raises(SpecError, match=r'network: expected "none" .*allow_network=True.*got "isolated"'):
        SandboxSpec(image="img", network="isolated")
    assert SandboxSpec(image="img", network="isolated", allow_network=True).network == "isolated"
    for forbidden in ("bridge", "host", "container:abc"):
        with pytest.raises(SpecError, match="never allowed"):
            SandboxSpec(image="img", network=forbidden, allow_network=True)


def test_missing_image() -> None:
    with pytest.raises(SpecError, match="image: expected a value"):
        SandboxSpec()  # type: ignore[call-arg]


def test_size_helpers_round_trip() -> None:
    assert parse_size("512m", field="x") == 512 << 20
    assert parse_size("1.5g", field="x") == int(1.5 * (1 << 30))
    assert parse_size(4096, field="x") == 4096
    assert format_size(512 << 20) == "512m"
    assert format_size(1000) == "1000"


@pytest.mark.parametrize("masked", [["/"], ["/proc"], ["/run"], ["/run/crucible"], ["/tmp/x"], ["/usr/lib"], ["/etc"],
                                    ["relative"], ["/a,b"], ["/a b"], ["/x:y"], [f"/d{n}" for n in range(9)], "/\0x",
                                    ["/workspace"], ["/workspace/sub"], ["/home"], [7]])
def test_a_masked_path_must_be_an_image_directory_apart_from_the_sandboxs_own(masked: object) -> None:
    with pytest.raises(SpecError) as error:
        SandboxSpec(image="x:1", masked_paths=masked)
    assert "masked_paths: expected" in str(error.value)


def test_masked_paths_are_normalised_and_a_spec_without_them_keeps_its_hash() -> None:
    spec = SandboxSpec(image="x:1", masked_paths=["/testbed/", "/opt/repo/../repo"])
    assert spec.masked_paths == ("/opt/repo", "/testbed")
    plain = SandboxSpec(image="x:1")
    before = hashlib.sha256(plain.model_dump_json(exclude={"masked_paths"}).encode()).hexdigest()[:16]
    assert plain.spec_hash == before != spec.spec_hash
