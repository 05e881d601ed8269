"""Rollout state outlives the trainer and dsecd: a Python trainer killed with
SIGKILL mid-rollout and started again replays from step 0 and goes on; a
dsecd restart mid-call raises dsec.Unavailable and the next call works."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import dsec
from conftest import IMAGE, SOURCE, Daemon

def wait_for_process(argv, timeout: float = 30) -> None:
    """Until a process runs with exactly `argv` (fncall runs are host processes)."""
    want = ("\0".join(argv) + "\0").encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if f.read() == want:
                            return
                except OSError:
                    pass  # it exited meanwhile
        time.sleep(0.02)  # polling another process's state
    pytest.fail(f"no process {argv} within {timeout} s")


EXAMPLE = os.path.join(SOURCE, "sdk", "python", "examples", "rollouts.py")


def test_a_trainer_killed_with_sigkill_replays_and_goes_on(container_daemon: Daemon) -> None:
    rollouts, steps = 6, 5
    args = [sys.executable, EXAMPLE, "--rollouts", str(rollouts), "--steps", str(steps), "--job", "pytest-kill",
            "--image", IMAGE, "--verbose", "--keep"]
    first = subprocess.Popen(args, env=container_daemon.env(), stdout=subprocess.PIPE, text=True)
    ran_before = 0
    for line in first.stdout:
        ran_before += line.endswith(" ran\n")
        if ran_before >= rollouts * 2:  # mid-rollout: about two steps each
            break
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert first.returncode == -signal.SIGKILL

    second = subprocess.run(args, env=container_daemon.env(), capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr  # every reward 1.0: no step ran twice
    replayed = second.stdout.count(" replayed\n")
    ran = second.stdout.count(" ran\n")
    assert replayed >= ran_before  # what the log had was answered from it
    assert replayed + ran == rollouts * steps
    assert "mean reward 1.00" in second.stdout
    with container_daemon.client() as c:
        for i in range(rollouts):
            s = c.attach_session(f"pytest-kill/r{i}")
            logged = s.steps()
            assert [st.index for st in logged] == list(range(steps))
            assert logged[-1].meta.reward == 1.0
            assert s.sandbox().read_file("/work/attempts").count(b"attempt") == steps - 2  # each ran once
            s.close()


def test_a_dsecd_restart_mid_call_raises_unavailable_and_the_next_call_works(own_daemon: Daemon) -> None:
    c = own_daemon.client()
    outcome = {}

    def long_call() -> None:
        try:
            outcome["result"] = c.run(["sleep", "29.5"])
        except dsec.Error as e:
            outcome["error"] = e

    t = threading.Thread(target=long_call)
    t.start()
    wait_for_process(["sleep", "29.5"])  # the run has reached its sandbox
    own_daemon.kill9()
    t.join(timeout=60)
    assert not t.is_alive()
    assert isinstance(outcome.get("error"), dsec.Unavailable), outcome
    own_daemon.restart()
    r = c.run(["echo", "again"])
    assert r.text == "again\n" and c.connections == 2
    c.close()


def test_async_calls_in_flight_when_dsecd_restarts(own_daemon: Daemon) -> None:
    async def main() -> None:
        async with own_daemon.async_client() as c:
            s = await c.open_session("pytest/restart/s0", kind="container", image=IMAGE)
            await s.step(0, "echo kept > /work/k")
            calls = [asyncio.ensure_future(c.run(["sleep", "29.25"])) for _ in range(5)]
            await asyncio.get_running_loop().run_in_executor(None, wait_for_process, ["sleep", "29.25"])
            own_daemon.restart()  # SIGTERM, then start again
            done = await asyncio.gather(*calls, return_exceptions=True)
            # dsecd closes its connections before it stops the runs: each
            # call in flight is lost with the connection, and says so.
            for d in done:
                assert isinstance(d, dsec.Unavailable), d
                assert "lost while the request was in flight" in str(d), d
            # The session and its sandbox outlived dsecd; the log too.
            again = await c.attach_session("pytest/restart/s0")
            assert (await again.step(0, "echo kept > /work/k")).replayed
            assert (await again.step(1, "cat /work/k")).result.text == "kept\n"
            await again.close()

    asyncio.run(main())
