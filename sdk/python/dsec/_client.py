"""The blocking client: dsec.Client, dsec.Sandbox, dsec.Session.

Every call blocks its thread (not others: the GIL is released while it
waits) until dsecd answers or the call's time limit passes. For many
concurrent calls from one thread use dsec.AsyncClient.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any, Dict, Iterator, List, Mapping, Optional, Union

from . import _args, _core
from ._errors import InvalidArgument, NotFound
from ._records import (ExecResult, FileInfo, FileList, ProcessInfo, SandboxUsage, GradeSpec, ImageManifest, SandboxPage, SandboxRecord, SessionRecord, SnapshotInfo,
                       StepFlag, StepMeta,
                       StepRecord, StepReply, StepsPage)

_live: "weakref.WeakSet[_core.Client]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    # Before the interpreter goes: SDK threads must not wait for a GIL that
    # will never come back.
    for core in list(_live):
        core.close()


def connect(address: Optional[str] = None, *, token: Optional[str] = None, token_file: Optional[str] = None,
            data_dir: Optional[str] = None, connect_timeout: Optional[float] = 5.0,
            rpc_timeout: Optional[float] = 30.0, threads: int = 2) -> "_core.Client":
    def secs(v: Any, what: str, default: float) -> float:
        ms = _args.seconds_to_ms(v, what)
        return ms / 1000.0 if ms is not None else default

    if _args.count(threads, "threads", 256) < 1:
        raise _args.InvalidArgument(f"threads must be at least 1 (got {threads})")
    core = _core.Client(address=_args.text(address or "", "address"), token=_args.text(token or "", "token"),
                        token_file=_args.text(token_file or "", "token_file"),
                        data_dir=_args.text(data_dir or "", "data_dir"),
                        connect_timeout_s=secs(connect_timeout, "connect_timeout", 5.0),
                        rpc_timeout_s=secs(rpc_timeout, "rpc_timeout", 30.0), threads=int(threads))
    _live.add(core)
    return core


def _positive_seconds(value: Any) -> int:
    """A timeout: whole seconds, 1 or more (rounded up)."""
    v = _args.whole_seconds(value, "seconds")
    if not v:
        raise InvalidArgument(f"seconds must be 1 or more (got {value!r}); destroy() ends a sandbox now")
    return v


class Chunk:
    """A piece of a streamed exec's output, in the order it was produced."""

    __slots__ = ("stream", "data")

    def __init__(self, stream: str, data: bytes) -> None:
        self.stream = stream  # "stdout", "stderr", or "pty" (a terminal exec's)
        self.data = data

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"Chunk({self.stream}, {self.data!r})"


def _chunks(stdout: bytes, stderr: bytes, pty: bool = False) -> List[Chunk]:
    out = []
    if stdout:
        out.append(Chunk("pty" if pty else "stdout", stdout))
    if stderr:
        out.append(Chunk("stderr", stderr))
    return out


class ExecStream:
    """Iterates over a streamed exec's output (Chunk objects); ``result`` is
    the ExecResult once the iteration has ended (its stdout and stderr are
    empty: the output came in the chunks). A failure raises from the loop."""

    def __init__(self, stream: "_core.Stream", pty: bool = False) -> None:
        self._stream = stream
        self._pty = pty
        self._pending: List[Chunk] = []
        self.result: Optional[ExecResult] = None

    @property
    def pid(self) -> int:
        """An interactive exec's pid (waits for it to start; 0 if it ended
        without one)."""
        return self._stream.pid(60.0)

    def __iter__(self) -> "ExecStream":
        return self

    def __next__(self) -> Chunk:
        while not self._pending:
            if self.result is not None:
                raise StopIteration
            got = self._stream.next_chunk()
            if got is None:
                self.result = self._stream.result()
                raise StopIteration
            self._pending = _chunks(*got, pty=self._pty)
        return self._pending.pop(0)


