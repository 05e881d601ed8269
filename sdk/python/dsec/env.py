"""dsec.env: a Gymnasium-shaped environment over a dsec session.

An episode is a session: ``reset()`` opens a new one (and runs the optional
setup command as step 0); each ``step(action)`` runs the action (a shell
command, or an argv list) as the session's next logged step. The reward is
the caller's: ``reward_fn(action, result, env) -> float``, and the episode
ends when ``done_fn(action, result, env)`` says so (terminated) or after
``max_steps`` actions (truncated). Each reward is logged with its step
(Session.annotate), so dsec-replay shows it.

It has the methods and return values of gymnasium.Env (reset -> (obs,
info); step -> (obs, reward, terminated, truncated, info)) without
depending on gymnasium, which Debian 12 does not package.

    def reward(action, result, env):
        return 1.0 if b"PASS" in result.stdout else 0.0

    e = dsec.env.SandboxEnv(client, kind="container", image="py311", reward_fn=reward,
                            done_fn=lambda a, r, env: b"PASS" in r.stdout, max_steps=8)
    obs, info = e.reset()
    obs, reward, terminated, truncated, info = e.step("python3 -m pytest -q")
    e.close()

With ``reward_from_grade=True`` (and a ``grade`` spec and a task root:
Session.grade), the last step of an episode (terminated or truncated) is
followed by the session's grade, logged as the next step, and that step's
reward is the grade's (the others' are reward_fn's, 0.0 by default);
info["grade"] says how the grade went.

Observations are the step's output as text (stdout, then stderr). A
trainer that is killed and started again can pass the same ``name_prefix``
and ``seed``: the episode's session is opened again by name and its steps
are answered from the log.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, Optional, Tuple

from ._client import Client, Session
from ._records import ExecResult

RewardFn = Callable[[Any, ExecResult, "SandboxEnv"], float]
DoneFn = Callable[[Any, ExecResult, "SandboxEnv"], bool]


def _observation(result: ExecResult) -> str:
    return result.text + result.stderr_text


class SandboxEnv:
    """A Gymnasium-shaped environment whose episodes are dsec sessions."""

    metadata: Dict[str, Any] = {"render_modes": []}

    def __init__(self, client: Client, *, kind: str = "container", image: Optional[str] = None,
                 reward_fn: Optional[RewardFn] = None, done_fn: Optional[DoneFn] = None, max_steps: int = 16,
                 setup: Any = None, name_prefix: str = "env", step_timeout: Optional[float] = None,
                 lease: Optional[float] = None, close_sessions: bool = True, reward_from_grade: bool = False,
                 **spec: Any) -> None:
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive int (got {max_steps!r})")
        self.client = client
        if reward_from_grade and not spec.get("grade"):
            raise ValueError("reward_from_grade needs a grade spec (grade={'command': [...]}) and a task root")
        self.reward_from_grade = reward_from_grade
        self.reward_fn = reward_fn or (lambda action, result, env: 0.0 if reward_from_grade else 1.0 if result.ok else 0.0)
        self.done_fn = done_fn or (lambda action, result, env: False)
        self.max_steps = max_steps
        self.setup = setup
        self.name_prefix = name_prefix
        self.step_timeout = step_timeout
        self.close_sessions = close_sessions
        self._open = dict(kind=kind, image=image, lease=lease, **spec)
        self._episodes = itertools.count()
        self.session: Optional[Session] = None
        self.index = 0           # the next step's index in the session's log
        self.actions = 0         # actions taken in this episode
        self.last_result: Optional[ExecResult] = None

    def reset(self, *, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None) -> Tuple[str, Dict[str, Any]]:
        """Starts an episode: a new session named <name_prefix>/<seed or a counter>.

        options["name"] names the session instead. Returns (observation, info)."""
        self._finish()
        options = options or {}
        episode = seed if seed is not None else next(self._episodes)
        name = options.get("name") or f"{self.name_prefix}/{episode}"
        self.session = self.client.open_session(name, **self._open)
        self.index = 0
        self.actions = 0
        self.last_result = None
        obs = ""
        info: Dict[str, Any] = {"session": name}
        if self.setup is not None:
            reply = self.session.step(self.index, self.setup, timeout=self.step_timeout)
            self.index += 1
            obs = _observation(reply.result)
            info["replayed"] = reply.replayed
        return obs, info

    def step(self, action: Any) -> Tuple[str, float, bool, bool, Dict[str, Any]]:
        """Runs `action` as the next step: (observation, reward, terminated, truncated, info)."""
        if self.session is None:
            raise RuntimeError("call reset() before step()")
        reply = self.session.step(self.index, action, timeout=self.step_timeout)
        result = reply.result
        self.last_result = result
        reward = float(self.reward_fn(action, result, self))
        if not reply.replayed or reply.step.meta.reward != reward:
            self.session.annotate(self.index, reward=reward)
        self.index += 1
        self.actions += 1
        terminated = bool(self.done_fn(action, result, self))
        truncated = not terminated and self.actions >= self.max_steps
        info = {"exit_code": result.exit_code, "verdict": result.verdict, "replayed": reply.replayed,
                "step": self.index - 1, "session": self.session.name}
        if self.reward_from_grade and (terminated or truncated):
            graded = self.session.grade(self.index)
            self.index += 1
            reward = float(graded.step.meta.reward or 0.0)
            info["grade"] = (graded.step.meta.notes or {}).get("grade", "")
        return _observation(result), reward, terminated, truncated, info

    def close(self) -> None:
        """Ends the current episode (closes its session unless close_sessions is False)."""
        self._finish()

    def _finish(self) -> None:
        if self.session is not None and self.close_sessions:
            self.session.close()
        self.session = None

    def __enter__(self) -> "SandboxEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
