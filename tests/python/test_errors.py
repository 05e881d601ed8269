"""Bad arguments and failures: a clear Python exception, never a crash, and
the client goes on working."""

from __future__ import annotations

import os
import subprocess
import sys
import socket

import pytest

import dsec
from conftest import IMAGE, Daemon


@pytest.mark.parametrize("call, exc, match", [
    (lambda c: c.run(5), TypeError, "a command is a str"),
    (lambda c: c.run(["echo", 5]), TypeError, r"argv\[1\] must be a str"),
    (lambda c: c.run([]), dsec.InvalidArgument, "argv is empty"),
    (lambda c: c.run("   "), dsec.InvalidArgument, "command is empty"),
    (lambda c: c.run(["true"], kind="vm2"), dsec.InvalidArgument, "kind 'vm2' is not one of: fncall, container"),
    (lambda c: c.run(["true"], kind=3.5), TypeError, "kind must be a str"),
    (lambda c: c.run(["true"], timeout=-1), dsec.InvalidArgument, "timeout must be a positive number"),
    (lambda c: c.run(["true"], timeout=0), dsec.InvalidArgument, "timeout must be a positive number"),
    (lambda c: c.run(["true"], timeout=float("nan")), dsec.InvalidArgument, "timeout"),
    (lambda c: c.run(["true"], timeout="2"), TypeError, "timeout is a number of seconds"),
    (lambda c: c.run(["true"], timeout=1e12), dsec.InvalidArgument, "too long"),
    (lambda c: c.run(["true"], timeout=float("inf")), dsec.InvalidArgument, "too long"),
    (lambda c: c.create(kind="fncall", lease=2**40), dsec.InvalidArgument, "lease .* too long"),
    (lambda c: c.run(["true"], memory=-5), dsec.InvalidArgument, "memory must be a positive"),
    (lambda c: c.run(["true"], stdin=5), TypeError, "stdin must be bytes or str"),
    (lambda c: c.run(["true"], env={"A": 1}), TypeError, r"env\['A'\] must be a str"),
    (lambda c: c.run(["true"], env=["A=1"]), TypeError, "env must be a dict"),
    (lambda c: c.run(["true"], limits={"timeout": 1}), dsec.InvalidArgument, "has no field 'timeout'"),
    (lambda c: c.run(["true"], limits={"pids": -1}), dsec.InvalidArgument, "pids must not be negative"),
    (lambda c: c.run(["true"], limits={"pids": 2**40}), dsec.InvalidArgument, "pids is out of range"),
    (lambda c: c.run(["true"], limits={"pids": "3"}), TypeError, "pids must be an int"),
    (lambda c: c.run(["true"], limits=[1]), TypeError, "limits must be a dict"),
    (lambda c: c.run(["true"], spec={"kind": "fncall", "bogus": 1}), dsec.InvalidArgument, "no field 'bogus'"),
    (lambda c: c.run(["true"], network=["10.1.2.3:0"]), dsec.InvalidArgument, "network entry '10.1.2.3:0'"),
    (lambda c: c.run(["true"], network=["10.1.2.3:80"]), dsec.Unimplemented, "'network' capability"),
    (lambda c: c.run([b"/bin/\xff"]), dsec.InvalidArgument, "not valid UTF-8"),
    (lambda c: c.run(["/bin/" + os.fsdecode(b"\xff")]), dsec.InvalidArgument, "not valid UTF-8"),
    (lambda c: c.run(["true"], cwd=b"/work/\xfe"), dsec.InvalidArgument, "cwd .* not valid UTF-8"),
    (lambda c: c.attach(""), dsec.InvalidArgument, "sandbox id is empty"),
    (lambda c: c.attach(None), TypeError, "must be a str"),
    (lambda c: c.attach("no-such-sandbox"), dsec.NotFound, "no-such-sandbox"),
    (lambda c: c.attach_session("no/such/session"), dsec.NotFound, "no/such/session"),
    (lambda c: c.get_image("no-such-image"), dsec.NotFound, "no-such-image"),
    (lambda c: c.create(kind="container", image="no-such-image"), dsec.Error, "no-such-image"),
    (lambda c: c.create(kind="fncall", id="Bad Id!"), dsec.InvalidArgument, "Bad Id!"),
    (lambda c: c.create(kind="fncall", detached="yes"), TypeError, "detached is True or False"),
    (lambda c: c.create(kind="fncall", lease=-3), dsec.InvalidArgument, "lease must not be negative"),
    (lambda c: c.open_session("", kind="fncall"), dsec.InvalidArgument, "session name is empty"),
    (lambda c: c.open_session("s/x", kind="fncall", sandboxes={"eval": 3}), TypeError, "sandboxes"),
    (lambda c: c.open_session("s/x", kind="fncall", sandboxes={"Bad Role": {"kind": "fncall"}}), dsec.InvalidArgument,
     "Bad Role"),
    (lambda c: c.register_image({"name": "x", "file": "/nonexistent.erofs"}), dsec.Error, "nonexistent"),
])
def test_bad_arguments_raise_a_clear_exception(client: dsec.Client, call, exc, match) -> None:
    with pytest.raises(exc, match=match):
        call(client)
    assert client.run(["echo", "still fine"]).text == "still fine\n"  # and nothing else changed


