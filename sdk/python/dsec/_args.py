"""Keyword arguments to the request dicts dsec._core takes (checked here, so a
bad argument fails before anything is sent, with a message that names it)."""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from ._errors import InvalidArgument
from ._records import Limits, NetworkPolicy, Record, SandboxSpec

Command = Union[str, Sequence[Union[str, bytes, "os.PathLike[str]"]]]
PathArg = Union[str, bytes, "os.PathLike[str]"]


def text(value: Any, what: str) -> str:
    """UTF-8 text from a str, UTF-8 bytes or a path-like."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgument(
                f"{what} {value!r} is not valid UTF-8: dsec carries names, paths and arguments as UTF-8") from None
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(
                f"{what} {value!r} is not valid UTF-8 text (it holds undecodable bytes, e.g. from a non-UTF-8 file "
                "name): dsec carries names, paths and arguments as UTF-8") from None
        return value
    raise TypeError(f"dsec: {what} must be a str, not {type(value).__name__}")


def path(value: Any, what: str = "path") -> str:
    p = text(value, what)
    if not p:
        raise InvalidArgument(f"{what} is empty: give an absolute path inside the sandbox, e.g. /work/a.py")
    return p


def command(cmd: Any) -> List[str]:
    """A string runs with sh -c; a list is the argv."""
    if isinstance(cmd, (str, bytes)):
        script = text(cmd, "command")
        if not script.strip():
            raise InvalidArgument("the command is empty")
        return ["/bin/sh", "-c", script]
    if isinstance(cmd, (list, tuple)):
        if not cmd:
            raise InvalidArgument("argv is empty: give the program and its arguments, e.g. ['python3', '-c', 'print(1)']")
        return [text(a, f"argv[{i}]") for i, a in enumerate(cmd)]
    raise TypeError(f"dsec: a command is a str (run with sh -c) or a list of arguments, not {type(cmd).__name__}")


U32 = 2**32 - 1
U64 = 2**64 - 1


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"dsec: {what} is a number of seconds, not {type(value).__name__}")
    v = float(value)
    if math.isnan(v):
        raise InvalidArgument(f"{what} is NaN")
    return v


def seconds_to_ms(value: Any, what: str) -> Optional[int]:
    """Positive seconds as milliseconds (at most 2^32-1); None stays None (the node's default)."""
    if value is None:
        return None
    v = _seconds(value, what)
    if v <= 0:
        raise InvalidArgument(f"{what} must be a positive number of seconds (got {value!r}; None: the node's default)")
    if v * 1000 > U32:
        raise InvalidArgument(f"{what} of {value!r} s is too long (at most {U32 // 1000} s)")
    return int(math.ceil(v * 1000))


def whole_seconds(value: Any, what: str) -> Optional[int]:
    """Seconds, rounded up, 0 to 2^32-1; None stays None."""
    if value is None:
        return None
    v = _seconds(value, what)
    if v < 0:
        raise InvalidArgument(f"{what} must not be negative (got {value!r})")
    if v > U32:
        raise InvalidArgument(f"{what} of {value!r} s is too long (at most {U32} s)")
    return int(math.ceil(v))


def count(value: Any, what: str, most: int = U64) -> int:
    """A whole number in [0, most] (numpy's integers too; not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"dsec: {what} is an int, not {type(value).__name__}")
    v = int(value)
    if v < 0:
        raise InvalidArgument(f"{what} must not be negative (got {v})")
    if v > most:
        raise InvalidArgument(f"{what} is too large (got {v}; at most {most})")
    return v


def fields(value: Any, what: str, cls: Optional[type] = None) -> Dict[str, Any]:
    """A record (of class `cls`) or dict as a dict (a copy)."""
    if value is None:
        return {}
    if isinstance(value, Record):
        if cls is not None and not isinstance(value, cls):
            raise TypeError(f"dsec: {what} must be a dict or a dsec.{cls.__name__}, not a dsec.{type(value).__name__}")
        return dict(value.__dict__)
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"dsec: {what} must be a dict or a dsec.{what.capitalize()}, not {type(value).__name__}")


def limits(given: Any, timeout: Any = None, memory: Any = None) -> Optional[Dict[str, Any]]:
    out = fields(given, "limits", Limits)
    ms = seconds_to_ms(timeout, "timeout")
    if ms is not None:
        out["timeout_ms"] = ms
    if memory is not None:
        if isinstance(memory, bool) or not isinstance(memory, numbers.Integral):
            raise TypeError(f"dsec: memory is a number of bytes, not {type(memory).__name__}")
        if memory <= 0:
            raise InvalidArgument(f"memory must be a positive number of bytes (got {memory})")
        out["memory_bytes"] = count(memory, "memory")
    return out or None


def string_map(value: Any, what: str) -> Optional[Dict[str, str]]:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"dsec: {what} must be a dict of str to str, not {type(value).__name__}")
    return {text(k, f"{what} key"): text(v, f"{what}[{k!r}]") for k, v in value.items()}


def network(value: Any) -> Optional[Dict[str, Any]]:
    """None/False/"none": none; True/"open": open; a list of entries ("pypi.org:443",
    "10.0.0.0/8:80,443/tcp"): allow those only; or a NetworkPolicy/dict. The node
    checks the entries and names a bad one."""
    if value is None or value is False or value == "none":
        return None
    if value is True or value == "open":
        return {"mode": "open"}
    if isinstance(value, (NetworkPolicy, Mapping)):
        return fields(value, "network", NetworkPolicy)
    if isinstance(value, (list, tuple)):
        return {"mode": "allow", "allow": [text(e, f"network[{i}]") for i, e in enumerate(value)]}
    raise TypeError(f"dsec: network is None/'none', True/'open', a list of allow entries or a dsec.NetworkPolicy, "
                    f"not {type(value).__name__}")


def exposed_address(record: Any, port: int, sandbox_id: str) -> str:
    """The host address of `record`'s exposed `port`, or NotFound saying how to expose it."""
    net = getattr(record, "network", None)
    for e in (net.exposed if net is not None else []):
        if e.port == port:
            return e.address
    from ._errors import NotFound
    raise NotFound(f"sandbox {sandbox_id}: port {port} is not exposed (create it with network "
                   f"NetworkPolicy(expose=[{port}]) or dsecctl create --expose {port})")


def network_change(value: Any) -> Dict[str, Any]:
    """A policy for set_network: as network(), with "none" sent as such."""
    return network(value) or {"mode": "none"}


def spec(kind: Any = None, image: Any = None, *, default_kind: str = "auto", spec: Any = None, limits: Any = None, timeout: Any = None,
         memory: Any = None, network: Any = None, env: Any = None, workdir: Any = None, labels: Any = None,
         isolation: Any = None, ttl: Any = None, idle_timeout: Any = None, on_idle: Any = None) -> Dict[str, Any]:
    """A SandboxSpec dict: `spec` (a dict or SandboxSpec) with the keyword arguments on top;
    the kind is `kind`, else the spec's, else `default_kind`."""
    out = fields(spec, "spec", SandboxSpec)
    if kind is not None:
        out["kind"] = text(kind, "kind")
    elif not out.get("kind"):
        out["kind"] = default_kind
    if image is not None:
        out["image"] = text(image, "image")
    lim = _limits(limits, timeout, memory)
    if lim:
        out["limits"] = {**fields(out.get("limits"), "limits", Limits), **lim}
    net = _network(network)
    if net:
        out["network"] = net
    if env is not None:
        out["env"] = string_map(env, "env")
    if workdir is not None:
        out["workdir"] = path(workdir, "workdir")
    if labels is not None:
        out["labels"] = string_map(labels, "labels")
    if isolation is not None:
        out["isolation"] = text(isolation, "isolation")
    if ttl is not None:
        out["ttl_s"] = whole_seconds(ttl, "ttl")
    if idle_timeout is not None:
        out["idle_timeout_s"] = whole_seconds(idle_timeout, "idle_timeout")
    if on_idle is not None:
        out["on_idle"] = text(on_idle, "on_idle")
    return out


_limits = limits
_network = network


def exec_request(cmd: Any, *, stdin: Any = None, env: Any = None, cwd: Any = None, timeout: Any = None,
                 limits: Any = None, idempotency_key: Any = None, user: Any = None,
                 interactive: bool = False, pty: Any = None) -> Dict[str, Any]:
    out: Dict[str, Any] = {"argv": command(cmd)}
    if stdin is not None:
        if isinstance(stdin, str):
            stdin = stdin.encode("utf-8")
        if not isinstance(stdin, (bytes, bytearray, memoryview)):
            raise TypeError(f"dsec: stdin must be bytes or str, not {type(stdin).__name__}")
        out["stdin"] = bytes(stdin)
    if env is not None:
        out["env"] = string_map(env, "env")
    if cwd is not None:
        out["cwd"] = path(cwd, "cwd")
    lim = _limits(limits, timeout)
    if lim:
        out["limits"] = lim
    if idempotency_key is not None:
        out["idempotency_key"] = text(idempotency_key, "idempotency_key")
    if user is not None:
        out["user"] = text(user, "user")
    if interactive:
        out["interactive"] = True
    if pty is not None:
        out["pty"] = pty_size(pty)
    return out


def pty_size(v: Any) -> Dict[str, int]:
    """A terminal's (cols, rows)."""
    if not isinstance(v, (tuple, list)) or len(v) != 2:
        raise TypeError(f"dsec: a terminal's size is (cols, rows), not {v!r}")
    return {"cols": count(v[0], "cols", 1000), "rows": count(v[1], "rows", 1000)}


def meta(reward: Any = None, prompt_tokens: Any = None, completion_tokens: Any = None,
         notes: Any = None) -> Optional[Dict[str, Any]]:
    out: Dict[str, Any] = {}
    if reward is not None:
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
            raise TypeError(f"dsec: reward is a number, not {type(reward).__name__}")
        if math.isnan(float(reward)):
            raise InvalidArgument("reward is NaN")
        out["reward"] = float(reward)
    for name, v in (("prompt_tokens", prompt_tokens), ("completion_tokens", completion_tokens)):
        if v is not None:
            out[name] = count(v, name)
    if notes is not None:
        out["notes"] = string_map(notes, "notes")
    return out or None


def index(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"dsec: a step index is an int, not {type(value).__name__}")
    if value < 0:
        raise InvalidArgument(f"step index {value} is negative: steps are numbered from 0")
    return count(value, "step index")


def name(value: Any, what: str) -> str:
    s = text(value, what)
    if not s:
        raise InvalidArgument(f"{what} is empty")
    return s


def more_sandboxes(value: Any) -> Dict[str, Dict[str, Any]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"dsec: sandboxes maps role names to specs (dicts or dsec.SandboxSpec), "
                        f"not {type(value).__name__}")
    out = {}
    for role, s in value.items():
        r = name(role, "sandbox role")
        if isinstance(s, SandboxSpec):
            out[r] = dict(s.__dict__)
        elif isinstance(s, Mapping):
            # The keyword arguments of create() (kind, timeout, ...); other
            # keys are SandboxSpec's own fields (ttl_s, ...).
            kw = {k: v for k, v in s.items() if k in _SPEC_ARGS}
            raw = {**fields(s.get("spec"), "spec", SandboxSpec),
                   **{k: v for k, v in s.items() if k not in _SPEC_ARGS}}
            out[r] = spec(**kw, spec=raw)
        else:
            raise TypeError(f"dsec: sandboxes[{r!r}] must be a dict of spec arguments or a dsec.SandboxSpec, "
                            f"not {type(s).__name__}")
    return out


_SPEC_ARGS = frozenset(["kind", "image", "limits", "timeout", "memory", "network", "env", "workdir", "labels",
                        "isolation", "ttl", "idle_timeout", "on_idle"])


def _names(value: Any, what: str) -> List[str]:
    """One name or a list of them (str each)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise TypeError(f"dsec: {what} is a str or a list of str, not {type(value).__name__}")
    return [text(v, f"{what}[{i}]") for i, v in enumerate(value)]


def list_filter(*, state: Any = None, kind: Any = None, image: Any = None, labels: Any = None, owner: Any = None,
                created_after: Any = None, session: Any = None, node: Any = None, limit: Any = 0,
                page_token: Any = "") -> Dict[str, Any]:
    """A ListSandboxesRequest as a dict; `created_after` in seconds since the epoch (a float, as time.time())."""
    out: Dict[str, Any] = {"phases": _names(state, "state"), "kinds": _names(kind, "kind")}
    if image is not None:
        out["image"] = text(image, "image")
    if labels is not None:
        out["labels"] = string_map(labels, "labels")
    if owner is not None:
        out["owner"] = text(owner, "owner")
    if created_after is not None:
        v = _seconds(created_after, "created_after")
        if v < 0:
            raise InvalidArgument(f"created_after must not be negative (got {created_after!r})")
        out["created_after_ms"] = int(v * 1000)
    if session is not None:
        out["session"] = text(session, "session")
    if node is not None:
        out["node"] = text(node, "node")
    out["limit"] = count(limit, "limit", U32)
    out["page_token"] = text(page_token, "page_token")
    return out