class FsEvent:
    """A change in a watched directory: `type` is "create", "write", "remove",
    "rename" (moved away) or "chmod"; `name` is relative to the directory."""

    __slots__ = ("name", "type")

    def __init__(self, name: str, type: str) -> None:  # noqa: A002 (the proto's name)
        self.name = name
        self.type = type

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FsEvent) and (self.name, self.type) == (other.name, other.type)

    def __repr__(self) -> str:
        return f"FsEvent({self.type}, {self.name!r})"


class Watch:
    """A directory's changes (Sandbox.watch): iterate for FsEvents as they
    happen; the iteration ends when the watch does (stop(), its timeout, the
    directory removed: then it raises dsec.NotFound). As a context manager it
    is stopped when the block ends."""

    def __init__(self, core: "_core.Watch") -> None:
        self._w = core

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> FsEvent:
        got = self._w.next_event()
        if got is None:
            self._w.result()  # raises how it ended, if not cleanly
            raise StopIteration
        return FsEvent(got[0].decode("utf-8", "replace"), got[1].decode())

    def stop(self) -> int:
        """Stops it and returns how many events it reported."""
        return self._w.stop()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class Sandbox:
    """A sandbox (Client.create or Client.attach). As a context manager it is
    destroyed when the block ends."""

    def __init__(self, client: "Client", core: "_core.Sandbox") -> None:
        self._client = client  # keeps the connection alive
        self._sb = core

    @property
    def id(self) -> str:
        return self._sb.id

    def exec(self, cmd: _args.Command, *, stdin: Union[bytes, str, None] = None, env: Optional[Mapping[str, str]] = None,
             cwd: Optional[_args.PathArg] = None, timeout: Optional[float] = None, limits: Any = None,
             idempotency_key: Optional[str] = None, user: Optional[str] = None) -> ExecResult:
        """Runs `cmd` (a str runs with sh -c; a list is the argv) in the sandbox and waits for it.

        `timeout` (seconds) and `limits` override the sandbox's limits for this exec. `user`
        (a name in the sandbox's /etc/passwd, or a uid) runs it as that user: its ids, groups,
        HOME and USER, its home as the working directory unless `cwd`."""
        req = _args.exec_request(cmd, stdin=stdin, env=env, cwd=cwd, timeout=timeout, limits=limits,
                                 idempotency_key=idempotency_key, user=user)
        return self._sb.exec(req, None)

    def exec_stream(self, cmd: _args.Command, *, stdin: Union[bytes, str, None] = None,
                    env: Optional[Mapping[str, str]] = None, cwd: Optional[_args.PathArg] = None,
                    timeout: Optional[float] = None, limits: Any = None, user: Optional[str] = None,
                    interactive: bool = False, pty: Optional[Any] = None) -> ExecStream:
        """Like exec, with the output as it comes: iterate over the returned ExecStream.

        With `interactive`, its stdin stays open (send_input, close_stdin) and the
        stream's ``pid`` names it (signal, processes). `pty` (cols, rows): the command
        runs on a terminal of that size, leading a session of its own (interactive);
        its output comes as "pty" chunks, send_input types into it, resize changes its
        size. Kinds that cannot stream (fncall) raise dsec.Unimplemented, having run
        nothing."""
        req = _args.exec_request(cmd, stdin=stdin, env=env, cwd=cwd, timeout=timeout, limits=limits, user=user,
                                 interactive=_flag(interactive, "interactive") or pty is not None, pty=pty)
        return ExecStream(self._sb.exec_stream(req), pty=pty is not None)

    def get(self) -> SandboxRecord:
        """The sandbox's record: phase, spec, owner, expiry, ..."""
        return self._sb.get(None)

    def destroy(self) -> None:
        """Removes the sandbox and everything in it. Raises if it could not be
        stopped (it is then still there: destroy again)."""
        self._sb.destroy(None)

    def pause(self, memory: bool = False) -> None:
        """Freezes every process (no CPU used). With `memory`, its memory is
        freed too: a microVM's goes to the node's disk and its QEMU ends; a
        container's is reclaimed (docs/running.md, "Pausing with memory")."""
        self._sb.pause(bool(memory), None)

    def resume(self) -> None:
        self._sb.resume(None)

    def snapshot(self, name: str) -> SnapshotInfo:
        """A named, read-only snapshot of its state now (it is frozen for the copy);
        new sandboxes start from it: Client.create(snapshot=name)."""
        return self._sb.snapshot(_args.name(name, "snapshot name"), None)

    def fork(self, count: int) -> List["Sandbox"]:
        """`count` (1-100) new sandboxes in its current state, on its node, each with
        its own id, hostname and machine-id: all of them, or an error naming which
        failed (none kept)."""
        return [Sandbox(self._client, core) for core in self._sb.fork(_args.count(count, "count"), None)]

    def set_timeout(self, seconds: float) -> SandboxRecord:
        """Ends the sandbox `seconds` from now, sooner or later than its ttl said
        (within the node's maximum); its record comes back with the new end."""
        return self._sb.set_timeout(_positive_seconds(seconds), None)

    def address(self, port: int) -> str:
        """Where the host reaches the sandbox's exposed TCP `port` ("127.0.0.1:41234");
        NotFound unless it was created with that port in network.expose."""
        return _args.exposed_address(self.get(), port, self.id)

    def set_network(self, network: Any, *, change: str) -> SandboxRecord:
        """A new network policy for the next phase of its task (a sandbox made
        with a network: allow or open), in force for new connections when this
        returns. `network` as in create ("none" shuts every address);
        change="replace" makes it the whole policy, change="add" adds its allow
        entries to the list in force. Its record comes back."""
        return self._sb.set_network(_args.network_change(network), _args.text(change, "change"), None)

    def read_file(self, path: _args.PathArg, *, max_bytes: int = 0) -> bytes:
        """A file's content (absolute path inside the sandbox; max_bytes 0: up to 64 MiB)."""
        return self._sb.read_file(_args.path(path), _nonneg(max_bytes, "max_bytes"), None)

    def write_file(self, path: _args.PathArg, content: Union[bytes, str], *, mode: int = 0o644,
                   make_parents: bool = False, user: Optional[str] = None, xattrs: Optional[Mapping[str, str]] = None,
                   xattrs_replace: str = "") -> None:
        """Writes a file (a str is written as UTF-8).

        `user` (a name in the sandbox's /etc/passwd, or a uid) owns a file it makes, and
        the parents `make_parents` makes. `xattrs` are set as its user.<name> extended
        attributes (at most 64, names of 1 to 200 bytes, values of 4 KiB; list_files shows
        them as FileInfo.xattrs); `xattrs_replace` (a prefix, "e2b." say) first drops its
        attributes under that prefix that `xattrs` does not name."""
        self._sb.write_file(_args.path(path), _content(content), _mode(mode), _flag(make_parents, "make_parents"),
                            *_write_extras(user, xattrs, xattrs_replace), None)

    def list_files(self, path: _args.PathArg) -> FileList:
        """The path's FileInfo (``info``: name, mode, size, owner, group, ...) and, for a
        directory, its ``entries``."""
        return self._sb.list_files(_args.path(path), None)

    def processes(self) -> List[ProcessInfo]:
        """The execs running in it now (any client's), oldest first."""
        return self._sb.process("list", 0, 0, b"", None)

    def usage(self) -> SandboxUsage:
        """What it uses now: CPUs and their share since the last reading, memory,
        disk. dsec.FailedPrecondition when it is not running."""
        return self._sb.usage(None)

    def signal(self, pid: int, signal: int = 15) -> None:
        """Sends `signal` to the process group of the running exec `pid`
        (NotFound once it has ended)."""
        self._sb.process("signal", _args.count(pid, "pid", 0xFFFFFFFF), int(signal), b"", None)

    def send_input(self, pid: int, data: Union[bytes, str]) -> None:
        """Writes `data` to an interactive exec's stdin, after what came before."""
        self._sb.process("input", _args.count(pid, "pid", 0xFFFFFFFF), 0, _content(data), None)

    def close_stdin(self, pid: int) -> None:
        """Closes an interactive exec's stdin: it reads end-of-file."""
        self._sb.process("close_stdin", _args.count(pid, "pid", 0xFFFFFFFF), 0, b"", None)

    def resize(self, pid: int, cols: int, rows: int) -> None:
        """A terminal exec's (exec_stream with pty) terminal to cols x rows: the
        command gets SIGWINCH."""
        size = _args.pty_size((cols, rows))
        self._sb.resize(_args.count(pid, "pid", 0xFFFFFFFF), size["cols"], size["rows"], None)

    def attach(self, pid: int, *, timeout: Optional[float] = None) -> ExecStream:
        """The output of a running streamed exec (by pid: see processes), from now on,
        and its result: one started by a client that went away runs on, and this
        follows it. `timeout` (seconds) ends the following with dsec.DeadlineExceeded,
        not the process."""
        req: Dict[str, Any] = {"attach_pid": _args.count(pid, "pid", 0xFFFFFFFF)}
        ms = _args.seconds_to_ms(timeout, "timeout")
        if ms:
            req["limits"] = {"timeout_ms": ms}
        return ExecStream(self._sb.exec_stream(req))

    def watch(self, path: _args.PathArg, *, recursive: bool = False, timeout: Optional[float] = None) -> Watch:
        """Watches a directory (inotify in the sandbox): returns once the watch is in
        place; iterate over it for the changes. `recursive`: every directory under it too,
        new ones included. `timeout` (seconds) ends it; None: until stopped."""
        ms = _args.seconds_to_ms(timeout, "timeout") or 0
        return Watch(self._sb.watch(_args.path(path), _flag(recursive, "recursive"), ms / 1000.0))

    def make_dir(self, path: _args.PathArg, *, user: Optional[str] = None) -> FileInfo:
        """Makes a directory and the parents it lacks (owned by `user`, a name in the
        sandbox's /etc/passwd or a uid; default root). AlreadyExists when it exists."""
        return self._sb.path_op("make_dir", _args.path(path), "", _args.text(user or "", "user"), None)

    def move(self, source: _args.PathArg, destination: _args.PathArg) -> FileInfo:
        """Renames a path inside the sandbox (a file at `destination` is replaced)."""
        return self._sb.path_op("move", _args.path(source), _args.path(destination), "", None)

    def remove(self, path: _args.PathArg) -> None:
        """Removes a file, or a directory with all it holds (symlinks are not followed)."""
        self._sb.path_op("remove", _args.path(path), "", "", None)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.destroy()
        except NotFound:
            pass  # destroyed in the block already

    def __repr__(self) -> str:
        return f"dsec.Sandbox({self.id!r})"


