"""plan_shards: every object exactly once, deterministic, balanced by bytes, clear errors."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sagemaker_dist.launch.sharding import (
    NotEnoughObjectsError,
    ShardingError,
    check_host_split,
    plan_shards,
    round_robin_by_name,
)

keys = st.text(min_size=1, max_size=12)
sizes = st.integers(min_value=0, max_value=10**12)


@st.composite
def objects_and_shards(draw):
    names = draw(st.lists(keys, min_size=1, max_size=60, unique=True))
    objects = [(name, draw(sizes)) for name in names]
    shards = draw(st.integers(min_value=1, max_value=len(objects)))
    return objects, shards


def _greedy_bound(objects, shards) -> float:
    """Graham's list-scheduling bound every min-load greedy meets: total/m + largest."""
    total = sum(s for _, s in objects)
    return total / shards + max(s for _, s in objects)


@settings(max_examples=300, deadline=None)
@given(objects_and_shards())
def test_every_object_exactly_once(case):
    objects, shards = case
    plan = plan_shards(objects, shards)
    assert plan.num_shards == len(plan.shards) == len(plan.sizes) == shards
    placed = [(k, s) for keys_, sizes_ in zip(plan.shards, plan.sizes) for k, s in zip(keys_, sizes_)]
    assert sorted(placed) == sorted(objects)
    assert all(plan.shards), "a shard is empty although there are enough objects"
    assert plan.bytes_per_shard == [sum(s) for s in plan.sizes]
    assert sum(plan.bytes_per_shard) == sum(s for _, s in objects)
    assert max(plan.bytes_per_shard) <= _greedy_bound(objects, shards)
    for shard in plan.shards:  # name order inside a shard
        assert shard == sorted(shard)


@settings(max_examples=100, deadline=None)
@given(objects_and_shards(), st.randoms(use_true_random=False))
def test_deterministic_and_independent_of_input_order(case, rnd):
    objects, shards = case
    shuffled = list(objects)
    rnd.shuffle(shuffled)
    assert plan_shards(objects, shards) == plan_shards(shuffled, shards)


# Keys from a few ASCII characters: many shared prefixes, keys that are prefixes of others, and runs
# equal for more than 8 bytes, which plan_shards orders 8 bytes at a time in numpy.
ascii_keys = st.text(alphabet="ab/0.", max_size=20)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(ascii_keys, sizes), min_size=2, max_size=60, unique_by=lambda o: o[0]),
    st.randoms(use_true_random=False),
)
def test_ascii_keys_in_any_order_plan_as_in_name_order(objects, rnd):
    shuffled = list(objects)
    rnd.shuffle(shuffled)
    shards = rnd.randint(1, len(objects))
    assert plan_shards(shuffled, shards) == plan_shards(sorted(objects), shards)  # sorted: no sort to do
    assert round_robin_by_name(shuffled, shards) == round_robin_by_name(sorted(objects), shards)


@pytest.mark.parametrize(
    "names",
    [
        ["data/part-000000007/1.tfrecord", "data/part-000000007/10.tfrecord", "data/part-000000007/2"],
        ["b", "a\x00", "a"],  # a NUL: ordered by Python's sort
        ["caf\u00e9/2", "caf\u00e9/10", "cafe"],  # not ASCII: ordered by Python's sort
    ],
)
def test_duplicate_keys_are_refused_in_any_order(names):
    objects = [(name, i) for i, name in enumerate(names)] + [(names[1], 99)]
    for order in (objects, objects[::-1], sorted(objects)):
        with pytest.raises(
            ShardingError, match=re.escape(f"1 key(s) appear more than once (first: {names[1]!r})")
        ):
            plan_shards(order, 2)


def test_long_random_keys_lognormal_sizes_and_one_huge_object():
    """The shape of bench/bench_sharding.py's lognormal-longkeys dataset, scaled down."""
    rng = random.Random(11)
    objects = [
        (f"data/part-{rng.randrange(10**9):09d}/{i}.tfrecord", int(rng.lognormvariate(12, 2)) + 1)
        for i in range(20_000)
    ]
    objects.append(("data/huge.tfrecord", 10**9))  # under total / shards, as 8 GB is under 19 GB
    shuffled = rng.sample(objects, len(objects))
    plan = plan_shards(shuffled, 16)
    assert plan == plan_shards(sorted(objects), 16)
    assert plan.lower_bound > 10**9 and plan.imbalance <= 1.001
    assert round_robin_by_name(shuffled, 16).imbalance > plan.imbalance
    for shard in plan.shards:
        assert shard == sorted(shard)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=1000), min_size=2, max_size=9), st.integers(2, 3))
