"""A Python trainer against a controller with two nodes: a restartable
session goes on on the other node when its node is killed with -9 (its
steps re-run there, the log intact), and one with a step marked
not_replayable stops with an error naming that step and the node."""

from __future__ import annotations

import time
from typing import Iterator

import pytest

import dsec
from conftest import IMAGE, Daemon


@pytest.fixture
def cluster() -> Iterator[Daemon]:
    d = Daemon(image=IMAGE, nodes=2)
    yield d
    d.close()


def wait_until(pred, timeout: float, what: str) -> None:
    """Polls another process's state every 50 ms until `pred` holds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s")
        time.sleep(0.05)


def node_state(d: Daemon, node_id: str) -> str:
    for n in d.admin_command("nodes").get("nodes", []):
        if n.get("id") == node_id:
            return n.get("state", "")
    return ""


def line(i: int) -> list:
    return ["/bin/sh", "-c", "echo step $0 >> /tmp/log; cat /tmp/log", str(i)]


def test_a_restartable_session_moves_and_a_not_replayable_step_stops_it(cluster: Daemon) -> None:
    a, b = (n["id"] for n in cluster.nodes)
    with cluster.client() as c:
        # Both on node a: b drained while they open.
        assert cluster.admin_command("drain " + b).get("ok")
        moves = c.open_session("py-restart", image=IMAGE, restartable=True)
        stops = c.open_session("py-stop", image=IMAGE, restartable=True)
        assert cluster.admin_command("undrain " + b).get("ok")
        assert moves.record.restartable and moves.record.node_id == a
        assert stops.record.node_id == a
        outputs = [moves.step(i, line(i)).result.stdout for i in range(3)]
        assert outputs[2] == b"step 0\nstep 1\nstep 2\n"
        stops.step(0, line(0))
        stops.step(1, ["true"], not_replayable=True)

        cluster.kill9_node(a)
        wait_until(lambda: node_state(cluster, a) == "down", 5, f"node {a} marked down")

        def moved() -> bool:
            try:
                rec = moves.get()
            except dsec.Unavailable:  # "being restarted on node ...": its steps are being re-run
                return False
            return rec.node_id == b and rec.moves == 1

        wait_until(moved, 60, "the session re-opened on " + b)
        nxt = moves.step(3, line(3))
        assert nxt.result.stdout == b"step 0\nstep 1\nstep 2\nstep 3\n"  # its sandbox's state is back
        again = moves.step(1, line(1))
        assert again.fast_forwarded and again.result.stdout == outputs[1]  # the log reads as before
        assert len(moves.steps()) == 4

        with pytest.raises(dsec.Error) as stopped:
            stops.step(2, line(2))
        assert "not replayable" in str(stopped.value)
        assert a in str(stopped.value)
        moves.close()
        stops.close()
