"""dsec.env.SandboxEnv: Gymnasium's reset/step contract over a session."""

from __future__ import annotations

import pytest

import dsec
import dsec.env
from conftest import IMAGE


def test_an_episode_has_gymnasiums_shape(cclient: dsec.Client) -> None:
    def reward(action, result, env):
        return 1.0 if b"PASS" in result.stdout else -0.1

    def done(action, result, env):
        return b"PASS" in result.stdout

    env = dsec.env.SandboxEnv(cclient, kind="container", image=IMAGE, reward_fn=reward, done_fn=done, max_steps=5,
                              setup="mkdir -p /work/t && echo ready", name_prefix="pytest-env")
    obs, info = env.reset(seed=1)
    assert obs == "ready\n" and info["session"] == "pytest-env/1" and not info["replayed"]
    obs, r, terminated, truncated, info = env.step("echo 'print(\"FAIL\")' > /work/t/check.py; python3 /work/t/check.py")
    assert (obs, r, terminated, truncated) == ("FAIL\n", -0.1, False, False)
    assert info["exit_code"] == 0 and info["verdict"] == "ok" and info["step"] == 1
    obs, r, terminated, truncated, info = env.step(["sh", "-c", "echo PASS"])
    assert (obs, r, terminated, truncated) == ("PASS\n", 1.0, True, False)
    logged = env.session.steps()
    assert [s.meta.reward for s in logged] == [None, -0.1, 1.0]  # rewards are logged with their steps
    env.close()
    assert cclient.attach_session("pytest-env/1").get().phase == "closed"


def test_an_episode_is_truncated_after_max_steps(cclient: dsec.Client) -> None:
    with dsec.env.SandboxEnv(cclient, kind="fncall", max_steps=2, name_prefix="pytest-env-trunc") as env:
        obs, info = env.reset()
        assert obs == "" and info["session"] == "pytest-env-trunc/0"
        _, r, term, trunc, _ = env.step("exit 1")
        assert (r, term, trunc) == (0.0, False, False)  # default reward: 1.0 for exit 0
        _, r, term, trunc, _ = env.step("true")
        assert (r, term, trunc) == (1.0, False, True)
        obs, info = env.reset()  # the next episode: a new session
        assert info["session"] == "pytest-env-trunc/1"


def test_a_restarted_trainer_replays_an_episode_from_the_log(cclient: dsec.Client) -> None:
    actions = ["echo a >> log; wc -l < log", "echo b >> log; wc -l < log"]
    first = dsec.env.SandboxEnv(cclient, kind="container", image=IMAGE, name_prefix="pytest-env-replay",
                                close_sessions=False)
    first.reset(seed=7)
    first.step(actions[0])  # the trainer dies here (its session stays open)
    again = dsec.env.SandboxEnv(cclient, kind="container", image=IMAGE, name_prefix="pytest-env-replay")
    again.reset(seed=7)
    obs, _, _, _, info = again.step(actions[0])
    assert obs == "1\n" and info["replayed"]
    obs, _, _, _, info = again.step(actions[1])
    assert obs == "2\n" and not info["replayed"]
    again.close()


def test_bad_use_is_a_clear_error(cclient: dsec.Client) -> None:
    with pytest.raises(ValueError, match="max_steps"):
        dsec.env.SandboxEnv(cclient, max_steps=0)
    env = dsec.env.SandboxEnv(cclient, kind="fncall")
    with pytest.raises(RuntimeError, match="reset"):
        env.step("true")


def test_the_reward_can_come_from_the_sessions_grade(cclient: dsec.Client) -> None:
    grade = {"command": ["sh", "-c", "grep -q fixed /work/calc.py && echo 1 || echo 0"], "timeout_s": 30}
    with dsec.env.SandboxEnv(cclient, kind="container", image=IMAGE, max_steps=2, name_prefix="pytest-env-grade",
                             reward_from_grade=True, grade=grade, spec={"task": {"root": "/work"}}) as env:
        env.reset()
        _, r, term, trunc, info = env.step("echo broken > /work/calc.py")
        assert (r, term, trunc) == (0.0, False, False) and "grade" not in info
        _, r, term, trunc, info = env.step("echo fixed > /work/calc.py")
        assert (r, term, trunc) == (1.0, False, True) and info["grade"] == "passed, reward from its last line"
        assert [(s.sandbox, s.meta.reward) for s in env.session.steps()] == [("agent", 0.0), ("agent", 0.0),
                                                                              ("grade", 1.0)]
    with pytest.raises(ValueError, match="needs a grade spec"):
        dsec.env.SandboxEnv(cclient, reward_from_grade=True)
