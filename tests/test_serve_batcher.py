"""`hfbert.serve.batcher.Batcher` (issue #66), without a server or a model: inputs from concurrent requests are
batched by the SUM of their tokens (an input over the budget alone), sorted by length within a window, never mixing
operations; every request gets its own results in its order; an input whose request was cancelled before its batch
started never runs; a failing batch fails its requests only, and the batcher goes on."""

from __future__ import annotations

import asyncio
import threading

import pytest

from hfbert.serve.batcher import Batcher

TIMEOUT = 10  # seconds any test's event loop may run


def run_bounded(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, TIMEOUT))


class Recorder:
    """A model: records each batch (operation, payloads) and answers each payload doubled, on the model thread."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, list]] = []
        self.threads: set[str] = set()

    def __call__(self, operation, payloads):
        self.batches.append((operation, list(payloads)))
        self.threads.add(threading.current_thread().name)
        if "fail" in payloads:
            raise ValueError("this batch fails")
        return [payload * 2 for payload in payloads]


def test_batches_by_token_sum_sorted_and_by_operation():
    model = Recorder()
    tokens = {"a": 5, "bb": 60, "c": 7, "dd": 100, "e": 30, "ff": 150}

    async def scenario():
        batcher = Batcher(model, max_batch_tokens=100)
        batcher.start()
        requests = [["a", "bb"], ["c", "dd", "e"], ["ff"]]
        embed = [batcher.submit("embed", texts, [tokens[text] for text in texts]) for texts in requests]
        sparse = batcher.submit("sparse", ["a", "c"], [5, 7])
        results = await asyncio.gather(*embed, sparse)
        await batcher.close()
        return results

    results = run_bounded(scenario())
    assert results == [["aa", "bbbb"], ["cc", "dddd", "ee"], ["ffff"], ["aa", "cc"]]  # each request's, in order
    embed_batches = [payloads for operation, payloads in model.batches if operation == "embed"]
    assert [payload for batch in embed_batches for payload in batch] == sorted(tokens, key=tokens.get)  # by length
    for batch in embed_batches:
        assert len(batch) == 1 or sum(tokens[text] for text in batch) <= 100
    assert ("sparse", ["a", "c"]) in model.batches  # operations never share a batch
    assert len(model.threads) == 1 and model.threads != {threading.main_thread().name}  # one thread, off the loop


def test_max_batch_requests_caps_a_batch():
    model = Recorder()

    async def scenario():
        batcher = Batcher(model, max_batch_tokens=1000, max_batch_requests=2)
        batcher.start()
        result = await batcher.submit("embed", list("abcde"), [1] * 5)
        await batcher.close()
        return result

    assert run_bounded(scenario()) == ["aa", "bb", "cc", "dd", "ee"]
    assert [len(payloads) for _, payloads in model.batches] == [2, 2, 1]


def test_cancelled_inputs_are_dropped_and_failures_stay_with_their_request():
    release = threading.Event()
    model = Recorder()

    def held(operation, payloads):
        release.wait(TIMEOUT)
        return model(operation, payloads)

    async def scenario():
        batcher = Batcher(held, max_batch_tokens=1)  # one input per batch
        batcher.start()
        first = asyncio.ensure_future(batcher.submit("embed", ["first"], [1]))
        await asyncio.sleep(0.05)  # the first batch is on the model thread, held
        gone = asyncio.ensure_future(batcher.submit("embed", ["gone"], [1]))
        await asyncio.sleep(0.05)
        gone.cancel()
        release.set()
        assert await first == ["firstfirst"]
        with pytest.raises(ValueError, match="this batch fails"):
            await batcher.submit("embed", ["fail"], [1])
        after = await batcher.submit("embed", ["after"], [1])
        await batcher.close()
        return after

    assert run_bounded(scenario()) == ["afterafter"]
    assert [payloads for _, payloads in model.batches] == [["first"], ["fail"], ["after"]]


def test_a_budget_below_one_is_refused():
    with pytest.raises(ValueError, match="max_batch_tokens must be at least 1"):
        Batcher(Recorder(), max_batch_tokens=0)
