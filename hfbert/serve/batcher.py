"""Requests from all clients batched by a budget of real tokens, the model run on one thread off the event loop.

Each request puts its inputs (texts, or pairs) in one queue, each with its token count. The batcher takes a window
of the oldest inputs (up to `WINDOW` budgets of tokens, so that old inputs are never overtaken for long), groups it by
operation, sorts each group by length and cuts it into batches whose token SUM stays within `max_batch_tokens`: the
encoders run padding-free, so a batch costs its real tokens, not its longest input times its size. A batch runs on
the one model thread (`ThreadPoolExecutor(1)`): the event loop keeps answering `/health`, new connections and
queue-full refusals while the model computes. An input whose request is gone (the client disconnected, the handler
was cancelled) before its batch starts is dropped.

A result does not depend on its batch beyond fp32 rounding: the encoders compute each text from its own tokens only
(docs/serving.md states the bound, tests/test_serve.py checks it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

WINDOW = 4  # budgets of tokens looked at, sorted, and batched together


@dataclass(eq=False)
class Item:
    """One input waiting for the model."""

    operation: Hashable
    payload: Any
    tokens: int
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


class Batcher:
    """Batches `run(operation, payloads) -> results` calls by tokens (see the module docstring). `observe`: called
    with (batch size, batch tokens, seconds queued per input, seconds of inference) after each batch, for metrics."""

    def __init__(
        self,
        run: Callable[[Any, list[Any]], list[Any]],
        max_batch_tokens: int,
        max_batch_requests: int | None = None,
        observe: Callable[[int, int, list[float], float], None] | None = None,
    ) -> None:
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be at least 1, got {max_batch_tokens}")
        self._run = run
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_requests = max_batch_requests
        self._observe = observe
        self._pending: deque[Item] = deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="hfbert-model")

    @property
    def depth(self) -> int:
        """Inputs waiting for the model."""
        return len(self._pending)

    @property
    def running(self) -> bool:
        """Whether the batching task is alive (`/health`)."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start batching on the running event loop."""
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="hfbert-batcher")

    async def close(self) -> None:
        """Stop batching (what was queued fails) and let the model thread finish its batch."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for item in self._pending:
            if not item.future.done():
                item.future.set_exception(RuntimeError("the server is shutting down"))
        self._pending.clear()
        self._executor.shutdown(wait=True)

    async def submit(self, operation: Hashable, payloads: Sequence[Any], tokens: Sequence[int]) -> list[Any]:
        """The results of `payloads` (one operation, each input with its token count), in order, once the model has
        run them. Cancelled (the client left): inputs not yet started are dropped."""
        if not self.running:
            raise RuntimeError("the batcher is not running")
        loop = asyncio.get_running_loop()
        items = [Item(operation, p, t, loop.create_future()) for p, t in zip(payloads, tokens, strict=True)]
        self._pending.extend(items)
        self._wake.set()
        try:
            results = await asyncio.gather(*(item.future for item in items), return_exceptions=True)
        except asyncio.CancelledError:
            for item in items:
                item.future.cancel()
            raise
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                for operation, batch in self._batches(self._window()):
                    live = [item for item in batch if not item.future.done()]  # cancelled: dropped
                    if not live:
                        continue
                    started = time.perf_counter()
                    try:
                        results = await loop.run_in_executor(
                            self._executor, self._run, operation, [item.payload for item in live]
                        )
                    except Exception as error:  # one batch's failure is its requests', not the server's
                        for item in live:
                            if not item.future.done():
                                item.future.set_exception(error)
                        continue
                    finished = time.perf_counter()
                    for item, result in zip(live, results, strict=True):
                        if not item.future.done():
                            item.future.set_result(result)
                    if self._observe is not None:
                        waits = [started - item.enqueued for item in live]
                        self._observe(len(live), sum(item.tokens for item in live), waits, finished - started)

    def _window(self) -> list[Item]:
        """The oldest inputs, up to WINDOW budgets of tokens (one at least)."""
        window, total = [], 0
        while self._pending and (not window or total + self._pending[0].tokens <= WINDOW * self.max_batch_tokens):
            item = self._pending.popleft()
            window.append(item)
            total += item.tokens
        return window

    def _batches(self, window: list[Item]) -> list[tuple[Hashable, list[Item]]]:
        """`window` grouped by operation (the oldest's first), each group sorted by length and cut into batches of at
        most `max_batch_tokens` tokens (an input longer than that runs alone) and `max_batch_requests` inputs."""
        groups: dict[Hashable, list[Item]] = {}
        for item in window:
            groups.setdefault(item.operation, []).append(item)
        batches = []
        for operation, items in groups.items():
            batch: list[Item] = []
            total = 0
            for item in sorted(items, key=lambda item: item.tokens):
                full = self.max_batch_requests is not None and len(batch) >= self.max_batch_requests
                if batch and (total + item.tokens > self.max_batch_tokens or full):
                    batches.append((operation, batch))
                    batch, total = [], 0
                batch.append(item)
                total += item.tokens
            if batch:
                batches.append((operation, batch))
        return batches