def test_bad_file_and_step_arguments(cclient: dsec.Client) -> None:
    with cclient.create(kind="container", image=IMAGE) as sb:
        for call, exc, match in [
            (lambda: sb.read_file(b"/work/\xff"), dsec.InvalidArgument, "path .* not valid UTF-8"),
            (lambda: sb.read_file("/work/" + os.fsdecode(b"\xff")), dsec.InvalidArgument, "not valid UTF-8"),
            (lambda: sb.read_file(""), dsec.InvalidArgument, "path is empty"),
            (lambda: sb.read_file("relative"), dsec.InvalidArgument, "relative"),
            (lambda: sb.read_file("/work/../../etc/passwd"), dsec.InvalidArgument, r"\.\."),
            (lambda: sb.read_file("/work/none"), dsec.NotFound, "/work/none"),
            (lambda: sb.read_file("/work/x", max_bytes=-1), dsec.InvalidArgument, "max_bytes must not be negative"),
            (lambda: sb.write_file("/work/x", 5), TypeError, "content is bytes or str"),
            (lambda: sb.write_file("/work/x", "a", mode=0o17777), dsec.InvalidArgument, "permission bits"),
            (lambda: sb.write_file("/work/x", "a", mode="644"), TypeError, "mode is an int"),
            (lambda: sb.list_files(5), TypeError, "path must be a str"),
        ]:
            with pytest.raises(exc, match=match):
                call()
        assert sb.exec("echo ok").text == "ok\n"
    s = cclient.open_session("pytest/errors/s0", kind="fncall")
    with pytest.raises(dsec.InvalidArgument, match="negative"):
        s.step(-1, "true")
    with pytest.raises(TypeError, match="step index is an int"):
        s.step("0", "true")
    with pytest.raises(TypeError, match="reward is a number"):
        s.step(0, "true", reward="high")
    with pytest.raises(dsec.InvalidArgument, match="NaN"):
        s.annotate(0, reward=float("nan"))
    with pytest.raises(dsec.Error):
        s.annotate(7, reward=1.0)  # no such step
    assert s.step(0, "echo ok").result.text == "ok\n"
    s.close()


def test_streaming_from_a_fncall_sandbox_is_unimplemented(client: dsec.Client) -> None:
    sb = client.create(kind="fncall")
    try:
        with pytest.raises(dsec.Unimplemented):
            list(sb.exec_stream(["echo", "x"]))
        assert sb.exec(["echo", "x"]).text == "x\n"
    finally:
        sb.destroy()


def test_exceptions_carry_code_and_message_and_are_a_hierarchy(client: dsec.Client) -> None:
    with pytest.raises(dsec.NotFound) as e:
        client.attach("nope-1")
    assert isinstance(e.value, dsec.Error) and isinstance(e.value, LookupError)
    assert e.value.code == "not_found" and "nope-1" in e.value.message
    assert str(e.value).startswith("not_found: ")
    assert issubclass(dsec.InvalidArgument, ValueError)
    for cls in (dsec.Unavailable, dsec.DeadlineExceeded, dsec.AlreadyExists, dsec.FailedPrecondition,
                dsec.ResourceExhausted, dsec.Internal, dsec.Unimplemented, dsec.Aborted, dsec.Unauthenticated):
        assert issubclass(cls, dsec.Error)


def test_connecting_with_a_wrong_token_or_to_nothing_fails_clearly(daemon: Daemon) -> None:
    with pytest.raises(dsec.Unauthenticated):
        dsec.Client(daemon.sdk, token="wrong-token", connect_timeout=2)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(dsec.Unavailable, match="connection refused"):
        dsec.Client(f"127.0.0.1:{port}", token="t", connect_timeout=2)
    with pytest.raises(dsec.InvalidArgument, match="not host:port"):
        dsec.Client("no-port", token="t")
    with pytest.raises(dsec.InvalidArgument, match="threads"):
        dsec.Client(daemon.sdk, data_dir=daemon.data_dir, threads=0)
    with pytest.raises(dsec.Unauthenticated, match="no SDK token"):
        dsec.Client(daemon.sdk, data_dir="/nonexistent-dsec-data")


def test_a_battery_of_bad_calls_does_not_crash_the_interpreter(daemon: Daemon) -> None:
    # In a child process, so that a crash shows as a signal, not a lost test run.
    code = r'''
import dsec, gc
c = dsec.Client()
bad = [lambda: c.run(None), lambda: c.run([None]), lambda: c.run(["x"], spec=object()),
       lambda: c.run(["x"], spec={1: 2}), lambda: c.run(["x"], spec={"env": {"a": b"\xff"}}),
       lambda: c.run(["x"], spec={"limits": {"memory_bytes": 2**70}}), lambda: c.create(spec={"kind": 99}),
       lambda: c.run(["x"], spec={"network": {"allow": "x"}}), lambda: c.run(["x"], spec={"ttl_s": True}),
       lambda: c.register_image({"name": b"\xff"}), lambda: c.run(["x"], spec=dsec.Limits())]
for i, f in enumerate(bad):
    try:
        f()
        print("no error from", i)
    except (TypeError, dsec.Error) as e:
        pass
sb = c.create(kind="fncall")
c.close()
gc.collect()
try:
    sb.exec("true")
except dsec.FailedPrecondition:
    print("closed ok")
'''
    out = subprocess.run([sys.executable, "-c", code], env=daemon.env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "closed ok\n", out.stdout + out.stderr
