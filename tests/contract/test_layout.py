"""The channel layout core: every rank gets a readable channel of its own, within SageMaker's cap."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sagemaker_dist.contract.layout import (
    FULLY_REPLICATED,
    LAYOUT_HYPERPARAMETER,
    MAX_CHANNELS,
    PER_LOCAL_RANK,
    PER_RANK,
    SHARDED_BY_S3_KEY,
    ChannelLayout,
    LayoutError,
    check_channel_name,
    plan_layout,
)

HYPERPARAMETER_VALUE_LIMIT = 2500  # CreateTrainingJob: hyperparameter values up to 2500 chars


def _expected_channels(strategy, hosts, gpus, validation, eval_channel, extra, reserved):
    """Channel count computed independently of layout.py."""
    per_worker = hosts * gpus if strategy == PER_RANK else gpus
    return (
        per_worker
        + {None: 0, "single": 1, "per-worker": per_worker}[validation]
        + int(eval_channel)
        + extra
        + reserved
    )


cluster = st.fixed_dictionaries(
    {
        "hosts": st.integers(1, 40),
        "processes_per_host": st.integers(1, 16),
        "strategy": st.sampled_from(["auto", PER_RANK, PER_LOCAL_RANK]),
        "validation": st.sampled_from([None, "single", "per-worker"]),
        "eval_channel": st.booleans(),
        "extra_channels": st.lists(st.sampled_from(["code", "sm_drivers", "aux"]), unique=True, max_size=3),
        "reserved_channels": st.integers(0, 3),
        "shuffle_seed": st.one_of(st.none(), st.integers(0, 2**31)),
        "record_wrapper": st.sampled_from(["None", "RecordIO"]),
    }
)


def _count(kw, strategy):
    return _expected_channels(
        strategy,
        kw["hosts"],
        kw["processes_per_host"],
        kw["validation"],
        kw["eval_channel"],
        len(kw["extra_channels"]),
        kw["reserved_channels"],
    )


@settings(max_examples=400, deadline=None)
@given(cluster)
def test_layout_fits_the_cap_or_says_why(kw):
    fits = {s: _count(kw, s) <= MAX_CHANNELS for s in (PER_RANK, PER_LOCAL_RANK)}
    wanted = kw["strategy"]
    should_fit = any(fits.values()) if wanted == "auto" else fits[wanted]
    if not should_fit:
        with pytest.raises(LayoutError) as info:
            plan_layout(**kw)
        message = str(info.value)
        assert f"cap of {MAX_CHANNELS}" in message
        assert f"per-rank: {_count(kw, PER_RANK)} channels" in message
        assert f"per-local-rank: {_count(kw, PER_LOCAL_RANK)} channels" in message
        return

    layout = plan_layout(**kw)
    # auto prefers per-rank (exact byte balance) whenever it fits.
    if wanted == "auto":
        assert layout.strategy == (PER_RANK if fits[PER_RANK] else PER_LOCAL_RANK)
    else:
        assert layout.strategy == wanted
    names = layout.channel_names
    assert len(names) + kw["reserved_channels"] == _count(kw, layout.strategy) <= MAX_CHANNELS
    assert len(set(names)) == len(names)
    assert all(check_channel_name(n) == n for n in names)
    assert layout.world_size == kw["hosts"] * kw["processes_per_host"]
    assert layout.shuffle_seed == kw["shuffle_seed"] and layout.record_wrapper == kw["record_wrapper"]

    _check_every_rank_reads_its_own_channel(layout)

    text = layout.to_json()
    assert len(text) <= HYPERPARAMETER_VALUE_LIMIT
    assert ChannelLayout.from_json(text) == layout
    # The toolkit json-decodes hyperparameters before the script sees them.
    assert ChannelLayout.from_json(json.loads(text)) == layout


def _check_every_rank_reads_its_own_channel(layout: ChannelLayout) -> None:
    """mpirun -map-by slot fills hosts in turn: rank = host * P + local_rank."""
    per_host = layout.processes_per_host
    for role in layout.roles:
        readers: dict[str, list[tuple[int, int]]] = {}
        for rank in range(layout.world_size):
            host, local = divmod(rank, per_host)
            channel = layout.channel_for(role.role, rank, local)
            assert channel in layout.channel_names
            readers.setdefault(channel, []).append((host, rank))
        if role.spread == "single":
            assert list(readers) == [role.base]
            assert role.distribution == FULLY_REPLICATED
            continue
        # A Pipe FIFO has one reader per host: no two ranks on one host share a channel.
        for channel, who in readers.items():
            hosts = [h for h, _ in who]
            assert len(hosts) == len(set(hosts)), f"{channel} read twice on one host"
        assert len(readers) == role.count  # every channel is read
        if layout.strategy == PER_RANK:
            assert role.distribution == FULLY_REPLICATED
            assert all(len(who) == 1 for who in readers.values())
        else:
            assert role.distribution == SHARDED_BY_S3_KEY
            assert all(len(who) == layout.hosts for who in readers.values())


def test_two_p3_16xlarge_hosts_get_sixteen_per_rank_channels():
    layout = plan_layout(2, 8)
    assert layout.strategy == PER_RANK
    assert layout.channel_names == [f"train_{i}" for i in range(16)]
    assert layout.channel_for("train", 9, 1) == "train_9"
    assert LAYOUT_HYPERPARAMETER == "sagemaker_dist_layout"


def test_many_hosts_fall_back_to_per_local_rank_and_say_so():
    layout = plan_layout(16, 8, validation="single", eval_channel=True)
    assert layout.strategy == PER_LOCAL_RANK
    assert layout.channel_names == [f"train_{i}" for i in range(8)] + ["validation", "eval"]
    assert layout.channel_for("train", 8 * 5 + 3, 3) == "train_3"
    assert layout.channel_for("validation", 17, 1) == "validation"
    text = "\n".join(layout.explain())
    assert "16 host(s) x 8 process(es) = 128 Horovod rank(s)" in text
    assert "ShardedByS3Key" in text and "by object count" in text
    assert "10 of 20 channels" in text


def test_explain_mentions_options():
    lines = plan_layout(1, 2, shuffle_seed=3, record_wrapper="RecordIO", extra_channels=["code"]).explain()
    assert "  other channels: code" in lines
    assert "  ShuffleConfig seed 3" in lines and "  RecordWrapperType RecordIO" in lines


def test_exactly_twenty_fits_and_twenty_one_does_not():
    layout = plan_layout(2, 8, validation="single", eval_channel=True, reserved_channels=2)
    assert len(layout.channel_names) == 18
    with pytest.raises(LayoutError, match="need 21 channels"):
        plan_layout(2, 8, strategy=PER_RANK, validation="single", eval_channel=True, reserved_channels=3)


def test_nothing_fits_suggests_what_to_drop():
    with pytest.raises(LayoutError, match="use validation='single' or None, fewer processes per host"):
        plan_layout(1, 16, validation="per-worker")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"hosts": 0}, "instance count is 0"),
        ({"hosts": -1}, "instance count is -1"),
        ({"hosts": 1.5}, "instance count is 1.5"),
        ({"hosts": True}, "instance count is True"),
        ({"processes_per_host": 0}, "processes per host is 0"),
        ({"strategy": "round-robin"}, "strategy 'round-robin'"),
        ({"validation": "all"}, "validation='all'"),
        ({"input_mode": "pipe"}, "input mode 'pipe'"),
        ({"record_wrapper": "recordio"}, "record wrapper 'recordio'"),
        ({"shuffle_seed": -1}, "shuffle seed -1"),
        ({"reserved_channels": -5}, "reserved channels -5"),
        ({"extra_channels": ["my code"]}, "characters SageMaker rejects"),
        ({"extra_channels": ["train_0"]}, "channel names repeat: train_0"),
        ({"extra_channels": ["aux", "aux"]}, "channel names repeat: aux"),
        ({"train_name": "x" * 63}, "at most 64"),
        ({"train_name": "t/r"}, "characters SageMaker rejects"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"hosts": 1, "processes_per_host": 2, **kwargs}
    with pytest.raises(LayoutError, match=match):
        plan_layout(**args)


@pytest.mark.parametrize("name", ["train", "a", "A.b-c_9", "x" * 64])
def test_valid_channel_names(name):
    assert check_channel_name(name) == name


@pytest.mark.parametrize(
    "name", ["", "x" * 65, "with space", "slash/", "ü", "tab\t", "train\n", None, ".", ".."]
)
def test_invalid_channel_names(name):
    with pytest.raises(LayoutError):
        check_channel_name(name)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=70))
def test_channel_name_check_matches_the_api_pattern(name):
    import re

    ok = bool(re.fullmatch(r"[A-Za-z0-9.\-_]{1,64}", name)) and name not in (".", "..")  # ours: no dots alone
    if ok:
        assert check_channel_name(name) == name
    else:
        with pytest.raises(LayoutError):
            check_channel_name(name)


def test_channel_for_out_of_range_and_unknown_role():
    layout = plan_layout(2, 4, strategy=PER_LOCAL_RANK)
    with pytest.raises(LayoutError, match=r"local rank 4 has no train channel: the layout has 4 \(train_0"):
        layout.channel_for("train", 4, 4)
    with pytest.raises(LayoutError, match=r"rank 8 has no train channel"):
        plan_layout(2, 4).channel_for("train", 8, 0)
    with pytest.raises(LayoutError, match="no 'validation' channels .*roles present: train"):
        layout.channel_for("validation", 0, 0)
    assert not layout.has_role("eval") and layout.has_role("train")


@pytest.mark.parametrize(
    "text, match",
    [
        ("not json", "is not a sagemaker-dist layout"),
        ("[]", "is not a sagemaker-dist layout"),
        ("null", "is not a sagemaker-dist layout"),
        ('{"version": 2}', "layout version 2 is not 1"),
        ('{"version": 1}', "is not a sagemaker-dist layout"),
        (
            '{"version": 1, "strategy": "bogus", "hosts": 1, "processes_per_host": 1, "roles": []}',
            "unknown strategy 'bogus'",
        ),
        (
            '{"version": 1, "strategy": "per-rank", "hosts": 1, "processes_per_host": 1, "roles": [{}]}',
            "is not a sagemaker-dist layout",
        ),
    ],
)
def test_from_json_rejects_what_it_cannot_trust(text, match):
    with pytest.raises(LayoutError, match=match):
        ChannelLayout.from_json(text)
