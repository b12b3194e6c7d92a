"""`optimize_for_inference` is never slower than the plain model: each swapped layer or block runs, at each row count,
the computation measured fastest here (`hfbert/inference/measured.py`), the plain one unless another clearly wins.
The timings themselves are not asserted (tests do not assert speed); what is checked is that the measured choice
is what runs, and that a kernel that loses is never picked."""

from __future__ import annotations

import itertools
import time

import pytest
import torch
import torch.nn.functional as F

import hfbert
import hfbert.inference.measured as measured
import hfbert.inference.optimize as optimize
import hfbert.inference.packed as packed
from hfbert.inference.packed import PackedLinear, packing_supported

from support.helpers import swap_as_at_bert_base

packs = pytest.mark.skipif(not packing_supported(), reason="this torch build or CPU has no oneDNN to pack for")


def sleeping(seconds_at: dict[int, float]):
    """A candidate that takes `seconds_at[rows]` seconds per call."""
    return lambda rows: lambda: time.sleep(seconds_at[rows])


def test_buckets_split_row_counts_on_a_log_scale():
    assert [measured.bucket(rows) for rows in (1, 16, 45, 46, 128, 362, 363, 1024, 10**6)] == [
        0,
        0,
        0,
        1,
        1,
        1,
        2,
        2,
        2,
    ]


def test_a_kernel_can_ask_for_its_own_row_counts():
    """The bf16 kernel's tiling is measured at TILE_COUNTS: each count gets its own choice and bucket."""
    counts = (512, 1024, 2048)
    plain = sleeping({512: 0.002, 1024: 0.002, 2048: 0.002})
    tiled = sleeping({512: 0.004, 1024: 0.0005, 2048: 0.004})
    assert measured.measured_choice(("test", "counts"), [plain, tiled], counts) == (0, 1, 0)
    assert [measured.bucket(rows, counts) for rows in (1, 724, 725, 1448, 1449, 10**6)] == [0, 0, 1, 1, 2, 2]


def test_the_plain_computation_is_kept_unless_another_is_clearly_faster():
    plain = sleeping({16: 0.002, 128: 0.002, 1024: 0.002})
    faster_at_few_rows = sleeping({16: 0.0005, 128: 0.004, 1024: 0.004})
    barely_faster = sleeping({16: 0.0019, 128: 0.0019, 1024: 0.0019})  # within WIN_MARGIN: noise, not a win
    assert measured.measured_choice(("test", "a"), [plain, faster_at_few_rows]) == (1, 0, 0)
    assert measured.measured_choice(("test", "b"), [plain, barely_faster]) == (0, 0, 0)
    assert measured.measured_choice(("test", "c"), [plain, barely_faster, faster_at_few_rows]) == (2, 0, 0)


