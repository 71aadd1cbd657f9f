"""Real server processes on 127.0.0.1 with the tiny model, started once per session and stopped at the end."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.serve.models import make_tool_model

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
API_KEY = "test-key-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, command: list[str], port: int, log: Path, api_key: str | None = None):
        self.port, self.log, self.api_key = port, log, api_key
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}  # one thread: fast on tiny shapes
        self.process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{log.read_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server did not come up:\n{log.read_text()}")

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def monitor(self) -> dict:
        return httpx.get(self.url + "/monitor", headers=self.headers, timeout=5).json()

    def wait_idle(self, timeout: float = 10) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.monitor()
            if not state["running"] and state["queue_length"] == 0:
                return state
            time.sleep(0.05)
        raise AssertionError(f"server still busy after {timeout} s: {state}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def serve(model: Path, tmp: Path, *args: str, api_key: str | None = None) -> Served:
    port = free_port()
    command = [sys.executable, "-m", "strata", "serve", str(model), "--device", "cpu", "--port", str(port), *args]
    if api_key:
        command += ["--api-key", api_key]
    return Served(command, port, tmp / f"server-{port}.log", api_key)


@pytest.fixture(scope="session")
def tool_model(model_dir) -> Path:
    return make_tool_model(model_dir / "tiny-qwen3moe-tools.gguf")


@pytest.fixture(scope="session")
def server(tool_model, tmp_path_factory):
    """The everyday server: the real tiny model, a queue of 16."""
    served = serve(tool_model, tmp_path_factory.mktemp("serve"), "--model-name", "tiny")
    yield served
    served.stop()


@pytest.fixture(scope="session")
def strict_server(tool_model, tmp_path_factory):
    """A server with an API key and room for one waiting request."""
    served = serve(tool_model, tmp_path_factory.mktemp("serve"), "--model-name", "tiny", "--max-queue", "1",
                   api_key=API_KEY)
    yield served
    served.stop()


@pytest.fixture(scope="session")
def scripted_server(tool_model, tmp_path_factory):
    """The tiny model reading prompts, answering from a script (tool calls, thinking), keep-alive every 0.3 s."""
    port = free_port()
    served = Served([sys.executable, str(HERE / "scripted_server.py"), str(tool_model), str(port)], port,
                    tmp_path_factory.mktemp("serve") / "scripted.log")
    yield served
    served.stop()
