"""Every call of the Python SDK (blocking forms) against a real dsecd."""

from __future__ import annotations

import os
import re

import pytest

import dsec
from conftest import IMAGE, SOURCE, Daemon


def test_the_issue_example_runs_as_written(container_daemon: Daemon) -> None:
    # sdk/python/examples/quickstart.py is the example at the top of the
    # Python SDK's issue; only the address is this test's dsecd's.
    path = os.path.join(SOURCE, "sdk", "python", "examples", "quickstart.py")
    code = open(path).read()
    assert 'dsec.Client("127.0.0.1:7400")' in code
    code = code.replace('dsec.Client("127.0.0.1:7400")', f'dsec.Client("{container_daemon.sdk}")')
    code = code.replace("dsec.AsyncClient()", f'dsec.AsyncClient("{container_daemon.sdk}")')
    os.environ["DSEC_DATA_DIR"] = container_daemon.data_dir  # the SDK token
    try:
        exec(compile(code, path, "exec"), {"__name__": "__main__"})
    finally:
        del os.environ["DSEC_DATA_DIR"]
    with container_daemon.client() as c:
        s = c.attach_session("job1/p0/s0")
        assert s.get().step_count == 1
        s.close()  # the example leaves it open (for its lease)


def test_run_takes_an_argv_or_a_shell_string(client: dsec.Client) -> None:
    r = client.run(["python3", "-c", "print(6*7)"], kind="fncall", timeout=2)
    assert (r.stdout, r.exit_code, r.signal, r.verdict, r.ok) == (b"42\n", 0, 0, "ok", True)
    assert r.text == "42\n" and r.cpu_ms > 0 and r.wall_ms > 0 and r.peak_memory > 0 and not r.truncated
    r = client.run("echo out; echo err >&2; exit 3")
    assert (r.text, r.stderr_text, r.exit_code, r.verdict) == ("out\n", "err\n", 3, "runtime_error")


def test_run_passes_stdin_env_and_limits(client: dsec.Client) -> None:
    assert client.run(["tr", "a-z", "A-Z"], stdin="hello").stdout == b"HELLO"
    assert client.run(["sh", "-c", "echo $GREETING"], env={"GREETING": "hi"}).text == "hi\n"
    r = client.run(["sh", "-c", "while :; do :; done"], timeout=0.5)
    assert r.verdict == "time_limit"
    r = client.run(["yes"], limits=dsec.Limits(output_bytes=4096))
    assert r.verdict == "output_limit" and r.truncated and len(r.stdout) <= 4096
    r = client.run(["python3", "-c", "b = bytearray(512 << 20); print(len(b))"], memory=64 << 20)
    assert r.verdict == "memory_limit"
    r = client.run(["/no/such/program"])
    assert r.exit_code == 127 and r.exec_failed