class ScriptedClock:
    """Stands in for the timer of `measured.py`: time moves only when a scripted candidate runs, by the next
    duration of its script, so each test sees exactly the noise it writes down."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def candidate(self, *durations_ms: float):
        """A candidate whose calls take `durations_ms`, over and over (the same script at every row count)."""

        def at(rows):
            script = itertools.cycle(durations_ms)

            def call():
                self.now += next(script) / 1e3

            return call

        return at


@pytest.fixture
def clock(monkeypatch) -> ScriptedClock:
    clock = ScriptedClock()
    monkeypatch.setattr(measured, "_clock", clock)
    monkeypatch.setattr(measured, "_measured", {})
    return clock


def test_a_slower_kernel_with_lucky_calls_is_not_picked(clock):
    """One fast call in three (a quiet moment of the machine) does not make a kernel that is slower win: the fastest
    call of each, the old rule, would have picked it."""
    plain = clock.candidate(10)
    lucky = clock.candidate(12, 12, 5)
    assert measured.measured_choice(("noise", "lucky"), [plain, lucky]) == (0, 0, 0)


def test_a_kernel_barely_faster_than_a_disturbed_plain_one_is_not_picked(clock):
    """The plain computation slowed 3x in one call of three by another process: a challenger only 5% faster than
    its undisturbed time wins those rounds, not the median nor most rounds."""
    plain = clock.candidate(10, 10, 30)
    barely = clock.candidate(9.5)
    assert measured.measured_choice(("noise", "disturbed"), [plain, barely]) == (0, 0, 0)


def test_a_clearly_faster_kernel_wins_through_noise(clock):
    """Twice as fast, though one call in four is slowed 8x: picked, at every row count; among two challengers, the
    faster one."""
    plain = clock.candidate(10)
    fast = clock.candidate(5, 5, 5, 40)
    faster = clock.candidate(3, 3, 3, 30)
    assert measured.measured_choice(("noise", "clear"), [plain, fast]) == (1, 1, 1)
    assert measured.measured_choice(("noise", "two"), [plain, fast, faster]) == (2, 2, 2)


def test_candidates_take_turns_in_a_rotating_order(clock):
    ran = []

    def named(name):
        return lambda rows: lambda: ran.append(name) or setattr(clock, "now", clock.now + 0.01)

    measured.measured_choice(("noise", "order"), [named("a"), named("b"), named("c")])
    rounds = measured.ROUNDS[0]
    timed = ran[6 : 6 + 3 * rounds]  # after two warm-up calls each, the first row count's rounds
    assert [timed[3 * index] for index in range(rounds)] == list(itertools.islice(itertools.cycle("abc"), rounds))
    assert all(sorted(timed[3 * index : 3 * index + 3]) == ["a", "b", "c"] for index in range(rounds))


def test_a_choice_is_measured_once_per_key():
    calls = []

    def counted(rows):
        calls.append(rows)
        return lambda: None

    for _ in range(3):
        measured.measured_choice(("test", "once"), [counted, counted])
    assert len(calls) == 2 * len(measured.ROW_BUCKETS)


@packs
def test_layers_whose_kernel_never_wins_are_not_swapped(monkeypatch, layout):
    """bert-base-uncased's layout: small in the default run (the swap's size thresholds lowered to a hidden x hidden
    layer's: the layers bert-base would swap are candidates), at its own size in the slow one."""
    if layout.small:
        swap_as_at_bert_base(monkeypatch, layout.config["hidden_size"])
    monkeypatch.setattr(optimize, "measured_choice", lambda key, candidates: (0, 0, 0))
    model = hfbert.optimize_for_inference(hfbert.BertModel.from_pretrained(layout.safetensors))
    assert not hfbert.inference.packed_layers(model)
    assert all(type(module) is torch.nn.Linear for module in model.modules() if isinstance(module, torch.nn.Linear))
    model = hfbert.optimize_for_inference(model, precision="high")
    assert not hfbert.inference.packed_layers(model)


@packs
def test_each_row_count_runs_the_computation_measured_fastest_for_it(monkeypatch):
    """Packed at few rows, F.linear at many: the choice made at optimization time is what each call runs."""
    monkeypatch.setattr(optimize, "measured_choice", lambda key, candidates: (1, 0, 0))
    model = torch.nn.Sequential(torch.nn.Linear(768, 768))
    hfbert.optimize_for_inference(model)
    layer = model[0]
    assert isinstance(layer, PackedLinear) and layer._choice == (1, 0, 0)
    ran = []
    original = packed.packed_linear
    monkeypatch.setattr(packed, "packed_linear", lambda *args: ran.append(True) or original(*args))
    with torch.no_grad():
        for rows in (8, 1000):
            input = torch.randn(rows, 768)
            output = layer(input)
            assert bool(ran) == (rows == 8)
            if rows == 1000:  # F.linear itself: the plain model's numbers, bit for bit
                assert torch.equal(output, F.linear(input, layer.weight, layer.bias))
            ran.clear()


@packs
def test_a_layer_that_runs_f_linear_at_some_row_counts_keeps_its_weight_in_memory(monkeypatch):
    released = []
    monkeypatch.setattr("hfbert.inference.swapped.release_resident_pages", released.append)
    for choice, expect_release in (((1, 1, 1), True), ((1, 0, 0), False)):
        monkeypatch.setattr(optimize, "measured_choice", lambda key, candidates, choice=choice: choice)
        model = hfbert.optimize_for_inference(torch.nn.Sequential(torch.nn.Linear(768, 768)))
        assert bool(released) == expect_release, choice
        assert model[0]._choice == choice
        released.clear()


def test_bad_precision_and_kernels_are_refused():
    model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1))
    with pytest.raises(ValueError, match="precision must be one of 'highest', 'high'"):
        hfbert.optimize_for_inference(model, precision="medium")
    with pytest.raises(ValueError, match="kernels must be one of"):
        hfbert.optimize_for_inference(model, kernels="fastest")
    with pytest.raises(ValueError, match="cannot be combined with quantize='int8'"):
        hfbert.optimize_for_inference(model, quantize="int8", precision="high")
