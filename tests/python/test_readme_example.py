"""The Python SDK's example as written (sdk/python/examples/quickstart.py,
whose first line is dsec.Client("127.0.0.1:7400")) against dsecd as the
README starts it (build/bin/dsecd with its default ports, data in
./dsec-data) and the README's py311 image (dsec-image build --debian
bookworm --packages python3,git py311). Label docs: its image comes from
Debian's packages (debootstrap, cached in /var/cache/dsec/debian)."""

from __future__ import annotations

import ast
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import BIN, SOURCE

README_IMAGE = ["build/bin/dsec-image", "build", "--debian", "bookworm", "--packages", "python3,git", "py311"]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def mounts_under(root: str) -> list:
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return sorted((p for p in points if p.startswith(root + "/")), key=len, reverse=True)


def test_the_quickstart_runs_as_written_against_the_readmes_dsecd() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (dsecd makes namespaces and cgroups; debootstrap)")
    for port in (7400, 7401, 7402):
        if port_in_use(port):
            pytest.skip(f"127.0.0.1:{port} is in use (a dsecd of yours?): the README's dsecd listens there")
    root = tempfile.mkdtemp(prefix="dsec-test-readme-")
    os.symlink(os.path.dirname(os.path.abspath(BIN)), os.path.join(root, "build"))
    os.symlink(os.path.join(os.path.abspath(SOURCE), "sdk"), os.path.join(root, "sdk"))
    log = open(os.path.join(root, "dsecd.log"), "w")
    # As `scripts/dev run` starts it, from the repository's root; only its
    # cgroups go under dsec-test, where leak_check looks, and the host's
    # network is left alone (--no-sandbox-network).
    dsecd = subprocess.Popen(["build/bin/dsecd", "--cgroup-parent", "dsec-test", "--no-sandbox-network"], cwd=root, stdout=log,
                             stderr=subprocess.STDOUT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSEC_")}
    env["PYTHONPATH"] = os.path.join(root, "build", "python")
    try:
        deadline = time.monotonic() + 60
        endpoints = os.path.join(root, "dsec-data", "dsecd.json")
        while not os.path.exists(endpoints):
            assert dsecd.poll() is None, open(os.path.join(root, "dsecd.log")).read()
            assert time.monotonic() < deadline, "dsecd did not start within 60 s"
            time.sleep(0.05)  # waiting for another process's file
        assert json.load(open(endpoints))["sdk"] == "127.0.0.1:7400"
        built = subprocess.run(README_IMAGE, cwd=root, env=env, capture_output=True, text=True, timeout=1500)
        assert built.returncode == 0, built.stderr
        run = subprocess.run([sys.executable, "sdk/python/examples/quickstart.py"], cwd=root, env=env,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout + run.stderr
        lines = run.stdout.splitlines()  # print(...stdout), then print(chunk.data) per chunk
        assert lines[0] == "b'hi\\n'", run.stdout
        assert b"".join(ast.literal_eval(line) for line in lines[1:]) == b"1\n2\n3\n", run.stdout
        # What it left open (its session, for the lease) goes before dsecd.
        close = subprocess.run([sys.executable, "-c", "import dsec; dsec.Client().attach_session('job1/p0/s0').close()"],
                               cwd=root, env=env, capture_output=True, text=True, timeout=120)
        assert close.returncode == 0, close.stderr
    finally:
        dsecd.send_signal(signal.SIGTERM)
        try:
            dsecd.wait(timeout=60)
        except subprocess.TimeoutExpired:
            dsecd.kill()
            dsecd.wait()
        log.close()
        for point in mounts_under(root):
            subprocess.run(["umount", "-l", point], check=False)
        subprocess.run(["rm", "-rf", "--one-file-system", root], check=False)