def test_create_exec_files_pause_resume_destroy(cclient: dsec.Client) -> None:
    sb = cclient.create(kind="container", image=IMAGE, labels={"test": "calls"})
    try:
        assert re.fullmatch(r"[a-z0-9-]+", sb.id)
        rec = sb.get()
        assert (rec.id, rec.phase, rec.spec.kind, rec.spec.image) == (sb.id, "running", "container", IMAGE)
        with cclient.create(spec=rec.spec) as twin:  # a record read back goes in as it is
            assert twin.get().spec.image == IMAGE
        assert rec.spec.labels == {"test": "calls"} and rec.owner == cclient.client_id
        assert sb.exec("echo state > /work/f").ok
        assert sb.exec(["cat", "/work/f"]).stdout == b"state\n"
        sb.write_file("/work/sub/a.py", "print('hi')", make_parents=True, mode=0o600)
        assert sb.read_file("/work/sub/a.py") == b"print('hi')"
        assert sb.exec("python3 /work/sub/a.py").text == "hi\n"
        sb.write_file("/work/bin.dat", bytes(range(256)))
        assert sb.read_file("/work/bin.dat") == bytes(range(256))
        listing = sb.list_files("/work")
        assert {e.name for e in listing.entries} >= {"f", "sub", "bin.dat"}
        info = sb.list_files("/work/sub/a.py").info
        assert (info.name, info.size, info.mode & 0o777, info.owner) == ("a.py", 11, 0o600, "root")
        made = sb.make_dir("/work/d/e", user="user")  # the image's user `user` (uid 1000)
        assert (made.name, made.uid, made.owner) == ("e", 1000, "user")
        with pytest.raises(dsec.AlreadyExists):
            sb.make_dir("/work/d/e")
        assert sb.exec("id -un; pwd", user="user").text == "user\n/home/user\n"
        assert sb.move("/work/sub/a.py", "/work/d/e/b.py").name == "b.py"
        sb.remove("/work/d")
        assert "d" not in {e.name for e in sb.list_files("/work").entries}
        with pytest.raises(dsec.NotFound):
            sb.remove("/work/d")
        st = sb.exec_stream(["sh", "-c", "cat; echo end"], interactive=True)
        pid = st.pid
        assert pid > 0 and [p.argv[0] for p in sb.processes() if p.pid == pid and p.stdin_open] == ["sh"]
        sb.send_input(pid, "x\n")
        sb.close_stdin(pid)
        assert b"".join(c.data for c in st) == b"x\nend\n" and st.result.exit_code == 0
        with pytest.raises(dsec.NotFound):
            sb.signal(pid)
        st = sb.exec_stream(["sh", "-c", "read l; echo got $l"], interactive=True)
        following = sb.attach(st.pid)  # another's output, from now on, and its end
        sb.send_input(st.pid, "x\n")
        assert b"".join(c.data for c in following) == b"got x\n" and following.result.exit_code == 0
        assert b"".join(c.data for c in st) == b"got x\n"
        # A terminal: its output as "pty" chunks, typed into, resized.
        term = sb.exec_stream(["python3", "-c", "import os, sys; print(os.get_terminal_size(), flush=True); "
                               "sys.stdin.readline(); print(os.get_terminal_size())"], pty=(80, 24))
        shown = b""
        chunks = iter(term)
        while b"lines=24" not in shown:
            c = next(chunks)
            assert c.stream == "pty"
            shown += c.data
        assert b"columns=80, lines=24" in shown
        sb.resize(term.pid, 100, 30)
        sb.send_input(term.pid, "go\n")
        assert b"columns=100, lines=30" in b"".join(c.data for c in chunks) and term.result.exit_code == 0
        with pytest.raises(TypeError):
            sb.exec_stream(["true"], pty=80)
        # Extended attributes (E2B's file metadata) and the owner of a file written.
        sb.write_file("/work/meta.txt", "m", user="user", xattrs={"e2b.author": "mish", "keep": "1"})
        meta = sb.list_files("/work/meta.txt").info
        assert (meta.owner, dict(meta.xattrs)) == ("user", {"e2b.author": "mish", "keep": "1"})
        sb.write_file("/work/meta.txt", "n", xattrs_replace="e2b.")
        assert dict(sb.list_files("/work/meta.txt").info.xattrs) == {"keep": "1"}
        with pytest.raises(dsec.InvalidArgument, match="1 to 200 bytes"):
            sb.write_file("/work/meta.txt", "n", xattrs={"k" * 201: "v"})
        with pytest.raises(TypeError):
            sb.write_file("/work/meta.txt", "n", xattrs={"k": 1})
        sb.make_dir("/work/wd")
        seen = []
        with sb.watch("/work/wd", recursive=True) as w:
            sb.write_file("/work/wd/f", "x")
            for e in w:
                seen.append((e.type, e.name))
                if e.type == "write":
                    break
        assert seen[0] == ("create", "f") and seen[-1] == ("write", "f"), seen
        with pytest.raises(dsec.NotFound):
            sb.watch("/work/none")
        with pytest.raises(dsec.Error):
            sb.read_file("/work/bin.dat", max_bytes=10)
        use = sb.usage()
        assert isinstance(use, dsec.SandboxUsage) and use.cpu_count >= 1 and 0 < use.mem_used_bytes < use.mem_total_bytes
        assert 0.0 <= use.cpu_used_pct <= 100.0 and use.at_ms > 0
        sb.pause()
        assert sb.get().phase == "paused"
        with pytest.raises(dsec.FailedPrecondition):
            sb.usage()
        sb.resume()
        assert sb.get().phase == "running"
        assert sb.exec(["cat", "/work/f"]).stdout == b"state\n"  # state kept across pause
        sb.pause(memory=True)
        record = sb.get()
        assert (record.phase, record.paused_memory) == ("paused", True)
        sb.resume()
        assert not sb.get().paused_memory
        attached = cclient.attach(sb.id)
        assert attached.exec(["cat", "/work/f"]).stdout == b"state\n"
    finally:
        sb.destroy()
    with pytest.raises(dsec.NotFound):
        cclient.attach(sb.id)


