#!/usr/bin/env python3
"""A minimal asyncio rollout loop: N concurrent rollouts, each a dsec session
whose steps a (toy) policy chooses, with a reward at the end.

    PYTHONPATH=build/python python3 sdk/python/examples/rollouts.py --rollouts 256 --image py311

Kill it (even with kill -9) and start it again with the same --job: every
rollout is replayed from step 0, the steps already in the log are answered
from it without running again, and the rollout goes on from where it was.
"""

import argparse
import asyncio
import sys
import time

import dsec


def policy(rollout: int, step: int, last_output: str) -> str:
    """The agent: here a fixed plan; a real one would call the model with the observation."""
    if step == 0:
        return "mkdir -p /work/task && echo 'def add(a, b): return a + b' > /work/task/sol.py"
    if step == 1:
        return f"python3 -c 'import sys; sys.path.insert(0, \"/work/task\"); import sol; print(sol.add({rollout}, 1))'"
    return "echo attempt >> /work/attempts; wc -l < /work/attempts"


def reward(rollout: int, outputs: list) -> float:
    """1.0 when the solution printed rollout + 1 and every step ran once."""
    right = outputs[1].strip() == str(rollout + 1)
    once = outputs[-1].strip() == str(len(outputs) - 2)
    return 1.0 if right and once else 0.0


async def rollout(c: dsec.AsyncClient, args, i: int, stats: dict) -> float:
    s = await c.open_session(f"{args.job}/r{i}", kind=args.kind, image=args.image, lease=args.lease)
    outputs = []
    for k in range(args.steps):
        action = policy(i, k, outputs[-1] if outputs else "")
        reply = await s.step(k, action, timeout=30)
        outputs.append(reply.result.text)
        stats["replayed" if reply.replayed else "ran"] += 1
        if args.verbose:
            print(f"rollout {i} step {k} {'replayed' if reply.replayed else 'ran'}", flush=True)
    r = reward(i, outputs)
    await s.annotate(args.steps - 1, reward=r, notes={"policy": "toy"})
    if not args.keep:
        await s.close()
    return r


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rollouts", type=int, default=256)
    p.add_argument("--steps", type=int, default=4, help="steps per rollout (at least 3)")
    p.add_argument("--job", default="pyrollouts", help="session names are <job>/r<i>")
    p.add_argument("--kind", default="container")
    p.add_argument("--image", default="py311")
    p.add_argument("--lease", type=float, default=600, help="seconds a session outlives this trainer")
    p.add_argument("--address", default=None, help="dsecd's SDK address (default: as dsec.Client finds it)")
    p.add_argument("--keep", action="store_true", help="leave the sessions open at the end")
    p.add_argument("--verbose", action="store_true", help="a line per step")
    args = p.parse_args()
    if args.steps < 3:
        p.error("--steps must be at least 3")
    stats = {"ran": 0, "replayed": 0}
    t0 = time.monotonic()
    async with dsec.AsyncClient(args.address) as c:
        rewards = await asyncio.gather(*(rollout(c, args, i, stats) for i in range(args.rollouts)))
    dt = time.monotonic() - t0
    print(f"{args.rollouts} rollouts in {dt:.1f} s: mean reward {sum(rewards) / len(rewards):.2f}, "
          f"{stats['ran']} steps ran, {stats['replayed']} answered from the log", flush=True)
    return 0 if all(r == 1.0 for r in rewards) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
