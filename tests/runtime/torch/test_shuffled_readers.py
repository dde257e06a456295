"""The seeded shuffle window of PipeBatches and RecordBatches over real FIFOs, and their state_dict.

Every reader (PipeBatches; RecordBatches with records of one size and of any size, compiled and Python)
puts one stream in the same order; the order is a permutation inside windows bounded in records and
bytes, a function of (seed, epoch, rank, channel); a reader that loads another's state_dict (a fresh
container: FIFOs from _0 again) hands out exactly the records the other had not."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers.runtime_helpers import FifoFeeder, write_opt_ml
from helpers.shuffled_ids import expected_windows, window_order

from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.contract.record_formats import encode_recordio, encode_tfrecord
from sagemaker_dist.runtime.framing import shuffle as sh
from sagemaker_dist.runtime.framing.batch_fill import compiled_available

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

READERS = ["pipe", "fixed-compiled", "fixed-python", "ragged-compiled", "ragged-python"]


def record(i: int, size: int = 100) -> bytes:
    return i.to_bytes(4, "little") * (size // 4)


def ident(r: bytes) -> int:
    return int.from_bytes(r[:4], "little")


def channel(tmp_path, epochs, name="train_0", wrapper="None", pace=None):
    from sagemaker_dist.runtime.config import ContainerConfig

    root = write_opt_ml(tmp_path / "opt_ml", [name], plan_layout(1, 1), wrapper=wrapper)
    feeder = FifoFeeder(root / "input" / "data", name, epochs, pace)
    feeder.start()
    return ContainerConfig.load(root, {}), feeder


def reader(kind: str, config, batch: int, shuffle, record_bytes: int = 100, name="train_0"):
    from sagemaker_dist.runtime import PipeBatches, RecordBatches

    if kind == "pipe":
        return PipeBatches(name, batch, config=config, shuffle=shuffle)
    fixed = record_bytes if kind.startswith("fixed") else None
    compiled = kind.endswith("compiled")
    if compiled and not compiled_available():
        pytest.fail("the compiled batch reader is not built (pip install -e . needs a C compiler)")
    return RecordBatches(
        name, batch, config=config, shuffle=shuffle, record_bytes=fixed, compiled=compiled, pin_memory=False
    )


def records_of(batch) -> list[bytes]:
    from sagemaker_dist.runtime import RaggedBatch

    if isinstance(batch, list):
        return [bytes(r) for r in batch]
    if isinstance(batch, RaggedBatch):
        return [bytes(batch.record(i).numpy()) for i in range(len(batch.lengths))]
    return [bytes(row.numpy()) for row in batch]


def epoch_ids(batches) -> list[int]:
    return [ident(r) for b in batches for r in records_of(b)]


def test_the_window_order_is_the_same_arithmetic_in_c_and_python():
    for size, n in [(1, 1), (2, 2), (7, 3), (1000, 1000), (16384, 1700), (16384, 16384), (5, 0)]:
        key = sh.window_key(sh.epoch_key(sh.stream_key(11, 2, "train_2"), 4), 9)
        got = sh.window_order(key, size, n)
        full = sh._permutation_python(key, size)
        assert got.tolist() == full[full < n].tolist()
        assert sorted(got.tolist()) == list(range(n))
    # a window cut short keeps the order the whole window gives its records
    key = sh.window_key(sh.epoch_key(1, 0), 0)
    whole = sh.window_order(key, 64, 64).tolist()
    assert sh.window_order(key, 64, 40).tolist() == [i for i in whole if i < 40]


def test_a_windows_count_is_fixed_at_its_start_by_the_mean_record_of_the_window_before():
    window = sh.ShuffleWindow(1, records=100, bytes=10_000)
    order = sh.EpochOrder(window, 5, 0)
    assert order.records is None and order.cap == 11_250
    assert not order.closes(1, 300)  # the first record: 10_000 bytes of 300-byte records
    assert order.records == 34 == order.fixed_size(300)
    assert not order.closes(33, 9_900) and order.closes(34, 10_200)  # its count, whatever its bytes
    assert order.closes(20, 11_250)  # or its cap first
    order.order(20, 11_300)  # a window of 565-byte records: the next one takes 18
    assert order.records == 18 and not order.closes(17, 9_000) and order.closes(18, 9_000)
    order.order(18, 90)  # records of 5 bytes: the record bound
    assert order.records == 100
    order.order(3, 2)  # empty records count as a byte each
    assert order.records == 100 and sh.window_records(window, 4, 0) == 100
    # C's arithmetic (native/shuffle_core.h) is checked through the readers that use it: each test
    # below compares a compiled reader's order with this one's, window by window


@pytest.mark.parametrize("kind", READERS)
def test_every_reader_puts_the_stream_in_the_same_seeded_order_inside_bounded_windows(tmp_path, kind):
    records = [record(i) for i in range(1000)]
    stream = b"".join(encode_tfrecord(r) for r in records)
    window = sh.ShuffleWindow(7, records=128, bytes=6000)  # 60 records of 100 bytes: the byte bound cuts
    config, feeder = channel(tmp_path, [stream, stream, stream])
    batches = reader(kind, config, 32, window)
    first, second = epoch_ids(batches), epoch_ids(batches)
    batches.set_epoch(0)
    again = epoch_ids(batches)
    feeder.join(10)
    assert feeder.error is None
    # the reference: the order the arithmetic gives, window by window (batches of records of any size:
    # the same records each, in stream order)
    batch = 32 if kind.startswith("ragged") else None
    reference = window_order(list(range(1000)), [100] * 1000, window, 0, "train_0", 0, batch)
    assert first == reference and again == first  # the same epoch: the same order
    assert sorted(second) == list(range(1000)) and second != first  # another epoch: another order
    assert first != list(range(1000))
    for w in expected_windows([100] * 1000, window):  # no record leaves its window
        assert sorted(first[w.start : w.stop]) == list(w)


@pytest.mark.parametrize("kind", ["pipe", "ragged-compiled", "ragged-python"])
def test_records_of_any_size_close_a_window_at_its_count_or_its_byte_cap(tmp_path, kind):
    rng = np.random.default_rng(3)
    sizes = [int(n) for n in rng.integers(4, 3000, 400)]
    sizes[50] = 40_000  # a large record (read straight into the window by the compiled reader)
    records = [i.to_bytes(4, "little") + os.urandom(n - 4) for i, n in enumerate(sizes)]
    stream = b"".join(encode_recordio(r, max_part=1000) for r in records)
    window = sh.ShuffleWindow(5, records=64, bytes=20_000)
    config, feeder = channel(tmp_path, [stream], wrapper="RecordIO")
    got = [r for b in reader(kind, config, 10, window) for r in records_of(b)]
    feeder.join(10)
    assert sorted(got) == sorted(records)
    position = {r: i for i, r in enumerate(records)}
    windows = expected_windows(sizes, window)
    for w in windows:  # the cap: the bound and an eighth
        assert sum(sizes[i] for i in w) < window.bytes * 9 // 8 + max(sizes[i] for i in w)
    assert 10 < len(windows) < len(sizes) // 8
    batch = 10 if kind.startswith("ragged") else None
    expected = window_order(list(range(len(sizes))), sizes, window, 0, "train_0", 0, batch)
    assert [position[r] for r in got] == expected


def test_equal_seeds_give_equal_orders_and_the_seed_rank_and_channel_each_change_it(tmp_path):
    from sagemaker_dist.runtime.config import ContainerConfig

    stream = b"".join(encode_tfrecord(record(i)) for i in range(300))
    names = ["train_0", "train_1"]
    root = write_opt_ml(tmp_path / "opt_ml", names, plan_layout(1, 2))
    feeders = [FifoFeeder(root / "input" / "data", n, [stream] * 3) for n in names]
    for f in feeders:
        f.start()
    config = ContainerConfig.load(root, {})
    from sagemaker_dist.runtime import PipeBatches

    orders = {}
    for case, (name, seed, rank) in {
        "a": ("train_0", 1, 0),
        "b": ("train_0", 1, 0),
        "seed": ("train_0", 2, 0),
        "channel": ("train_1", 1, 0),
    }.items():
        os.environ["RANK"] = str(rank)
        try:
            batches = PipeBatches(name, 50, config=config, shuffle=sh.ShuffleWindow(seed, records=100))
        finally:
            del os.environ["RANK"]
        orders[case] = epoch_ids(batches)
    for f in feeders:
        f.join(10)
    assert orders["a"] == orders["b"]
    assert len({tuple(o) for o in orders.values()}) == 3
    key = sh.stream_key
    assert key(1, 0, "train_0") != key(1, 1, "train_0")  # the rank is part of the stream's key


@pytest.mark.parametrize("kind", READERS)
@pytest.mark.parametrize("shuffled", [True, False])
def test_a_fresh_reader_loading_a_state_dict_hands_out_exactly_the_records_not_yet_handed_out(
    tmp_path, kind, shuffled
):
    records = [record(i) for i in range(500)]
    stream = b"".join(encode_tfrecord(r) for r in records)
    window = sh.ShuffleWindow(9, records=64) if shuffled else None
    config, feeder = channel(tmp_path / "one", [stream, stream])
    one = reader(kind, config, 16, window)
    whole = epoch_ids(one)  # epoch 0, read to its end
    assert one.state_dict()["epoch"] == 1 and one.state_dict()["records"] == 0
    handed = []
    for b in one:  # epoch 1: 7 batches, then a stop (the rest of the FIFO closed unread)
        handed += [ident(r) for r in records_of(b)]
        if len(handed) == 7 * 16:
            break
    state = one.state_dict()
    feeder.join(10)
    assert (state["epoch"], state["records"], state["fifo"]) == (1, 112, 1)
    # the next attempt: a fresh container, FIFOs from _0 again (the same records, no ShuffleConfig)
    config, feeder = channel(tmp_path / "two", [stream, stream])
    two = reader(kind, config, 16, window)
    two.load_state_dict(state)
    assert two.state_dict() == state  # a loaded state is the position until it is iterated
    rest = epoch_ids(two)
    later = epoch_ids(two)
    feeder.join(10)
    assert sorted(handed + rest) == list(range(500)) and not set(handed) & set(rest)
    if shuffled:  # the uninterrupted order of epoch 1, read again, for the reference
        config, feeder = channel(tmp_path / "three", [stream])
        three = reader(kind, config, 16, window)
        three.set_epoch(1)
        assert handed + rest == epoch_ids(three)
        feeder.join(10)
        assert sorted(later) == list(range(500)) and later not in (whole, handed + rest)
    else:
        assert handed + rest == whole == later
    assert two.state_dict()["epoch"] == 3 and two.state_dict()["records"] == 0


def test_a_state_inside_an_epoch_of_another_shuffle_or_channel_is_refused(tmp_path):
    from sagemaker_dist.runtime import PipeBatches
    from sagemaker_dist.runtime.epoch_reader.order import ReaderStateError

    config, _ = channel(tmp_path, [])
    batches = PipeBatches("train_0", 4, config=config, shuffle=3)
    state = batches.state_dict()
    assert state["records"] == 0 and state["shuffle"]["seed"] == 3
    PipeBatches("train_0", 4, config=config, shuffle=4).load_state_dict(state)  # an epoch's start: fine
    inside = dict(state, records=12)
    with pytest.raises(ReaderStateError, match="first 12 records would be others"):
        PipeBatches("train_0", 4, config=config, shuffle=4).load_state_dict(inside)
    with pytest.raises(ReaderStateError, match="channel 'train_1'"):
        batches.load_state_dict(dict(inside, channel="train_1"))
    with pytest.raises(ReaderStateError, match="not a reader state"):
        batches.load_state_dict({"epoch": 1})
    with pytest.raises(ValueError, match="shuffle='yes'"):
        PipeBatches("train_0", 4, config=config, shuffle="yes")


@pytest.mark.parametrize("kind", ["fixed-compiled", "fixed-python"])
def test_batches_kept_while_later_windows_are_read_stay_as_they_were(tmp_path, kind):
    """Windows of records of one size share a buffer (a batch across two windows is a view of it): one
    that is still held is never read over. Batches of 5 over windows of 16 records, two epochs held."""
    records = [record(i) for i in range(300)]
    stream = b"".join(encode_tfrecord(r) for r in records)
    window = sh.ShuffleWindow(4, records=16)
    config, feeder = channel(tmp_path, [stream, stream])
    batches = reader(kind, config, 5, window)
    kept = [list(batches), list(batches)]  # every batch of both epochs held until the end
    feeder.join(10)
    for epoch, held in enumerate(kept):
        assert [len(b) for b in held] == [5] * 60
        reference = window_order(list(range(300)), [100] * 300, window, 0, "train_0", epoch)
        assert [ident(r) for b in held for r in records_of(b)] == reference
    # batches of one buffer, one after another (views of the windows' rows, not copies of them)
    adjacent = sum(b.data_ptr() == a.data_ptr() + a.numel() for a, b in zip(kept[0], kept[0][1:]))
    assert adjacent >= 40  # all but where a held arena made the reader take a new one


def test_a_window_being_read_into_is_never_placed_over_till_it_is_let_go():
    """A window the reader thread of an epoch left early may still be reading into: the next epoch's
    windows go round the arena past it (or into another arena), not over it."""
    from sagemaker_dist.runtime.torch.batch_buffers import Arena

    arena = Arena(30, 8, False, False, batch_rows=4)
    orphan = arena.reserve(arena.place(10))
    assert arena.place(10) == [(10, 10)] and arena.place(10) == [(20, 10)]
    assert arena.place(10) is None  # round to the start: held
    orphan.in_use = False
    assert arena.place(10) == [(0, 10)]


@pytest.mark.parametrize("row", [8, 64 << 10], ids=["one-copy", "a-memmove-a-run"])
def test_a_window_cut_short_is_moved_up_to_its_first_places_in_its_order_across_the_arenas_end_too(row):
    """The last window of an epoch, cut short by the stream's end, is handed out as spans of the arena:
    its records moved up to its first places in its order, where the window went on past the arena's
    end (6 places) and from its start (4) too."""
    from sagemaker_dist.runtime.torch.batch_buffers import Arena
    from sagemaker_dist.runtime.torch.record_batches import short_window

    n = 10
    for seed in range(6):
        for came in (1, 4, 6, 7, 9):
            arena = Arena(24, row, False, False, batch_rows=4)
            assert arena.place(n) == [(0, 10)] and arena.place(n) == [(10, 10)]
            pieces = arena.place(n, head=2)
            assert pieces == [(20, 6), (0, 4)]  # 2 rows complete the carried batch, then one whole batch
            places = np.random.default_rng(seed).permutation(n)
            window = arena.window(pieces, places)
            for i in range(came):  # record i read into its place's row
                window.data[window.rows[i] * row : (window.rows[i] + 1) * row] = 100 + i
            window.count = came
            spans = list(short_window(arena, pieces, window, places))
            got = [int(arena.array[(s.first + j) * row]) for s in spans for j in range(s.n)]
            assert got == [100 + i for i in np.argsort(places) if i < came], (seed, came)
            assert spans[0].first == 20 and all(s.n for s in spans)


@pytest.mark.parametrize("hold", ["kept-up", "all-held"])
def test_an_arena_maps_the_rows_a_loop_that_keeps_up_needs_and_the_rest_once_they_are_held(tmp_path, hold):
    """Windows of 20 KB records (an arena of mapped pages: 21 MB, 8 MB of it what a loop that keeps up
    needs): a loop that drops each batch of a slower writer (a window every 0.1 s) never maps the rest,
    and every batch is a view of the arena, those across its end too (a window goes on there for the
    rows that complete the carried batch and whole batches after them, then from the start); one that
    keeps every batch has the rest mapped after the last window, so the next window is still a view
    after it, and no byte written before is lost."""
    size, count, batch = 20_000, 900, 32
    records = [record(i, size) for i in range(count)]
    stream = b"".join(encode_tfrecord(r) for r in records)
    window = sh.ShuffleWindow(5, records=100)
    pace = (len(stream) // 9, 0.1) if hold == "kept-up" else None
    config, feeder = channel(tmp_path, [stream], pace=pace)
    batches = reader("fixed-compiled", config, batch, window, record_bytes=size)
    held, ids, at = [], [], []
    for b in batches:
        ids.extend(ident(r) for r in records_of(b))
        at.append(b.data_ptr())
        if hold == "all-held":
            held.append(b)
    feeder.join(10)
    assert ids == window_order(list(range(count)), [size] * count, window, 0, "train_0", 0)
    arena = batches._buffers[("arena", False)]
    lean = 2 * 100 + 132 + batch  # two windows, a group (capped at a window and a batch), a carried batch
    assert arena.rows == 2 * 100 + 6 * 132 + batch and arena.rows * size >= 4 << 20
    if hold == "kept-up":
        assert arena.limit == lean and arena.end <= lean + batch
        base = arena.array.ctypes.data
        assert all(base <= a < base + (lean + batch) * size for a in at)  # views of it, none copied
        return
    assert arena.limit == arena.rows  # the rest mapped: windows went on after the lean rows
    assert all(r == records[ident(r)] for b in held for r in records_of(b))
    adjacent = sum(b.data_ptr() == a.data_ptr() + a.numel() for a, b in zip(held, held[1:]))
    assert adjacent >= len(held) - 4  # views of the arena but where a held one made the reader take another


@pytest.mark.parametrize("kind", READERS)
def test_every_reader_notes_its_streams_head_and_a_resume_onto_other_records_says_so(tmp_path, kind, capfd):
    """The head (the digest of a stream's first 16 records) is the same in every reader; a reader
    resumed with a state whose stream began otherwise (the channel's order not reproduced) says so."""
    records = [record(i) for i in range(100)]
    stream = b"".join(encode_tfrecord(r) for r in records)
    head = sh.StreamHead()
    for r in records[:16]:
        head.add(r)
    config, feeder = channel(tmp_path / "one", [stream])
    one = reader(kind, config, 8, sh.ShuffleWindow(2, records=10))
    it = iter(one)
    next(it)
    it.close()
    feeder.join(10)
    state = one.state_dict()
    assert state["head"] == head.value and state["rank"] == 0
    config, feeder = channel(tmp_path / "two", [b"".join(encode_tfrecord(r) for r in records[::-1])])
    two = reader(kind, config, 8, sh.ShuffleWindow(2, records=10))
    two.load_state_dict(state)  # the same channel, but its FIFO now carries the records in another order
    rest = epoch_ids(two)
    feeder.join(10)
    assert len(rest) == 100 - 8
    assert (
        "train_0_0, read for epoch 1 after a restart, does not start with the records"
        in capfd.readouterr().out
    )