def test_exec_stream_yields_output_as_it_comes(cclient: dsec.Client) -> None:
    with cclient.create(kind="container", image=IMAGE) as sb:
        stream = sb.exec_stream(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.3; done; echo e >&2; exit 4"])
        chunks = list(stream)
        assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"1\n2\n3\n"
        assert b"".join(c.data for c in chunks if c.stream == "stderr") == b"e\n"
        assert len([c for c in chunks if c.stream == "stdout"]) >= 2  # not one piece at the end
        assert stream.result is not None and stream.result.exit_code == 4 and stream.result.stdout == b""


def test_a_sandbox_as_a_context_manager_is_destroyed_at_the_end(cclient: dsec.Client) -> None:
    with cclient.create(kind="container", image=IMAGE, id="ctx-test-1") as sb:
        assert sb.id == "ctx-test-1"
        with pytest.raises(dsec.AlreadyExists):
            cclient.create(kind="container", image=IMAGE, id="ctx-test-1")
    with pytest.raises(dsec.NotFound):
        cclient.attach("ctx-test-1")


def test_sessions_step_replay_annotate_and_close(cclient: dsec.Client) -> None:
    s = cclient.open_session("pytest/calls/s0", kind="container", image=IMAGE,
                             sandboxes={"eval": {"kind": "fncall"}})
    assert s.name == "pytest/calls/s0"
    assert {x.role for x in s.record.sandboxes} == {"agent", "eval"}
    r0 = s.step(0, "echo x >> log; wc -l < log", reward=0.5, notes={"why": "first"})
    assert (r0.result.text.strip(), r0.replayed) == ("1", False)
    again = s.step(0, "echo x >> log; wc -l < log")
    assert (again.result.text.strip(), again.replayed) == ("1", True)  # from the log, not run again
    r1 = s.step(1, ["sh", "-c", "echo x >> log; wc -l < log"], prompt_tokens=10, completion_tokens=3)
    assert r1.result.text.strip() == "2"
    ev = s.step(2, ["python3", "-c", "print(1+1)"], sandbox="eval")
    assert ev.result.text == "2\n" and ev.step.sandbox == "eval"
    meta = s.annotate(1, reward=1.0, notes={"grader": "ok"})
    assert (meta.reward, meta.prompt_tokens, meta.notes) == (1.0, 10, {"grader": "ok"})
    steps = s.steps()
    assert [st.index for st in steps] == [0, 1, 2]
    assert steps[0].meta.reward == 0.5 and steps[0].meta.notes == {"why": "first"}
    assert steps[1].meta.reward == 1.0 and steps[1].request.argv[0] == "sh"
    assert [st.index for st in s.steps(start=1, limit=1)] == [1]
    assert s.get().step_count == 3 and s.get().phase == "open"
    agent = s.sandbox()
    assert agent.read_file("/work/log") == b"x\nx\n"
    with pytest.raises(dsec.FailedPrecondition):
        s.sandbox("eval")  # fncall: no sandbox to attach to
    with pytest.raises(dsec.NotFound):
        s.sandbox("nope")
    same = cclient.attach_session("pytest/calls/s0")
    assert same.get().step_count == 3
    s.close()
    assert cclient.attach_session("pytest/calls/s0").get().phase == "closed"
    with pytest.raises(dsec.NotFound):
        cclient.attach_session("pytest/calls/none")


def test_a_task_guard_flags_a_protected_path_the_agent_makes(cclient: dsec.Client) -> None:
    task = {"root": "/", "protected_paths": ["**/conftest.py"], "hidden_paths": []}
    s = cclient.open_session("pytest/calls/guard", spec={"task": task}, kind="container", image=IMAGE)
    assert s.record.spec.task == dsec.TaskGuard(**task) or s.record.spec.task.root == "/"
    made = s.step(0, "echo 'import pytest' > /work/conftest.py")
    assert [(f.what, f.evidence) for f in made.step.flags] == [("protected_write", "created work/conftest.py")]
    again = s.step(1, "true")
    assert again.step.flags in (None, [])  # flagged once
    assert [len(st.flags or []) for st in s.steps()] == [1, 0]
    assert s.report() == [dsec.StepFlag(step=0, what="protected_write", evidence="created work/conftest.py")]
    s.close()
    with pytest.raises(dsec.InvalidArgument, match="'a\\*\\*'"):
        cclient.open_session("pytest/calls/guard-bad", spec={"task": {"root": "/", "hidden_paths": ["a**"]}},
                             kind="container", image=IMAGE)


def test_a_grade_runs_in_a_fresh_sandbox_on_the_agents_changes(cclient: dsec.Client) -> None:
    grade = dsec.GradeSpec(command=["sh", "-c", "cat /work/answer /work/conftest.py 2>&1; cat /work/answer"],
                           timeout_s=30)
    s = cclient.open_session("pytest/calls/grade", spec={"task": {"root": "/work", "protected_paths": ["conftest.py"]}},
                             kind="container", image=IMAGE, grade=grade)
    assert s.record.grade.command == grade.command
    s.step(0, "echo 0.75 > /work/answer; echo cheat > /work/conftest.py")
    g = s.grade(1)
    assert (g.step.sandbox, g.step.meta.reward) == ("grade", 0.75)
    assert "No such file" in g.step.result.text  # the protected path as the image has it: absent
    assert s.grade(1).replayed
    assert s.step(2, "cat /work/conftest.py").result.text == "cheat\n"  # the agent's sandbox untouched
    s.close()
    with pytest.raises(dsec.InvalidArgument, match="no task root"):
        cclient.open_session("pytest/calls/grade-bad", kind="container", image=IMAGE, grade={"command": ["true"]})


def test_a_session_context_manager_closes_only_without_an_exception(cclient: dsec.Client) -> None:
    with cclient.open_session("pytest/calls/ctx-ok", kind="fncall") as s:
        s.step(0, "true")
    assert cclient.attach_session("pytest/calls/ctx-ok").get().phase == "closed"
    with pytest.raises(KeyError):
        with cclient.open_session("pytest/calls/ctx-err", kind="fncall") as s:
            raise KeyError("trainer failed")
    kept = cclient.attach_session("pytest/calls/ctx-err")
    assert kept.get().phase == "open"  # left for a trainer started again
    kept.close()


def test_images_list_get_register_remove(cclient: dsec.Client) -> None:
    images = cclient.list_images()
    assert IMAGE in [i.name for i in images]
    m = cclient.get_image(IMAGE)
    assert m.digest.startswith("sha256:") and m.size_bytes > 0 and os.path.isabs(m.file)
    copy = cclient.register_image({**m.to_dict(), "name": "py311-copy"})  # the same file, another name
    assert copy.name == "py311-copy" and copy.digest == m.digest
    assert "py311-copy" in [i.name for i in cclient.list_images()]
    cclient.remove_image("py311-copy")
    with pytest.raises(dsec.NotFound):
        cclient.get_image("py311-copy")


def test_snapshot_fork_list_and_remove(cclient: dsec.Client) -> None:
    sb = cclient.create(kind="container", image=IMAGE)
    sb.exec("echo kept > /work/f")
    snap = sb.snapshot("pytest-snap")
    assert isinstance(snap, dsec.SnapshotInfo)
    assert (snap.name, snap.kind, snap.image, snap.depth, snap.size_bytes) == ("pytest-snap", "container", IMAGE, 1, 5)
    new = cclient.create(spec={"snapshot": "pytest-snap"})
    assert new.exec("cat /work/f").text == "kept\n"
    forks = sb.fork(2)
    assert [f.exec("cat /work/f").text for f in forks] == ["kept\n", "kept\n"]
    assert len({f.exec("hostname").text for f in forks}) == 2
    assert "pytest-snap" in [s.name for s in cclient.list_snapshots()]
    assert cclient.get_snapshot("pytest-snap").users == [f"sandbox {new.id}"]
    with pytest.raises(dsec.FailedPrecondition, match=f"in use by sandbox {new.id}"):
        cclient.remove_snapshot("pytest-snap")
    with pytest.raises(dsec.InvalidArgument, match="1 to 100"):
        sb.fork(0)
    for s in [new, *forks, sb]:
        s.destroy()
    cclient.remove_snapshot("pytest-snap")
    assert cclient.list_snapshots() == []
    s = cclient.open_session("pytest/calls/fork", kind="container", image=IMAGE)
    s.step(0, "echo a > /work/a")
    forks = s.fork(2)
    assert [f.name for f in forks] == ["pytest/calls/fork/fork-0", "pytest/calls/fork/fork-1"]
    assert forks[1].step(0, "echo a > /work/a").replayed  # the source's step, from the log
    assert forks[1].step(1, "cat /work/a").result.text == "a\n"
    for x in [*forks, s]:
        x.close()


def test_client_properties_and_close(daemon: Daemon) -> None:
    c = daemon.client()
    assert re.fullmatch(r"[0-9a-f]{32}", c.client_id) and c.connected and c.connections == 1
    assert c.address == daemon.sdk and repr(c) == f"dsec.Client({daemon.sdk!r})"
    c.close()
    with pytest.raises(dsec.FailedPrecondition, match="closed"):
        c.run(["true"])
    c.close()  # twice is fine


def test_records_compare_print_and_turn_into_dicts(client: dsec.Client) -> None:
    r = client.run(["echo", "x"])
    d = r.to_dict()
    assert d["stdout"] == b"x\n" and d["verdict"] == "ok"
    assert "verdict='ok'" in repr(r)
    assert dsec.Limits(timeout_ms=5) == dsec.Limits(timeout_ms=5) != dsec.Limits(timeout_ms=6)
    assert dsec.Limits(timeout_ms=5).memory_bytes is None
    with pytest.raises(TypeError, match="no field 'timeout'"):
        dsec.Limits(timeout=5)
    assert set(dsec.KINDS) >= {"fncall", "container", "microvm", "vm", "auto"}


def test_set_timeout_and_list_sandboxes(client: dsec.Client) -> None:
    made = [client.create(kind="fncall", labels={"case": "list", "n": str(i)}) for i in range(5)]
    try:
        rec = made[0].set_timeout(120)
        assert rec.expires_because == "ttl" and rec.spec.ttl_s >= 120
        with pytest.raises(dsec.InvalidArgument, match="1 or more"):
            made[0].set_timeout(0)
        with pytest.raises(dsec.InvalidArgument, match="--sandbox-max-ttl"):
            made[0].set_timeout(30 * 24 * 3600)
        ids, token = [], ""
        while True:
            page = client.list_sandboxes(labels={"case": "list"}, state=["running"], kind="fncall", limit=2,
                                         page_token=token)
            assert isinstance(page, dsec.SandboxPage) and len(page.sandboxes) <= 2
            ids += [r.id for r in page.sandboxes]
            token = page.next_page_token
            if not token:
                break
        assert ids == sorted(sb.id for sb in made)
        assert client.list_sandboxes(labels={"case": "list", "n": "3"}).sandboxes[0].id == made[3].id
        with pytest.raises(dsec.InvalidArgument, match="not one this server gave"):
            client.list_sandboxes(page_token="nonsense")
        with pytest.raises(TypeError):
            client.list_sandboxes(state=3)
    finally:
        for sb in made:
            sb.destroy()



def test_set_network_says_replace_or_add_and_address_names_the_port(client: dsec.Client) -> None:
    sb = client.create(kind="fncall")
    try:
        with pytest.raises(TypeError):
            sb.set_network(["198.51.100.2:80"])  # type: ignore[call-arg]  # no change given
        with pytest.raises(ValueError, match="'replace' or 'add'"):
            sb.set_network(["198.51.100.2:80"], change="merge")
        # fncall sandboxes have no network: the node says so, naming the kind.
        with pytest.raises(dsec.Unimplemented, match="kind 'fncall' cannot enforce a network policy"):
            sb.set_network(["198.51.100.2:80"], change="replace")
        with pytest.raises(dsec.NotFound, match="port 8000 is not exposed"):
            sb.address(8000)
    finally:
        sb.destroy()