class Session:
    """A rollout session (Client.open_session or attach_session): numbered
    steps, logged durably; a step already in the log is answered from it
    without running again, so a restarted trainer replays from step 0.

    As a context manager it is closed when the block ends without an
    exception; after an exception it stays open (for the lease), so that a
    trainer started again can go on."""

    def __init__(self, client: "Client", core: "_core.Session") -> None:
        self._client = client
        self._s = core

    @property
    def name(self) -> str:
        return self._s.name

    @property
    def record(self) -> SessionRecord:
        """The record as of open/attach (roles, sandbox ids, lease)."""
        return self._s.record

    def step(self, index: int, cmd: _args.Command, *, sandbox: str = "agent", stdin: Union[bytes, str, None] = None,
             env: Optional[Mapping[str, str]] = None, cwd: Optional[_args.PathArg] = None,
             timeout: Optional[float] = None, limits: Any = None, reward: Optional[float] = None,
             prompt_tokens: Optional[int] = None, completion_tokens: Optional[int] = None,
             notes: Optional[Mapping[str, str]] = None, not_replayable: bool = False) -> StepReply:
        """Runs step `index` in the role `sandbox`, or answers it from the log if it ran before
        (``reply.replayed``). ``reply.result`` is its ExecResult. `not_replayable` marks a step
        (one that talked to the outside world, say) that a restartable session must not re-run
        on another node: the restart stops there with an error naming the step."""
        req = _args.exec_request(cmd, stdin=stdin, env=env, cwd=cwd, timeout=timeout, limits=limits)
        return self._s.step(_args.index(index), req, _args.name(sandbox, "sandbox role"),
                            _args.meta(reward, prompt_tokens, completion_tokens, notes),
                            _flag(not_replayable, "not_replayable"), None)

    def fork(self, count: int, names: Optional[List[str]] = None) -> List["Session"]:
        """`count` (1-100) sessions that go on from this one's current step: each log begins
        with this one's steps (they fast-forward) and each agent sandbox starts from a
        snapshot of this one's taken now. Named `names`, or "<name>/fork-<i>". Fork between
        steps. All or none."""
        return [Session(self._client, core)
                for core in self._s.fork(_args.count(count, "count"), [_args.name(n, "session name") for n in names or []], None)]

    def grade(self, index: int) -> StepReply:
        """Grades the session as its step `index` (the log's next): the grade command of the
        session's GradeSpec runs in a fresh sandbox that gets the agent's changes under the
        task root (protected and hidden paths as the image has them) and the grader image's
        files. The step (role "grade") holds the output and ``meta.reward``; asked again, the
        logged grade comes back (``reply.replayed``). The agent's sandbox goes on untouched."""
        return self._s.grade(_args.index(index), None)

    def annotate(self, index: int, *, reward: Optional[float] = None, prompt_tokens: Optional[int] = None,
                 completion_tokens: Optional[int] = None, notes: Optional[Mapping[str, str]] = None) -> StepMeta:
        """Adds to a logged step's metadata (a reward or token count replaces the old one;
        notes are merged); the metadata as now logged."""
        return self._s.annotate(_args.index(index), _args.meta(reward, prompt_tokens, completion_tokens, notes), None)

    def steps(self, start: int = 0, limit: int = 0) -> List[StepRecord]:
        """Logged steps from `start` (limit 0: up to 1 000 per call)."""
        return self._s.steps(_args.index(start), _nonneg(limit, "limit", _args.U32), None).steps

    def report(self) -> List[StepFlag]:
        """Every flag the session's steps raised (task guard, network policy), in step
        order, from its durable log: what a trainer zeroes or discounts a reward on."""
        out: List[StepFlag] = []
        start = 0
        while True:
            page = self.steps(start, 1000)
            out += [StepFlag(step=st.index, what=f.what, evidence=f.evidence) for st in page for f in (st.flags or [])]
            if len(page) < 1000:
                return out
            start = page[-1].index + 1

    def get(self) -> SessionRecord:
        return self._s.get(None)

    def sandbox(self, role: str = "agent") -> Sandbox:
        """The session's sandbox for `role`, to look at it outside the log."""
        return Sandbox(self._client, self._s.sandbox(_args.name(role, "role"), None))

    def close(self) -> None:
        """Closes the session: its sandboxes go; its log stays for dsec-replay."""
        self._s.close(None)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()

    def __repr__(self) -> str:
        return f"dsec.Session({self.name!r})"


