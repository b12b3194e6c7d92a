"""A server of `hfbert.serve` for the tests, on loopback only: uvicorn in a thread of the test process, bound to a
free port of 127.0.0.1, started and stopped within bounded time."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

START_SECONDS = 60


class RunningServer:
    """`app` served by uvicorn on 127.0.0.1:<free port> in a daemon thread; `url` its address; `stop()` shuts it
    down gracefully (bounded)."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=10)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_SECONDS
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the test server did not start within {START_SECONDS} s")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.socket.close()
