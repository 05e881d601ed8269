"""The asyncio client: dsec.AsyncClient, dsec.AsyncSandbox, dsec.AsyncSession.

Each call is issued through the C++ SDK's callback form and awaits a future
of the running event loop. The SDK thread that receives the answer queues
it on the loop's completer (dsec._core.Completer) and, when that queue was
empty, wakes the loop with loop.call_soon_threadsafe; the loop then settles
every queued future at once. One thread keeps thousands of calls in flight;
no thread per call. Cancelling an await abandons the answer (the
call itself still completes on the node).

The calls that make a sandbox or a session handle (AsyncClient.create,
attach, open_session, attach_session; AsyncSession.sandbox) return an
AsyncOpening: await it for the handle, or use it directly in ``async with``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import weakref
from types import TracebackType
from typing import (Any, Callable, Coroutine, Dict, Generator, Generic, List, Mapping, Optional, ParamSpec, Protocol, Type,
                    TypeVar, Union)

from . import _args, _core
from ._errors import NotFound
from ._client import (Chunk, FsEvent, _Connection, _chunks, _content, _flag, _grade, _mode, _nonneg,
                      _positive_seconds, _write_extras)
from ._records import (ExecResult, FileInfo, FileList, ImageManifest, ProcessInfo, SandboxPage, SandboxRecord, SandboxUsage,
                       SessionRecord, SnapshotInfo,
                       StepFlag, StepMeta,
                       StepRecord, StepReply)


def _settle(fut: "asyncio.Future[Any]", failed: bool, value: Any) -> None:
    if fut.done():  # cancelled by the caller
        return
    if failed:
        fut.set_exception(value)
    else:
        fut.set_result(value)


_core._set_settle(_settle)


_completers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _core.Completer]" = weakref.WeakKeyDictionary()


def _target(loop: asyncio.AbstractEventLoop, fut: "asyncio.Future[Any]") -> tuple:
    c = _completers.get(loop)
    if c is None:
        c = _completers[loop] = _core.Completer(weakref.ref(loop))
    return (loop, fut, c)


async def _call(fn: Any, *args: Any) -> Any:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    fn(*args, _target(loop, fut))
    return await fut


_S = TypeVar("_S")


class _Handle(Protocol):
    """What AsyncOpening needs of a handle: AsyncSandbox and AsyncSession."""

    async def __aenter__(self: _S) -> _S: ...

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                        tb: Optional[TracebackType]) -> Any: ...


_H = TypeVar("_H", bound=_Handle)
_P = ParamSpec("_P")


class AsyncOpening(Coroutine[Any, Any, _H], Generic[_H]):
    """A call that makes a handle, usable two ways:

    ``sb = await c.create(...)`` gives the handle; ``async with c.create(...)
    as sb:`` awaits the call, enters the handle and leaves through the
    handle's own ``__aexit__`` (a sandbox is destroyed, a session closed), as
    ``async with await c.create(...)`` does.

    It is a coroutine (it drives the call's own), so asyncio.create_task and
    asyncio.run take it as they took the coroutine it replaces. Like any
    coroutine it runs once: await it or enter it, not both."""

    __slots__ = ("_coro", "_handle")

    def __init__(self, coro: Coroutine[Any, Any, _H]) -> None:
        self._coro = coro
        self._handle: Optional[_H] = None

    def __await__(self) -> Generator[Any, None, _H]:
        return self._coro.__await__()

    def send(self, value: Any) -> Any:
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Optional[TracebackType] = None) -> Any:
        if val is None and tb is None:
            return self._coro.throw(typ)  # the one-argument form: the others are deprecated in 3.12
        return self._coro.throw(typ, val, tb)

    def close(self) -> None:
        self._coro.close()

    # The call's own frame, for asyncio's task reprs and Task.get_stack().
    @property
    def cr_frame(self) -> Any:
        return getattr(self._coro, "cr_frame", None)

    @property
    def cr_code(self) -> Any:
        return getattr(self._coro, "cr_code", None)

    @property
    def cr_running(self) -> bool:
        return bool(getattr(self._coro, "cr_running", False))

    @property
    def cr_await(self) -> Any:
        return getattr(self._coro, "cr_await", None)

    async def __aenter__(self) -> _H:
        self._handle = await self._coro
        return await self._handle.__aenter__()

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        assert self._handle is not None  # only entered blocks are left
        await self._handle.__aexit__(exc_type, exc, tb)  # neither handle swallows the block's exception

    def __repr__(self) -> str:
        return f"<dsec.AsyncOpening {self._coro!r}>"


def _opening(fn: Callable[_P, Coroutine[Any, Any, _H]]) -> Callable[_P, AsyncOpening[_H]]:
    """`fn`, an ``async def`` that makes a handle, as a call returning an
    AsyncOpening. Nothing runs until it is awaited or entered: bad arguments
    still raise there, as they did from the coroutine."""

    @functools.wraps(fn)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> AsyncOpening[_H]:
        return AsyncOpening(fn(*args, **kwargs))

    # help() and inspect show fn's parameters with what the call returns.
    sig = inspect.signature(fn)
    setattr(call, "__signature__", sig.replace(return_annotation=f"AsyncOpening[{sig.return_annotation}]"))
    return call


_END = object()


class AsyncExecStream:
    """``async for chunk in sandbox.exec_stream(...)``; ``result`` once it has ended."""

    def __init__(self, sb: "_core.Sandbox", req: Any, pty: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self._pty = pty
        self._queue: "asyncio.Queue[Any]" = asyncio.Queue()
        self._done = loop.create_future()
        self.result: Optional[ExecResult] = None
        sb.exec_stream_async(req, self._push, _target(loop, self._done))
        self._done.add_done_callback(lambda _: self._queue.put_nowait(_END))

    def _push(self, stdout: bytes, stderr: bytes) -> None:
        for c in _chunks(stdout, stderr, pty=self._pty):
            self._queue.put_nowait(c)

    def __aiter__(self) -> "AsyncExecStream":
        return self

    async def __anext__(self) -> Chunk:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)  # stays ended
            self.result = self._done.result()  # raises the call's error
            raise StopAsyncIteration
        return item


class AsyncWatch:
    """A directory's changes (AsyncSandbox.watch): ``async for event in w`` as they
    happen, ending as dsec.Watch's does; ``async with`` stops it when the block ends.
    Each wait for the next event holds a thread of the loop's default executor."""

    def __init__(self, core: "_core.Watch") -> None:
        self._w = core

    def __aiter__(self) -> "AsyncWatch":
        return self

    async def __anext__(self) -> FsEvent:
        got = await asyncio.get_running_loop().run_in_executor(None, self._w.next_event)
        if got is None:
            self._w.result()  # raises how it ended, if not cleanly
            raise StopAsyncIteration
        return FsEvent(got[0].decode("utf-8", "replace"), got[1].decode())

    async def stop(self) -> int:
        """Stops it and returns how many events it reported."""
        return await asyncio.get_running_loop().run_in_executor(None, self._w.stop)

    async def __aenter__(self) -> "AsyncWatch":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()


class AsyncSandbox:
    """A sandbox, for asyncio. ``async with`` destroys it when the block ends."""

    def __init__(self, client: "AsyncClient", core: "_core.Sandbox") -> None:
        self._client = client
        self._sb = core

    @property
    def id(self) -> str:
        return self._sb.id

    async def exec(self, cmd: _args.Command, *, stdin: Union[bytes, str, None] = None,
                   env: Optional[Mapping[str, str]] = None, cwd: Optional[_args.PathArg] = None,
                   timeout: Optional[float] = None, limits: Any = None,
                   idempotency_key: Optional[str] = None, user: Optional[str] = None) -> ExecResult:
        """See dsec.Sandbox.exec."""
        req = _args.exec_request(cmd, stdin=stdin, env=env, cwd=cwd, timeout=timeout, limits=limits,
                                 idempotency_key=idempotency_key, user=user)
        return await _call(self._sb.exec, req)

    def exec_stream(self, cmd: _args.Command, *, stdin: Union[bytes, str, None] = None,
                    env: Optional[Mapping[str, str]] = None, cwd: Optional[_args.PathArg] = None,
                    timeout: Optional[float] = None, limits: Any = None,
                    user: Optional[str] = None, interactive: bool = False,
                    pty: Optional[Any] = None) -> AsyncExecStream:
        """Starts the exec now; iterate with ``async for`` (see dsec.Sandbox.exec_stream;
        an interactive one's pid: processes())."""
        req = _args.exec_request(cmd, stdin=stdin, env=env, cwd=cwd, timeout=timeout, limits=limits, user=user,
                                 interactive=_flag(interactive, "interactive") or pty is not None, pty=pty)
        return AsyncExecStream(self._sb, req, pty=pty is not None)

    def attach(self, pid: int, *, timeout: Optional[float] = None) -> AsyncExecStream:
        """A running streamed exec's output from now on, and its result (see
        dsec.Sandbox.attach); iterate with ``async for``."""
        req: Dict[str, Any] = {"attach_pid": _args.count(pid, "pid", 0xFFFFFFFF)}
        ms = _args.seconds_to_ms(timeout, "timeout")
        if ms:
            req["limits"] = {"timeout_ms": ms}
        return AsyncExecStream(self._sb, req)

    async def get(self) -> SandboxRecord:
        return await _call(self._sb.get)

    async def destroy(self) -> None:
        await _call(self._sb.destroy)

    async def pause(self, memory: bool = False) -> None:
        await _call(self._sb.pause, bool(memory))

    async def resume(self) -> None:
        await _call(self._sb.resume)

    async def snapshot(self, name: str) -> SnapshotInfo:
        return await _call(self._sb.snapshot, _args.name(name, "snapshot name"))

    async def fork(self, count: int) -> List["AsyncSandbox"]:
        return [AsyncSandbox(self._client, core) for core in await _call(self._sb.fork, _args.count(count, "count"))]

    async def address(self, port: int) -> str:
        """See dsec.Sandbox.address."""
        return _args.exposed_address(await self.get(), port, self.id)

    async def set_network(self, network: Any, *, change: str) -> SandboxRecord:
        """See dsec.Sandbox.set_network."""
        return await _call(self._sb.set_network, _args.network_change(network), _args.text(change, "change"))

    async def set_timeout(self, seconds: float) -> SandboxRecord:
        """See dsec.Sandbox.set_timeout."""
        return await _call(self._sb.set_timeout, _positive_seconds(seconds))

    async def read_file(self, path: _args.PathArg, *, max_bytes: int = 0) -> bytes:
        return await _call(self._sb.read_file, _args.path(path), _nonneg(max_bytes, "max_bytes"))

    async def write_file(self, path: _args.PathArg, content: Union[bytes, str], *, mode: int = 0o644,
                         make_parents: bool = False, user: Optional[str] = None,
                         xattrs: Optional[Mapping[str, str]] = None, xattrs_replace: str = "") -> None:
        await _call(self._sb.write_file, _args.path(path), _content(content), _mode(mode),
                    _flag(make_parents, "make_parents"), *_write_extras(user, xattrs, xattrs_replace))

    async def processes(self) -> List[ProcessInfo]:
        """The execs running in it now (any client's), oldest first."""
        return await _call(self._sb.process, "list", 0, 0, b"")

    async def usage(self) -> SandboxUsage:
        """What it uses now (Sandbox.usage)."""
        return await _call(self._sb.usage)

    async def signal(self, pid: int, signal: int = 15) -> None:
        """Sends `signal` to the process group of the running exec `pid`."""
        await _call(self._sb.process, "signal", _args.count(pid, "pid", 0xFFFFFFFF), int(signal), b"")

    async def send_input(self, pid: int, data: Union[bytes, str]) -> None:
        """Writes `data` to an interactive exec's stdin, after what came before."""
        await _call(self._sb.process, "input", _args.count(pid, "pid", 0xFFFFFFFF), 0, _content(data))

    async def close_stdin(self, pid: int) -> None:
        """Closes an interactive exec's stdin: it reads end-of-file."""
        await _call(self._sb.process, "close_stdin", _args.count(pid, "pid", 0xFFFFFFFF), 0, b"")

    async def watch(self, path: _args.PathArg, *, recursive: bool = False,
                    timeout: Optional[float] = None) -> AsyncWatch:
        """Watches a directory (see dsec.Sandbox.watch): returns once the watch is in
        place; ``async for`` over it for the changes."""
        ms = _args.seconds_to_ms(timeout, "timeout") or 0
        core = await asyncio.get_running_loop().run_in_executor(
            None, self._sb.watch, _args.path(path), _flag(recursive, "recursive"), ms / 1000.0)
        return AsyncWatch(core)

    async def resize(self, pid: int, cols: int, rows: int) -> None:
        """A terminal exec's terminal to cols x rows (see dsec.Sandbox.resize)."""
        size = _args.pty_size((cols, rows))
        await _call(self._sb.resize, _args.count(pid, "pid", 0xFFFFFFFF), size["cols"], size["rows"])

    async def list_files(self, path: _args.PathArg) -> FileList:
        return await _call(self._sb.list_files, _args.path(path))

    async def make_dir(self, path: _args.PathArg, *, user: Optional[str] = None) -> FileInfo:
        """See dsec.Sandbox.make_dir."""
        return await _call(self._sb.path_op, "make_dir", _args.path(path), "", _args.text(user or "", "user"))

    async def move(self, source: _args.PathArg, destination: _args.PathArg) -> FileInfo:
        return await _call(self._sb.path_op, "move", _args.path(source), _args.path(destination), "")

    async def remove(self, path: _args.PathArg) -> None:
        await _call(self._sb.path_op, "remove", _args.path(path), "", "")

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.destroy()
        except NotFound:
            pass  # destroyed in the block already

    def __repr__(self) -> str:
        return f"dsec.AsyncSandbox({self.id!r})"


class AsyncSession:
    """A rollout session, for asyncio (see dsec.Session)."""

    def __init__(self, client: "AsyncClient", core: "_core.Session") -> None:
        self._client = client
        self._s = core

    @property
    def name(self) -> str:
        return self._s.name

    @property
    def record(self) -> SessionRecord:
        return self._s.record

    async def step(self, index: int, cmd: _args.Command, *, sandbox: str = "agent",
                   stdin: Union[bytes, str, None] = None, env: Optional[Mapping[str, str]] = None,
                   cwd: Optional[_args.PathArg] = None, timeout: Optional[float] = None, limits: Any = None,
                   reward: Optional[float] = None, prompt_tokens: Optional[int] = None,
                   completion_tokens: Optional[int] = None, notes: Optional[Mapping[str, str]] = None,
                   not_replayable: bool = False) -> StepReply:
        req = _args.exec_request(cmd, stdin=stdin, env=env, cwd=cwd, timeout=timeout, limits=limits)
        return await _call(self._s.step, _args.index(index), req, _args.name(sandbox, "sandbox role"),
                           _args.meta(reward, prompt_tokens, completion_tokens, notes),
                           _flag(not_replayable, "not_replayable"))

    async def annotate(self, index: int, *, reward: Optional[float] = None, prompt_tokens: Optional[int] = None,
                       completion_tokens: Optional[int] = None,
                       notes: Optional[Mapping[str, str]] = None) -> StepMeta:
        return await _call(self._s.annotate, _args.index(index),
                           _args.meta(reward, prompt_tokens, completion_tokens, notes))

    async def steps(self, start: int = 0, limit: int = 0) -> List[StepRecord]:
        return (await _call(self._s.steps, _args.index(start), _nonneg(limit, "limit", _args.U32))).steps

    async def fork(self, count: int, names: Optional[List[str]] = None) -> List["AsyncSession"]:
        """As Session.fork()."""
        cores = await _call(self._s.fork, _args.count(count, "count"), [_args.name(n, "session name") for n in names or []])
        return [AsyncSession(self._client, core) for core in cores]

    async def grade(self, index: int) -> StepReply:
        """As Session.grade()."""
        return await _call(self._s.grade, _args.index(index))

    async def report(self) -> List[StepFlag]:
        """As Session.report()."""
        out: List[StepFlag] = []
        start = 0
        while True:
            page = await self.steps(start, 1000)
            out += [StepFlag(step=st.index, what=f.what, evidence=f.evidence) for st in page for f in (st.flags or [])]
            if len(page) < 1000:
                return out
            start = page[-1].index + 1

    async def get(self) -> SessionRecord:
        return await _call(self._s.get)

    @_opening
    async def sandbox(self, role: str = "agent") -> AsyncSandbox:
        return AsyncSandbox(self._client, await _call(self._s.sandbox, _args.name(role, "role")))

    async def close(self) -> None:
        await _call(self._s.close)

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            await self.close()

    def __repr__(self) -> str:
        return f"dsec.AsyncSession({self.name!r})"


class AsyncClient(_Connection):
    """dsec.Client for asyncio: the same arguments; every call is a coroutine.

    The calls that make a sandbox or a session return an AsyncOpening: a
    coroutine that also goes straight into ``async with`` (``async with
    c.create(...) as sb:`` destroys the sandbox when the block ends).
    Connecting happens here, blocking (at most connect_timeout seconds);
    ``async with`` closes the client when the block ends."""

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    async def run(self, cmd: _args.Command, *, kind: Optional[str] = None, image: Optional[str] = None,
                  timeout: Optional[float] = None, stdin: Union[bytes, str, None] = None,
                  env: Optional[Mapping[str, str]] = None, cwd: Optional[_args.PathArg] = None, limits: Any = None,
                  memory: Optional[int] = None, network: Any = None, spec: Any = None) -> ExecResult:
        """See dsec.Client.run."""
        s = _args.spec(kind, image, default_kind="fncall", spec=spec, memory=memory, network=network)
        req = _args.exec_request(cmd, stdin=stdin, env=env, cwd=cwd, timeout=timeout, limits=limits)
        return await _call(self._c.run, s, req)

    @_opening
    async def create(self, *, kind: Optional[str] = None, image: Optional[str] = None, id: Optional[str] = None,
                     detached: bool = False, lease: Optional[float] = None, spec: Any = None, limits: Any = None,
                     timeout: Optional[float] = None, memory: Optional[int] = None, network: Any = None,
                     env: Optional[Mapping[str, str]] = None, workdir: Optional[str] = None,
                     labels: Optional[Mapping[str, str]] = None, isolation: Optional[str] = None,
                     ttl: Optional[float] = None, idle_timeout: Optional[float] = None,
                     on_idle: Optional[str] = None) -> AsyncSandbox:
        """See dsec.Client.create."""
        s = _args.spec(kind, image, spec=spec, limits=limits, timeout=timeout, memory=memory, network=network,
                       env=env, workdir=workdir, labels=labels, isolation=isolation, ttl=ttl,
                       idle_timeout=idle_timeout, on_idle=on_idle)
        core = await _call(self._c.create, s, _args.text(id or "", "id"), _flag(detached, "detached"),
                           _args.whole_seconds(lease, "lease") or 0)
        return AsyncSandbox(self, core)

    @_opening
    async def attach(self, sandbox_id: str) -> AsyncSandbox:
        return AsyncSandbox(self, await _call(self._c.attach, _args.name(sandbox_id, "sandbox id")))

    async def list_sandboxes(self, *, state: Any = None, kind: Any = None, image: Optional[str] = None,
                             labels: Optional[Mapping[str, str]] = None, owner: Optional[str] = None,
                             created_after: Optional[float] = None, session: Optional[str] = None,
                             node: Optional[str] = None, limit: int = 0, page_token: str = "") -> SandboxPage:
        """See dsec.Client.list_sandboxes."""
        f = _args.list_filter(state=state, kind=kind, image=image, labels=labels, owner=owner,
                              created_after=created_after, session=session, node=node, limit=limit,
                              page_token=page_token)
        return await _call(self._c.list_sandboxes, f)

    @_opening
    async def open_session(self, name: str, *, kind: Optional[str] = None, image: Optional[str] = None,
                           sandboxes: Optional[Mapping[str, Any]] = None, lease: Optional[float] = None,
                           spec: Any = None, limits: Any = None, timeout: Optional[float] = None,
                           memory: Optional[int] = None, network: Any = None,
                           env: Optional[Mapping[str, str]] = None, workdir: Optional[str] = None,
                           restartable: bool = False, grade: Any = None) -> AsyncSession:
        """See dsec.Client.open_session."""
        s = _args.spec(kind, image, spec=spec, limits=limits, timeout=timeout, memory=memory, network=network,
                       env=env, workdir=workdir)
        core = await _call(self._c.open_session, _args.name(name, "session name"), s,
                           _args.more_sandboxes(sandboxes), _args.whole_seconds(lease, "lease") or 0,
                           _flag(restartable, "restartable"), _grade(grade))
        return AsyncSession(self, core)

    @_opening
    async def attach_session(self, name: str) -> AsyncSession:
        return AsyncSession(self, await _call(self._c.attach_session, _args.name(name, "session name")))

    async def register_image(self, manifest: Union[ImageManifest, Mapping[str, Any]], *,
                             replace: bool = False) -> ImageManifest:
        return await _call(self._c.register_image, _args.fields(manifest, "manifest", ImageManifest), _flag(replace, "replace"))

    async def get_image(self, name: str) -> ImageManifest:
        return await _call(self._c.get_image, _args.name(name, "image name"))

    async def list_images(self) -> List[ImageManifest]:
        return await _call(self._c.list_images)

    async def remove_image(self, name: str) -> None:
        await _call(self._c.remove_image, _args.name(name, "image name"))

    async def get_snapshot(self, name: str) -> SnapshotInfo:
        return await _call(self._c.get_snapshot, _args.name(name, "snapshot name"))

    async def list_snapshots(self) -> List[SnapshotInfo]:
        return await _call(self._c.list_snapshots)

    async def remove_snapshot(self, name: str) -> None:
        await _call(self._c.remove_snapshot, _args.name(name, "snapshot name"))

