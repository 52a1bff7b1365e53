"""`autoscaler stack up|status|down` starts the broker, Redis and agents and leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stack.processes import free_port, pid_alive, port_open

pytestmark = pytest.mark.integration


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent", *args], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=180)


def test_stack_up_status_down(tmp_path: Path) -> None:
    kafka, redis_port, web = free_port(), free_port(), free_port()
    env = {
        "AUTOSCALER_KAFKA_BOOTSTRAP": f"127.0.0.1:{kafka}",
        "AUTOSCALER_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "AUTOSCALER_WEB_PORT": str(web),
        "AUTOSCALER_STATE_DIR": str(tmp_path / "state"),
        "AUTOSCALER_APP_ID": "stack-test",
    }
    up = cli(["stack", "up"], env)
    assert up.returncode == 0, up.stdout + up.stderr
    state = json.loads((tmp_path / "state" / "stack.json").read_text())
    pids = [state[name]["pid"] for name in ("broker", "redis", "agents")]
    try:
        assert all(pid_alive(pid) for pid in pids)
        assert port_open("127.0.0.1", kafka) and port_open("127.0.0.1", redis_port) and port_open("127.0.0.1", web)
        status = cli(["stack", "status"], env)
        assert status.returncode == 0 and status.stdout.count("yes") >= 6, status.stdout
    finally:
        down = cli(["stack", "down"], env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(pid_alive(pid) for pid in pids)
    assert not port_open("127.0.0.1", kafka) and not port_open("127.0.0.1", redis_port)