def test_lpt_within_its_guarantee_of_the_optimum(values, shards):
    """LPT's largest shard is at most (4/3 - 1/(3m)) x the optimum; the optimum found by brute force."""
    if len(values) < shards:
        return
    objects = [(f"k{i}", v) for i, v in enumerate(values)]
    best = min(
        max(sum(v for v, s in zip(values, assign) if s == j) for j in range(shards))
        for assign in _assignments(len(values), shards)
    )
    plan = plan_shards(objects, shards)
    assert max(plan.bytes_per_shard) <= (4 / 3 - 1 / (3 * shards)) * best + 1e-9


def _assignments(n, m):
    if n == 0:
        yield ()
        return
    for rest in _assignments(n - 1, m):
        for j in range(m):
            yield (*rest, j)


def test_balances_by_bytes_not_by_count():
    # One huge object and many small ones: equal counts would be badly unbalanced.
    objects = [("big", 1000)] + [(f"small-{i:02d}", 10) for i in range(100)]
    plan = plan_shards(objects, 2)
    assert plan.bytes_per_shard == [1000, 1000]
    assert sorted(plan.objects_per_shard) == [1, 100]
    rr = round_robin_by_name(objects, 2)
    assert max(rr.bytes_per_shard) > 1400


def test_heavy_tailed_sizes_reach_the_lower_bound():
    rng = random.Random(7)
    objects = [(f"part-{i:05d}", int(rng.paretovariate(1.3) * 1000)) for i in range(20_000)]
    plan = plan_shards(objects, 64)
    assert plan.imbalance <= 1.001
    assert round_robin_by_name(objects, 64).imbalance > plan.imbalance


def test_largest_object_dominates_the_lower_bound():
    objects = [("huge", 10_000)] + [(f"s{i}", 1) for i in range(30)]
    plan = plan_shards(objects, 4)
    assert plan.lower_bound == 10_000
    assert plan.imbalance == 1.0
    assert plan.shards[plan.bytes_per_shard.index(10_000)] == ["huge"]


def test_ties_are_broken_by_name_and_table_adds_up():
    objects = [(f"k{i}", 5) for i in range(8)]
    plan = plan_shards(objects, 4)
    assert plan.shards == [["k0", "k4"], ["k1", "k5"], ["k2", "k6"], ["k3", "k7"]]
    rows = plan.table()
    assert [r[:3] for r in rows] == [(i, 2, 10) for i in range(4)]
    assert sum(r[3] for r in rows) == pytest.approx(1.0)


def test_zero_byte_objects_and_huge_sizes():
    assert plan_shards([("a", 0), ("b", 0)], 2).table()[0][3] == 0.5
    empties = plan_shards([(f"e{i}", 0) for i in range(10)] + [("x", 7)], 4)
    assert all(empties.shards), "zero-byte objects still give every worker something to read"
    huge = [("a", 2**70), ("b", 2**70 + 1), ("c", 3)]  # beyond int64: still exact
    plan = plan_shards(huge, 2)
    assert sorted(plan.bytes_per_shard) == [2**70 + 1, 2**70 + 3]


def test_fewer_objects_than_shards_names_both_counts():
    with pytest.raises(NotEnoughObjectsError) as info:
        plan_shards([("a", 1), ("b", 2), ("c", 3)], 8)
    message = str(info.value)
    assert "3 object(s) for 8 shard(s)" in message
    assert "at most 3 worker(s)" in message and "at least 8 files" in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "objects, shards, match",
    [
        ([("a", 1)], 0, "number of shards is 0"),
        ([("a", 1)], True, "number of shards"),
        ([("a", -1), ("b", 1)], 1, "negative size"),
        ([("a", 1), ("a", 2)], 1, "appear more than once"),
        ([("a", 1.5)], 1, "not a whole number"),
        ([("a", "12")], 1, "not a whole number"),
        ([(3, 1)], 1, "not a string"),
        ([("a",)], 1, "pairs"),
    ],
)
def test_bad_input(objects, shards, match):
    with pytest.raises(ShardingError, match=match):
        plan_shards(objects, shards)


def test_host_split_needs_one_object_per_host_in_every_sharded_by_key_shard():
    plan = plan_shards([(f"k{i}", 10) for i in range(7)], 2)  # shards of 4 and 3 objects
    check_host_split(plan, 3, "ShardedByS3Key")
    check_host_split(plan, 9, "FullyReplicated")  # never split across hosts
    check_host_split(plan_shards([("a", 1)], 1), 1, "ShardedByS3Key")  # one host gets it all
    with pytest.raises(NotEnoughObjectsError, match=r"across 4 hosts.*train_1 has 3.*at least 8 in all"):
        check_host_split(plan, 4, "ShardedByS3Key")
