"""Records: what dsec returns (and takes, for specs and limits).

A record's attributes are the fields of its dsec.v1 protobuf message
(sdk/proto/dsec/v1/types.proto documents each): enums as short lower-case
names ("ok", "container", "running"), bytes fields as ``bytes``, maps as
dicts, unset optional fields as ``None``. Records compare by value and turn
into plain dicts with :meth:`Record.to_dict`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from . import _core


class Record:
    """Base of every record. Build one with keyword arguments (the fields)."""

    _message = ""  # the dsec.v1 message it mirrors

    def __init__(self, **fields: Any) -> None:
        known = _fields(type(self))
        for name in fields:
            if name not in known:
                raise TypeError(
                    f"{type(self).__name__} has no field {name!r} (its fields: {', '.join(sorted(known))})")
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> Any:
        # A field left out of the keyword arguments reads as None.
        if name in _fields(type(self)):
            return None
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def to_dict(self) -> Dict[str, Any]:
        """The fields as plain dicts and lists, all the way down."""
        return {k: _plain(v) for k, v in self.__dict__.items()}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.__dict__ == self.__dict__

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={_short(v)}" for k, v in self.__dict__.items() if v not in (None, "", b"", 0, [], {}))
        return f"{type(self).__name__}({shown})"


def _fields(cls: type) -> set:
    cached = cls.__dict__.get("_field_set")
    if cached is None:
        cached = set()
        for c in cls.__mro__:
            cached.update(getattr(c, "__annotations__", {}))
        cached.discard("_message")
        cls._field_set = cached
    return cached


def _plain(v: Any) -> Any:
    if isinstance(v, Record):
        return v.to_dict()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


class Limits(Record):
    """Resource limits (0: the node's default). Sizes in bytes, times in ms."""

    _message = "dsec.v1.Limits"
    memory_bytes: int
    pids: int
    cpu_millis: int
    timeout_ms: int
    cpu_time_ms: int
    output_bytes: int
    file_size_bytes: int
    open_files: int
    disk_bytes: int


class HostPort(Record):
    _message = "dsec.v1.HostPort"
    host: str
    port: int


class NetworkPolicy(Record):
    """A sandbox's network: ``mode`` none (the default), allow (only the ``allow``
    entries, e.g. "pypi.org:443", "10.0.0.0/8:80,443/tcp", "*.pythonhosted.org") or
    open; ``expose``: TCP ports inside reachable from the host through dsec
    (docs/running.md, "Network")."""

    _message = "dsec.v1.NetworkPolicy"
    mode: str
    allow: List[str]
    expose: List[int]


class TaskGuard(Record):
    """A task's paths the kernel guards in a container: globs relative to ``root``
    (docs/running.md, "Guarding a task's paths")."""

    _message = "dsec.v1.TaskGuard"
    root: str
    protected_paths: List[str]
    hidden_paths: List[str]


class GradeSpec(Record):
    """How Session.grade() grades a session (docs/running.md, "Grading a session"): the
    command (argv) run in a fresh sandbox that gets the agent's changes under the task
    root, its time limit, the grading phase's network and the grader image."""

    _message = "dsec.v1.GradeSpec"
    command: List[str]
    timeout_s: int
    network: NetworkPolicy
    grader_image: str


class Flag(Record):
    """Misbehaviour seen during a step: ``what`` ("protected_write") and its evidence."""

    _message = "dsec.v1.Flag"
    what: str
    evidence: str


class StepFlag(Record):
    """One flag of Session.report(): the step that raised it, what, and the evidence."""

    _message = ""
    step: int
    what: str
    evidence: str


class SandboxSpec(Record):
    """What a sandbox is: kind, image, limits, network, environment."""

    _message = "dsec.v1.SandboxSpec"
    kind: str
    image: str
    limits: Limits
    network: NetworkPolicy
    env: Dict[str, str]
    workdir: str
    labels: Dict[str, str]
    isolation: str
    ttl_s: Optional[int]
    idle_timeout_s: Optional[int]
    on_idle: str
    task: TaskGuard
    snapshot: str  # start from this snapshot (its image and kind come with it)
    resume_on_call: bool  # a call while it is paused resumes it (off: a pause is often to free memory)
    on_ttl: str  # what the end of its ttl does: "destroy" (unspecified) or "pause" (E2B's autoPause)


class NetworkRefusal(Record):
    """One refused connection ("tcp 198.51.100.3:80") or name ("name github.com")."""

    _message = "dsec.v1.NetworkRefusal"
    at_ms: int
    what: str


class ExposedPort(Record):
    """A TCP port inside the sandbox and where the host reaches it ("127.0.0.1:41234")."""

    _message = "dsec.v1.ExposedPort"
    port: int
    address: str


class NetworkReport(Record):
    """A sandbox's address and what its policy refused (since the node's dsecd started)."""

    _message = "dsec.v1.NetworkReport"
    address: str
    refused_packets: int
    refused_names: int
    recent: List[NetworkRefusal]
    exposed: List[ExposedPort]


class SandboxRecord(Record):
    """A sandbox as the node knows it (Sandbox.get())."""

    _message = "dsec.v1.SandboxRecord"
    id: str
    spec: SandboxSpec
    phase: str
    node_id: str
    created_ms: int
    updated_ms: int
    error: str
    exec_count: int
    restarts: int
    owner: str
    lease_s: int
    session: str
    ttl_deadline_ms: int
    last_active_ms: int
    expires_ms: int
    expires_because: str
    expiry_action: str
    pause_reason: str
    disk_used_bytes: int
    busy: bool
    owner_gone_ms: int
    node_address: str  # the SDK address of the node that holds it (against a controller)
    network: NetworkReport  # a sandbox with a network link: its address and refusals
    paused_memory: bool  # paused with its memory freed (pause(memory=True))


class ExecRequest(Record):
    _message = "dsec.v1.ExecRequest"
    sandbox_id: str
    argv: List[str]
    env: Dict[str, str]
    cwd: str
    stdin: bytes
    limits: Limits
    stream: bool
    stream_id: int
    idempotency_key: str


class ExecResult(Record):
    """The outcome of a run, an exec or a step.

    ``verdict`` is "ok", "runtime_error", "time_limit", "memory_limit",
    "output_limit" or "platform_error"; ``exit_code`` is valid when
    ``signal`` is 0.
    """

    _message = "dsec.v1.ExecResult"
    verdict: str
    exit_code: int
    signal: int
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    cpu_us: int
    wall_us: int
    peak_memory_bytes: int
    error: str
    sandbox_id: str
    run_id: str
    exec_failed: bool

    @property
    def text(self) -> str:
        """stdout decoded as UTF-8 (undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        """The program exited with status 0."""
        return self.verdict == "ok"

    @property
    def cpu_ms(self) -> float:
        return self.cpu_us / 1000.0

    @property
    def wall_ms(self) -> float:
        return self.wall_us / 1000.0

    @property
    def peak_memory(self) -> int:
        """Largest resident set of any of its processes, in bytes."""
        return self.peak_memory_bytes

    @property
    def truncated(self) -> bool:
        """stdout or stderr passed its cap (Limits.output_bytes)."""
        return bool(self.stdout_truncated or self.stderr_truncated)


class FileInfo(Record):
    _message = "dsec.v1.FileInfo"
    name: str
    mode: int
    size: int
    mtime_ms: int
    link_target: str
    uid: int
    gid: int
    owner: str  # names in the sandbox's /etc/passwd and /etc/group ("" when none)
    group: str
    xattrs: Dict[str, str]  # its user.* extended attributes, without "user."


class ProcessInfo(Record):
    """A running exec (Sandbox.processes)."""

    _message = "dsec.v1.ProcessInfo"
    pid: int
    argv: List[str]
    cwd: str
    uid: int
    running_ms: int
    stdin_open: bool


class SandboxUsage(Record):
    """What a sandbox uses now (Sandbox.usage)."""

    _message = "dsec.v1.SandboxUsage"
    at_ms: int
    cpu_count: int
    cpu_ns: int  # CPU time its processes have taken since it started
    cpu_used_pct: float  # of cpu_count CPUs, since the previous reading (or over a quarter second)
    mem_used_bytes: int  # without the page cache it could give back
    mem_cache_bytes: int
    mem_total_bytes: int
    disk_used_bytes: int
    disk_total_bytes: int  # 0: no limit


class FileList(Record):
    """list_files: the path's own FileInfo and, for a directory, its entries."""

    _message = "dsec.v1.FileReply"
    info: FileInfo
    entries: List[FileInfo]


class SessionSandbox(Record):
    _message = "dsec.v1.SessionSandbox"
    role: str
    id: str
    spec: SandboxSpec


class SessionRecord(Record):
    """A session as the node knows it: phase, sandboxes by role, steps logged."""

    _message = "dsec.v1.SessionRecord"
    name: str
    phase: str
    spec: SandboxSpec
    created_ms: int
    updated_ms: int
    step_count: int
    restarts: int
    sandboxes: List[SessionSandbox]
    ready: bool
    lease_s: int
    close_reason: str
    closed_ms: int
    error: str
    node_id: str       # the node that holds it (against a controller)
    node_address: str  # that node's SDK address
    restartable: bool  # opened restartable: a controller re-runs it on another node when its node dies
    moves: int         # times a controller did so
    grade: GradeSpec   # as opened (Session.grade)
    grading: int       # a grade begun and not finished: its step + 1 (0: none)
    flags: int         # flags its steps raised (Session.report lists them)


class StepMeta(Record):
    """What the trainer attaches to a step: reward, token counts, notes."""

    _message = "dsec.v1.StepMeta"
    reward: Optional[float]
    prompt_tokens: int
    completion_tokens: int
    notes: Dict[str, str]


class StepRecord(Record):
    """A logged step: its request, its result, when, in which role, and its meta."""

    _message = "dsec.v1.StepRecord"
    session: str
    index: int
    request: ExecRequest
    result: ExecResult
    started_ms: int
    finished_ms: int
    sandbox: str
    meta: StepMeta
    not_replayable: bool
    flags: List[Flag]


class StepReply(Record):
    """Session.step's answer: the logged step, and whether it ran just now."""

    _message = "dsec.v1.StepReply"
    step: StepRecord
    fast_forwarded: bool

    @property
    def result(self) -> ExecResult:
        return self.step.result

    @property
    def replayed(self) -> bool:
        """Answered from the log (it had run before); the program did not run again."""
        return self.fast_forwarded


class SandboxPage(Record):
    """A page of Client.list_sandboxes: the records, and where the next page
    starts (pass it as page_token; "" after the last page)."""

    _message = "dsec.v1.ListSandboxesReply"
    sandboxes: List[SandboxRecord]
    next_page_token: str


class StepsPage(Record):
    _message = "dsec.v1.StepsReply"
    session: SessionRecord
    steps: List[StepRecord]


class ImageManifest(Record):
    """A registered image: its EROFS file, digest and what it was built from."""

    _message = "dsec.v1.ImageManifest"
    name: str
    digest: str
    size_bytes: int
    source: str
    created_ms: int
    file: str
    files: int
    content_bytes: int
    compression: str


class SnapshotInfo(Record):
    """A named, read-only state of a sandbox that new sandboxes start from
    (Sandbox.snapshot; create(snapshot=...)). It lives on the node it was taken on."""

    _message = "dsec.v1.SnapshotInfo"
    name: str
    kind: str
    source_sandbox: str
    image: str
    image_digest: str
    parent: str
    depth: int
    size_bytes: int
    entries: int
    created_ms: int
    node: str
    ephemeral: bool
    users: List[str]
    dir: str


for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, Record) and _cls._message:
        _core._register_record(_cls._message, _cls)

KINDS = tuple(_core._enum_names("dsec.v1.Kind"))
VERDICTS = tuple(_core._enum_names("dsec.v1.Verdict"))
