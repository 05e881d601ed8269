"""dsec's exceptions: one class per status code of the C++ SDK (dsec::Status).

Every call raises a subclass of :class:`dsec.Error`; its ``message`` is the
server's (what failed, on which object, and what to do about it).
"""

from __future__ import annotations

from typing import Dict, Type


class Error(Exception):
    """A dsec call failed. ``code`` names the status ("not_found", ...)."""

    code: str = "unknown"

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code


class InvalidArgument(Error, ValueError):
    """A bad argument: the message names it and says what is allowed."""

    code = "invalid_argument"


class NotFound(Error, LookupError):
    """No sandbox, session, image or file by that name."""

    code = "not_found"


class AlreadyExists(Error):
    """The id or name is taken."""

    code = "already_exists"


class FailedPrecondition(Error):
    """The object is not in a state that allows the call (paused, closed, ...)."""

    code = "failed_precondition"


class ResourceExhausted(Error):
    """The node is full (sandboxes, memory, pending calls): try later or elsewhere."""

    code = "resource_exhausted"


class Unavailable(Error):
    """dsecd cannot be reached, or the connection dropped during the call.

    The client reconnects by itself: calling again is the fix."""

    code = "unavailable"


class DeadlineExceeded(Error):
    """No answer within the call's time limit."""

    code = "deadline_exceeded"


class Internal(Error):
    """dsecd failed in a way that is not the caller's fault (see its log)."""

    code = "internal"


class Unimplemented(Error):
    """The kind or node does not do this (e.g. streaming from a fncall sandbox)."""

    code = "unimplemented"


class Aborted(Error):
    """The call was cut short (its sandbox went away, a conflicting call won)."""

    code = "aborted"


class Unauthenticated(Error):
    """The SDK token is missing or wrong (dsecd's <data-dir>/sdk.token)."""

    code = "unauthenticated"


# Codes as in dsec::Status::Code / dsec.v1.Status.Code.
BY_CODE: Dict[int, Type[Error]] = {
    1: InvalidArgument,
    2: NotFound,
    3: AlreadyExists,
    4: FailedPrecondition,
    5: ResourceExhausted,
    6: Unavailable,
    7: DeadlineExceeded,
    8: Internal,
    9: Unimplemented,
    10: Aborted,
    11: Unauthenticated,
}
