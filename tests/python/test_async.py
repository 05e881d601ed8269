"""dsec.AsyncClient: every call as a coroutine, 1 000 concurrent calls from
one thread, cancellation; and the blocking client's calls release the GIL."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import pytest

import dsec
from dsec import _core
from conftest import IMAGE, Daemon


def threads_now() -> int:
    """This process's threads, the SDK's native ones included."""
    return len(os.listdir("/proc/self/task"))


def test_a_thousand_concurrent_runs_from_one_thread(daemon: Daemon) -> None:
    async def main() -> None:
        async with daemon.async_client() as c:
            before = threads_now()
            calls = [asyncio.ensure_future(c.run(["/bin/echo", str(i)])) for i in range(1000)]
            during = threads_now()  # all 1 000 issued, most still in flight
            rs = await asyncio.gather(*calls)
            assert [r.text for r in rs] == [f"{i}\n" for i in range(1000)]
            assert all(r.verdict == "ok" for r in rs)
            assert during == before == threads_now()  # no thread per call

    asyncio.run(main())


def test_every_async_call(container_daemon: Daemon) -> None:
    async def main() -> None:
        async with container_daemon.async_client() as c:
            assert c.connected and c.connections == 1 and len(c.client_id) == 32
            r = await c.run("echo $X", env={"X": "y"}, timeout=5)
            assert r.text == "y\n"
            async with await c.create(kind="container", image=IMAGE, labels={"case": "async"}) as sb:
                assert (await sb.get()).phase == "running"
                await sb.write_file("/work/a.txt", "one\n", make_parents=True)
                assert await sb.read_file("/work/a.txt") == b"one\n"
                assert "a.txt" in [e.name for e in (await sb.list_files("/work")).entries]
                assert (await sb.make_dir("/work/m", user="1234")).uid == 1234
                await sb.move("/work/m", "/work/n2")
                assert (await sb.exec("stat -c %u /work/n2", user="user")).text == "1234\n"
                await sb.remove("/work/n2")
                execs = await asyncio.gather(*(sb.exec(["sh", "-c", f"echo {i} >> /work/n"]) for i in range(20)))
                assert all(e.ok for e in execs)
                assert len((await sb.read_file("/work/n")).splitlines()) == 20
                stream = sb.exec_stream(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.05; done"])
                got = [chunk.data async for chunk in stream]
                assert b"".join(got) == b"1\n2\n3\n" and stream.result.exit_code == 0
                # Processes by pid: listed, given input, attached to, their stdin closed.
                reader = sb.exec_stream(["sh", "-c", "read l; echo got $l; cat"], interactive=True)
                procs = await sb.processes()
                for _ in range(100):
                    if procs:
                        break
                    procs = await sb.processes()
                (pid,) = [p.pid for p in procs if p.stdin_open]
                following = sb.attach(pid)
                await sb.send_input(pid, "x\n")
                await sb.close_stdin(pid)
                assert b"".join([c.data async for c in following]) == b"got x\n" and following.result.exit_code == 0
                assert b"".join([c.data async for c in reader]) == b"got x\n"
                with pytest.raises(dsec.NotFound):
                    await sb.signal(pid)
                term = sb.exec_stream(["python3", "-c", "import os, sys; sys.stdin.readline(); "
                                       "print(os.get_terminal_size())"], pty=(80, 24))
                procs = await sb.processes()
                while not procs:
                    procs = await sb.processes()
                await sb.resize(procs[0].pid, 100, 30)
                await sb.send_input(procs[0].pid, "go\n")
                shown = [(c.stream, c.data) async for c in term]
                assert {st for st, _ in shown} == {"pty"}
                assert b"columns=100, lines=30" in b"".join(d for _, d in shown), shown
                await sb.write_file("/work/m.txt", "m", user="user", xattrs={"e2b.k": "v"})
                info = (await sb.list_files("/work/m.txt")).info
                assert (info.owner, dict(info.xattrs)) == ("user", {"e2b.k": "v"})
                assert (await sb.usage()).cpu_count >= 1
                await sb.make_dir("/work/wd")
                seen = []
                async with await sb.watch("/work/wd") as w:
                    await sb.write_file("/work/wd/f", "x")
                    async for e in w:
                        seen.append((e.type, e.name))
                        if e.type == "write":
                            break
                assert seen[0] == ("create", "f") and seen[-1] == ("write", "f"), seen
                with pytest.raises(dsec.NotFound):
                    await sb.watch("/work/none")
                await sb.pause(memory=True)
                assert (await sb.get()).paused_memory
                await sb.resume()
                ends = await sb.set_timeout(600)
                assert ends.expires_because == "ttl" and ends.expires_ms > 0
                page = await c.list_sandboxes(labels={"case": "async"}, state="running", kind="container")
                assert [r.id for r in page.sandboxes] == [sb.id] and page.next_page_token == ""
                same = await c.attach(sb.id)
                assert (await same.exec("cat /work/a.txt")).text == "one\n"
                sid = sb.id
            with pytest.raises(dsec.NotFound):
                await c.attach(sid)
            s = await c.open_session("pytest/async/s0", kind="container", image=IMAGE)
            replies = [await s.step(i, f"echo {i} >> log; wc -l < log") for i in range(3)]
            assert [r.result.text.strip() for r in replies] == ["1", "2", "3"]
            assert (await s.step(1, "echo 1 >> log; wc -l < log")).replayed
            with pytest.raises(dsec.FailedPrecondition, match="differs from the logged one"):
                await s.step(1, "echo never")
            meta = await s.annotate(2, reward=2.5, completion_tokens=7)
            assert (meta.reward, meta.completion_tokens) == (2.5, 7)
            assert [st.index for st in await s.steps()] == [0, 1, 2]
            assert await s.report() == []  # no guard, no network: nothing to flag
            with pytest.raises(dsec.FailedPrecondition, match="without a grade spec"):
                await s.grade(3)
            assert (await s.get()).step_count == 3
            with pytest.raises(dsec.NotFound):
                await s.sandbox("nope")  # answered before anything is sent
            agent = await s.sandbox()
            assert await agent.read_file("/work/log") == b"0\n1\n2\n"
            assert (await (await c.attach_session("pytest/async/s0")).get()).name == "pytest/async/s0"
            await s.close()
            assert IMAGE in [i.name for i in await c.list_images()]
            assert (await c.get_image(IMAGE)).name == IMAGE
            with pytest.raises(dsec.NotFound):
                await c.remove_image("no-such-image")
            with pytest.raises(dsec.InvalidArgument):
                await c.run(["true"], kind="nope")

    asyncio.run(main())


def test_a_handle_call_goes_straight_into_async_with(container_daemon: Daemon) -> None:
    async def main() -> None:
        async with container_daemon.async_client() as c:
            async with c.create(kind="container", image=IMAGE) as sb:  # no `await` in between
                assert isinstance(sb, dsec.AsyncSandbox)
                assert (await sb.get()).phase == "running"
                assert (await sb.exec("echo inside")).text == "inside\n"
                sid = sb.id
            with pytest.raises(dsec.NotFound):
                await c.attach(sid)  # destroyed when the block ended

            # Awaited, the same call still gives the handle, which outlives
            # the statement.
            sb = await c.create(kind="container", image=IMAGE)
            assert isinstance(sb, dsec.AsyncSandbox)
            try:
                assert (await sb.exec("echo awaited")).text == "awaited\n"
                # It is a coroutine to asyncio, as the call was before.
                same = await asyncio.create_task(c.attach(sb.id))
                assert (await same.get()).phase == "running"
            finally:
                await sb.destroy()

            # A session's block closes it when it ends normally.
            async with c.open_session("pytest/async/with", kind="container", image=IMAGE) as s:
                assert isinstance(s, dsec.AsyncSession)
                assert (await s.step(0, "echo step")).result.text == "step\n"
            assert (await (await c.attach_session("pytest/async/with")).get()).phase == "closed"

    asyncio.run(main())


def test_the_extension_refuses_a_broken_aio_target(client: dsec.Client) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        with pytest.raises(TypeError, match="completer is None"):
            client._c.run({"kind": "fncall"}, {"argv": ["true"]}, (loop, loop.create_future(), None))

    asyncio.run(main())
    assert client.run(["echo", "ok"]).text == "ok\n"


def test_a_cancelled_call_leaves_the_client_working(daemon: Daemon) -> None:
    # The answers that arrive for futures already done (cancelled) are seen
    # through the module's settle hook, so the test waits for the cancelled
    # call's own answer instead of guessing when it comes.
    from dsec import _aio
    late = []

    def settle(fut: "asyncio.Future[object]", failed: bool, value: object) -> None:
        if fut.done():
            late.append(value)
        _aio._settle(fut, failed, value)

    async def main() -> None:
        async with daemon.async_client() as c:
            task = asyncio.ensure_future(c.run(["sleep", "0.4"]))
            await asyncio.sleep(0)  # let the task issue its call
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert late == []
            # Calls made while the cancelled one is in flight are answered.
            assert (await c.run(["echo", "meanwhile"])).text == "meanwhile\n"
            deadline = time.monotonic() + 30
            while not late and time.monotonic() < deadline:
                await c.run(["true"])  # each answer is a turn of the loop
            assert len(late) == 1 and isinstance(late[0], dsec.ExecResult), late
            assert late[0].ok  # the call itself completed on the node
            # After its answer reached a cancelled future, the client works.
            assert (await c.run(["echo", "after"])).text == "after\n"

    _core._set_settle(settle)
    try:
        asyncio.run(main())
    finally:
        _core._set_settle(_aio._settle)


def test_a_closed_event_loop_with_calls_in_flight_does_not_crash(daemon: Daemon) -> None:
    code = r'''
import asyncio, dsec, os, time
c = dsec.AsyncClient()
def running():          # the runs are host processes
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            n += open(f"/proc/{pid}/cmdline", "rb").read() == b"sleep\0" + b"0.55\0"
        except OSError:
            pass
    return n
async def main():
    for _ in range(50):
        asyncio.ensure_future(c.run(["sleep", "0.55"]))
    deadline = time.monotonic() + 30
    while not running() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)   # polling other processes
    assert running(), "no run started"
loop = asyncio.new_event_loop()
loop.run_until_complete(main())
loop.close()            # the answers arrive after this
deadline = time.monotonic() + 60
while running() and time.monotonic() < deadline:
    time.sleep(0.05)    # polling other processes
assert not running()
print(c.connected, dsec.Client().run(["echo", "fine"]).text, end="")
'''
    out = subprocess.run([sys.executable, "-c", code], env=daemon.env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "True fine\n"


def test_a_process_exits_with_calls_in_flight(daemon: Daemon) -> None:
    code = r'''
import dsec, os, threading, time
c = dsec.Client()
threading.Thread(target=lambda: c.run(["sleep", "30.5"]), daemon=True).start()
def running():          # the run is a host process
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if open(f"/proc/{pid}/cmdline", "rb").read() == b"sleep\0" + b"30.5\0":
                return True
        except OSError:
            pass
    return False
deadline = time.monotonic() + 30
while not running() and time.monotonic() < deadline:
    time.sleep(0.01)    # polling another process
print("in flight" if running() else "never started")
'''
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], env=daemon.env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "in flight\n", out.stderr
    assert time.monotonic() - t0 < 20  # did not wait for the 30 s run


def test_blocking_calls_release_the_gil(client: dsec.Client) -> None:
    ticks = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    t = threading.Thread(target=count)
    t.start()
    try:
        time.sleep(0.05)
        before = ticks
        r = client.run(["sleep", "1.5"])
        during = ticks - before
    finally:
        stop.set()
        t.join()
    assert r.ok
    # A pure-Python loop does ~10^6-10^7 ticks a second; with the GIL held
    # through the call it would have done none while the run lasted.
    assert during > 100_000, during


def test_the_blocking_client_is_thread_safe(client: dsec.Client) -> None:
    errors = []
    results = []

    def worker(n: int) -> None:
        try:
            for i in range(10):
                results.append(client.run(["echo", f"{n}-{i}"]).text)
        except Exception as e:  # noqa: BLE001: reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(results) == sorted(f"{n}-{i}\n" for n in range(8) for i in range(10))