class _Connection:
    """What dsec.Client and dsec.AsyncClient share: the connection and its state."""

    def __init__(self, address: Optional[str] = None, *, token: Optional[str] = None,
                 token_file: Optional[str] = None, data_dir: Optional[str] = None,
                 connect_timeout: Optional[float] = 5.0, rpc_timeout: Optional[float] = 30.0,
                 threads: int = 2) -> None:
        self._c = connect(address, token=token, token_file=token_file, data_dir=data_dir,
                          connect_timeout=connect_timeout, rpc_timeout=rpc_timeout, threads=threads)

    @property
    def client_id(self) -> str:
        """This client's id: the owner of the sandboxes it creates."""
        return self._c.client_id

    @property
    def address(self) -> str:
        return self._c.address

    @property
    def connected(self) -> bool:
        return self._c.connected

    @property
    def connections(self) -> int:
        """Connections made so far (1 after connecting; one more per reconnect)."""
        return self._c.connections

    def close(self) -> None:
        """Closes the connection; calls still waiting fail with dsec.Unavailable.
        Sandboxes it owns go after their lease (unless detached)."""
        self._c.close()

    def __repr__(self) -> str:
        return f"dsec.{type(self).__name__}({self.address!r})"


class Client(_Connection):
    """A connection to dsecd (it reconnects by itself after a restart).

    address: "host:port" of dsecd's SDK port; None: $DSEC_ADDR, else the
    address in <data_dir>/dsecd.json, else 127.0.0.1:7400. The token comes
    from `token`, $DSEC_SDK_TOKEN, `token_file` or <data_dir>/sdk.token
    (data_dir: $DSEC_DATA_DIR, else ./dsec-data). connect_timeout and
    rpc_timeout are in seconds (None: 5 and 30). Thread-safe."""

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def run(self, cmd: _args.Command, *, kind: Optional[str] = None, image: Optional[str] = None,
            timeout: Optional[float] = None, stdin: Union[bytes, str, None] = None,
            env: Optional[Mapping[str, str]] = None, cwd: Optional[_args.PathArg] = None, limits: Any = None,
            memory: Optional[int] = None, network: Any = None, spec: Any = None) -> ExecResult:
        """Runs `cmd` once in a fresh sandbox (default kind fncall) and returns its result.

        A str runs with sh -c; a list is the argv. `timeout` in seconds."""
        s = _args.spec(kind, image, default_kind="fncall", spec=spec, memory=memory, network=network)
        req = _args.exec_request(cmd, stdin=stdin, env=env, cwd=cwd, timeout=timeout, limits=limits)
        return self._c.run(s, req, None)

    def create(self, *, kind: Optional[str] = None, image: Optional[str] = None, id: Optional[str] = None,
               detached: bool = False, lease: Optional[float] = None, spec: Any = None, limits: Any = None,
               timeout: Optional[float] = None, memory: Optional[int] = None, network: Any = None,
               env: Optional[Mapping[str, str]] = None, workdir: Optional[str] = None,
               labels: Optional[Mapping[str, str]] = None, isolation: Optional[str] = None,
               ttl: Optional[float] = None, idle_timeout: Optional[float] = None,
               on_idle: Optional[str] = None) -> Sandbox:
        """Creates a sandbox (a context manager: destroyed when the block ends).

        id: [a-z0-9-], at most 64 bytes (None: one is made up). It belongs to
        this client and goes `lease` seconds after the client is gone, unless
        detached. `timeout` (seconds) is each exec's default time limit."""
        s = _args.spec(kind, image, spec=spec, limits=limits, timeout=timeout, memory=memory, network=network,
                       env=env, workdir=workdir, labels=labels, isolation=isolation, ttl=ttl,
                       idle_timeout=idle_timeout, on_idle=on_idle)
        return Sandbox(self, self._c.create(s, _args.text(id or "", "id"), _flag(detached, "detached"),
                                            _args.whole_seconds(lease, "lease") or 0, None))

    def attach(self, sandbox_id: str) -> Sandbox:
        """A handle to an existing sandbox (dsec.NotFound if there is none)."""
        return Sandbox(self, self._c.attach(_args.name(sandbox_id, "sandbox id"), None))

    def list_sandboxes(self, *, state: Any = None, kind: Any = None, image: Optional[str] = None,
                       labels: Optional[Mapping[str, str]] = None, owner: Optional[str] = None,
                       created_after: Optional[float] = None, session: Optional[str] = None,
                       node: Optional[str] = None, limit: int = 0, page_token: str = "") -> SandboxPage:
        """One page of the sandboxes that match every filter given, in the order of their ids.

        state and kind take a name or a list ("running", ["container", "microvm"]);
        labels must all match; created_after is seconds since the epoch. limit 0
        means 100 (at most 1000); pass the page's next_page_token as page_token
        for the next one. A controller lists every node's."""
        f = _args.list_filter(state=state, kind=kind, image=image, labels=labels, owner=owner,
                              created_after=created_after, session=session, node=node, limit=limit,
                              page_token=page_token)
        return self._c.list_sandboxes(f, None)

    def open_session(self, name: str, *, kind: Optional[str] = None, image: Optional[str] = None,
                     sandboxes: Optional[Mapping[str, Any]] = None, lease: Optional[float] = None,
                     spec: Any = None, limits: Any = None, timeout: Optional[float] = None,
                     memory: Optional[int] = None, network: Any = None, env: Optional[Mapping[str, str]] = None,
                     workdir: Optional[str] = None, restartable: bool = False, grade: Any = None) -> Session:
        """Opens the session `name` (e.g. "job1/p0/s0"), or opens it again
        (the same arguments: idempotent). Its "agent" sandbox has the given
        spec; `sandboxes` adds more by role ({"eval": {"kind": "container",
        "image": "py311"}}). It outlives this trainer by `lease` seconds.
        `restartable` (against a controller): the controller keeps a copy of
        the step log, and when the session's node dies it opens the session
        on another node and re-runs the logged steps there. `grade` (a dsec.GradeSpec or
        dict: command, timeout_s, network, grader_image) is how Session.grade() grades it;
        it needs a task root in the spec (spec={"task": TaskGuard(root=...)})."""
        s = _args.spec(kind, image, spec=spec, limits=limits, timeout=timeout, memory=memory, network=network,
                       env=env, workdir=workdir)
        return Session(self, self._c.open_session(_args.name(name, "session name"), s,
                                                  _args.more_sandboxes(sandboxes),
                                                  _args.whole_seconds(lease, "lease") or 0,
                                                  _flag(restartable, "restartable"), _grade(grade), None))

    def attach_session(self, name: str) -> Session:
        """A handle to an open session (dsec.NotFound if there is none)."""
        return Session(self, self._c.attach_session(_args.name(name, "session name"), None))

    def register_image(self, manifest: Union[ImageManifest, Mapping[str, Any]], *,
                       replace: bool = False) -> ImageManifest:
        """Registers an EROFS image file (dsec-image build makes and registers them)."""
        return self._c.register_image(_args.fields(manifest, "manifest", ImageManifest), _flag(replace, "replace"), None)

    def get_image(self, name: str) -> ImageManifest:
        return self._c.get_image(_args.name(name, "image name"), None)

    def list_images(self) -> List[ImageManifest]:
        return self._c.list_images(None)

    def remove_image(self, name: str) -> None:
        self._c.remove_image(_args.name(name, "image name"), None)

    def get_snapshot(self, name: str) -> SnapshotInfo:
        return self._c.get_snapshot(_args.name(name, "snapshot name"), None)

    def list_snapshots(self) -> List[SnapshotInfo]:
        """Every node's snapshots, each with its users (sandboxes and snapshots that need it)."""
        return self._c.list_snapshots(None)

    def remove_snapshot(self, name: str) -> None:
        """Refused (dsec.FailedPrecondition, naming them) while sandboxes or snapshots need it."""
        self._c.remove_snapshot(_args.name(name, "snapshot name"), None)

def _grade(grade: Any) -> Optional[Dict[str, Any]]:
    return None if grade is None else _args.fields(grade, "grade", GradeSpec)


def _nonneg(v: Any, what: str, most: int = _args.U64) -> int:
    return _args.count(v, what, most)


def _mode(v: Any) -> int:
    m = _nonneg(v, "mode")
    if m > 0o7777:
        raise _args.InvalidArgument(f"mode {oct(m)} has more than permission bits (at most 0o7777)")
    return m


def _flag(v: Any, what: str) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"dsec: {what} is True or False, not {type(v).__name__}")
    return v


def _write_extras(user: Any, xattrs: Any, replace: Any) -> tuple:
    if user is not None and not isinstance(user, str):
        raise TypeError(f"dsec: user is a name or a uid as a str, not {type(user).__name__}")
    attrs: Dict[str, str] = {}
    for k, v in (xattrs or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError("dsec: xattrs maps names (str) to values (str)")
        attrs[k] = v
    if not isinstance(replace, str):
        raise TypeError(f"dsec: xattrs_replace is a str (a prefix), not {type(replace).__name__}")
    return (user or "", attrs, replace)


def _content(v: Any) -> bytes:
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"dsec: file content is bytes or str, not {type(v).__name__}")
