"""dsec: sandboxes for training and evaluating AI agents, from Python.

A binding of dsec's C++ SDK: a Python trainer talks to dsecd over the same
remote-actor path as a C++ one.

    import dsec
    client = dsec.Client()                 # $DSEC_ADDR, ./dsec-data/dsecd.json, or 127.0.0.1:7400
    r = client.run(["python3", "-c", "print(6*7)"], timeout=2)
    assert r.stdout == b"42\\n" and r.verdict == "ok"

    with client.create(kind="container", image="py311") as sb:   # destroyed at the end
        sb.write_file("/work/a.py", "print('hi')")
        print(sb.exec("python3 /work/a.py").text)

    async with dsec.AsyncClient() as c:    # asyncio: thousands of calls from one thread
        results = await asyncio.gather(*(c.run(["/bin/true"]) for _ in range(1000)))

Errors are exceptions, one class per status code (dsec.NotFound, ...), all
subclasses of dsec.Error, carrying dsecd's message. docs/python.md has more.
"""

from . import _core
from ._errors import (Aborted, AlreadyExists, DeadlineExceeded, Error, FailedPrecondition, Internal,
                      InvalidArgument, NotFound, ResourceExhausted, Unauthenticated, Unavailable, Unimplemented,
                      BY_CODE as _BY_CODE)

_core._set_error_classes(dict(_BY_CODE))
import threading as _threading
_core._set_main_thread(_threading.main_thread().ident)

from ._records import (KINDS, VERDICTS, ExecRequest, ExecResult, FileInfo, FileList, ProcessInfo, SandboxUsage, HostPort, ImageManifest,
                       Limits, Flag, StepFlag, GradeSpec, NetworkPolicy, NetworkRefusal, TaskGuard, NetworkReport, ExposedPort, Record, SandboxPage, SandboxRecord, SandboxSpec, SessionRecord, SessionSandbox,
                       SnapshotInfo, StepMeta, StepRecord, StepReply)
from ._client import Chunk, Client, ExecStream, FsEvent, Sandbox, Session, Watch
from ._aio import AsyncClient, AsyncExecStream, AsyncOpening, AsyncSandbox, AsyncSession, AsyncWatch
from . import env

__version__ = "0.1.0"

__all__ = [
    "Client", "Sandbox", "Session", "ExecStream", "Chunk", "Watch", "FsEvent",
    "AsyncClient", "AsyncSandbox", "AsyncSession", "AsyncExecStream", "AsyncOpening", "AsyncWatch",
    "Record", "ExecResult", "ExecRequest", "SandboxSpec", "TaskGuard", "GradeSpec", "Flag", "StepFlag", "SandboxRecord", "SandboxPage", "Limits", "NetworkPolicy", "NetworkReport",
    "NetworkRefusal", "ExposedPort", "HostPort",
    "FileInfo", "FileList", "ProcessInfo", "SandboxUsage", "SessionRecord", "SessionSandbox", "StepMeta", "StepRecord", "StepReply",
    "ImageManifest", "SnapshotInfo", "KINDS", "VERDICTS",
    "Error", "InvalidArgument", "NotFound", "AlreadyExists", "FailedPrecondition", "ResourceExhausted",
    "Unavailable", "DeadlineExceeded", "Internal", "Unimplemented", "Aborted", "Unauthenticated",
    "env",
]
