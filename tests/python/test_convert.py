"""Python values to dsec's protobuf messages and back (no dsecd needed)."""

from __future__ import annotations

import pytest

import dsec
from dsec import _core


def rt(type_name: str, value):
    return _core._roundtrip("dsec.v1." + type_name, value)


def test_numbers_keep_their_whole_range() -> None:
    got = rt("Limits", {"memory_bytes": 2**64 - 1, "pids": 2**32 - 1, "timeout_ms": 0})
    assert isinstance(got, dsec.Limits)
    assert (got.memory_bytes, got.pids, got.timeout_ms, got.cpu_millis) == (2**64 - 1, 2**32 - 1, 0, 0)
    assert rt("SandboxRecord", {"created_ms": -5}).created_ms == -5
    assert rt("ExecResult", {"exit_code": -(2**31)}).exit_code == -(2**31)
    with pytest.raises(dsec.InvalidArgument, match="memory_bytes is out of range"):
        rt("Limits", {"memory_bytes": 2**64})
    with pytest.raises(dsec.InvalidArgument, match="pids is out of range"):
        rt("Limits", {"pids": 2**32})
    with pytest.raises(dsec.InvalidArgument, match="must not be negative"):
        rt("Limits", {"pids": -1})
    with pytest.raises(dsec.InvalidArgument, match="out of range"):
        rt("ExecResult", {"exit_code": 2**31})
    with pytest.raises(TypeError, match="must be an int, not bool"):
        rt("Limits", {"pids": True})
    with pytest.raises(TypeError, match="must be an int, not float"):
        rt("Limits", {"pids": 1.5})


def test_enums_strings_bytes_maps_lists_and_optionals() -> None:
    spec = rt("SandboxSpec", {"kind": "CONTAINER", "isolation": 3, "env": {"A": "b"}, "ttl_s": 0,
                              "network": {"mode": "allow", "allow": ["h:1"], "expose": [8080]}})
    assert (spec.kind, spec.isolation, spec.env, spec.ttl_s, spec.idle_timeout_s) == (
        "container", "kernel", {"A": "b"}, 0, None)  # ttl_s set to 0 is not unset
    assert (spec.network.mode, spec.network.allow, spec.network.expose) == ("allow", ["h:1"], [8080])
    assert spec.limits == dsec.Limits(**spec.limits.__dict__)
    assert rt("SandboxSpec", {"kind": "kind_vm"}).kind == "vm"
    # 0 is "unspecified" (the node's default), as records read back say it.
    assert rt("SandboxSpec", {"kind": 0}).kind == "unspecified"
    assert rt("SandboxSpec", rt("SandboxSpec", {})).to_dict() == rt("SandboxSpec", {}).to_dict()
    with pytest.raises(dsec.InvalidArgument, match="not one of"):
        rt("SandboxSpec", {"kind": 99})
    req = rt("ExecRequest", {"argv": ("a", b"b"), "stdin": bytearray(b"\x00\xff"), "env": {}})
    assert (req.argv, req.stdin) == (["a", "b"], b"\x00\xff")
    assert rt("ExecRequest", {"stdin": memoryview(b"xy")}).stdin == b"xy"
    with pytest.raises(dsec.InvalidArgument, match="not contiguous"):
        rt("ExecRequest", {"stdin": memoryview(b"abcd")[::2]})
    with pytest.raises(dsec.InvalidArgument, match="too large for a double"):
        rt("StepMeta", {"reward": 10**400})
    with pytest.raises(TypeError, match="must be a list"):
        rt("ExecRequest", {"argv": "ls"})
    with pytest.raises(TypeError, match=r"key 1 must be a str"):
        rt("ExecRequest", {1: "x"})
    with pytest.raises(TypeError, match="must be True or False"):
        rt("WriteFileRequest", {"make_parents": 1})
    with pytest.raises(TypeError, match="must be a dict"):
        rt("SandboxSpec", {"limits": 5})
    assert rt("StepMeta", {"reward": 1}).reward == 1.0 and rt("StepMeta", {}).reward is None
    with pytest.raises(TypeError, match="must be a number"):
        rt("StepMeta", {"reward": "1"})


def test_records_go_in_where_dicts_do() -> None:
    lim = dsec.Limits(memory_bytes=5)
    assert rt("SandboxSpec", {"limits": lim}).limits.memory_bytes == 5
    with pytest.raises(TypeError):
        rt("SandboxSpec", {"limits": dsec.HostPort(host="x")})
    with pytest.raises(TypeError, match="must be a dict"):
        rt("SandboxSpec", dsec.Limits)


def test_hostile_values_to_the_extension_itself_fail_cleanly() -> None:
    with pytest.raises(dsec.InvalidArgument, match="pids is out of range"):
        rt("Limits", {"pids": 10**5000})  # its str() is refused: said without it
    with pytest.raises(TypeError):
        _core._drain(None)

    fields = {"pids": 1, "timeout_ms": 2}

    class Sneaky:
        def __index__(self) -> int:
            fields.clear()  # changes the dict being read
            return 3

    fields["cpu_millis"] = Sneaky()
    got = rt("Limits", fields)
    assert got.cpu_millis == 3
