"""``sagemaker-dist pack``: image sets (class folders, JSON lines, CSV) into WebDataset and TFRecord shards,
in S3 (the moto server) and in a local folder. Shards are read back with the ``webdataset`` library and
the runtime's own readers, every sample's bytes and label compared with its source file; resume, stale
and foreign shards, and bad input (a name that climbs out, a missing label, an unreadable file)."""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest

from sagemaker_dist.cli import main
from sagemaker_dist.launch.pack import (
    INDEX,
    PackError,
    PackInputError,
    pack,
    parse_size,
    plan_pack,
    read_pack_index,
    scan_source,
)


def jpeg(seed: int, size: int) -> bytes:
    """Bytes that pass pack's JPEG check (it reads the magic only): FF D8 FF, then ``size`` more."""
    return b"\xff\xd8\xff" + bytes((seed * 31 + i) % 251 for i in range(size))


@pytest.fixture
def image_folder(tmp_path):
    """3 classes x 7 images of 200-2000 bytes, a file at the top and a non-image (ignored)."""
    root = tmp_path / "images"
    sources = {}
    for c, name in enumerate(("cat", "dog", "emu")):
        (root / name).mkdir(parents=True)
        for i in range(7):
            data = jpeg(c * 10 + i, 200 + 250 * i + 13 * c)
            (root / name / f"{i:02d}.jpg").write_bytes(data)
            sources[f"{name}/{i:02d}.jpg"] = (data, c)
    (root / "dog" / "notes.txt").write_text("not an image")
    return root, sources


def read_tar_shards(blobs: list[bytes]) -> list[dict]:
    """Every sample of the shards, as the ``webdataset`` library reads them (its own tar reading)."""
    import webdataset as wds

    samples = []
    for blob in blobs:
        stream = io.BytesIO(blob)
        files = wds.tariterators.tar_file_iterator(stream)
        for sample in wds.tariterators.group_by_keys({**f, "__url__": "x"} for f in files):
            sample.pop("__url__")
            samples.append(sample)
    return samples


def s3_blobs(s3, bucket: str, prefix: str) -> dict[str, bytes]:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"]: s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed}


def by_source(samples: list[dict], sources: dict) -> dict:
    """The samples keyed by their source's bytes: each source is in exactly one sample."""
    found = {}
    for sample in samples:
        data = sample["jpg"]
        assert data not in found
        found[data] = sample
    assert set(found) == {data for data, _ in sources.values()}
    return found


def test_an_image_folder_packs_into_balanced_webdataset_shards_in_s3_with_the_index_last(
    s3, bucket, image_folder
):
    root, sources = image_folder
    source = scan_source(root)
    assert source.classes == ["cat", "dog", "emu"] and len(source.items) == 21 and source.ignored == 1
    plan = plan_pack(source, shards=3, multiple_of=2, seed=7)  # rounded up to 4 shards
    assert len(plan.shards) == 4
    result = pack(plan, f"s3://{bucket}/packed/", progress=False)
    objects = s3_blobs(s3, bucket, "packed/shards/")
    assert sorted(objects) == [f"packed/shards/shard-{i:06d}.tar" for i in range(4)]
    index = json.loads(s3.get_object(Bucket=bucket, Key="packed/index.json")["Body"].read())
    assert index == result.index == read_pack_index(f"s3://{bucket}/packed/")
    assert (
        index["records"] == 21
        and index["classes"] == ["cat", "dog", "emu"]
        and index["format"] == "webdataset"
    )
    assert [s["bytes"] for s in index["shards"]] == [
        len(objects[f"packed/{s['name']}"]) for s in index["shards"]
    ]
    assert index["bytes"] == sum(len(b) for b in objects.values())
    # balanced by bytes: no shard further from the mean than one sample
    mean = index["bytes"] / 4
    largest = max(len(d) for d, _ in sources.values()) + 3 * 512
    assert all(abs(s["bytes"] - mean) <= largest for s in index["shards"])
    # every source file is one sample, with its label; keys are unique and in order within a shard
    samples = read_tar_shards([objects[k] for k in sorted(objects)])
    assert [s["__key__"] for s in samples] == [f"{i:06d}" for i in range(21)]
    found = by_source(samples, sources)
    for data, label in sources.values():
        assert int(found[data]["cls"]) == label
    assert [s["records"] for s in index["shards"]] == [len(s.samples) for s in plan.shards]
    # the classes mix within shards (seeded shuffle), and the same seed makes the same plan
    assert all(len({int(s["cls"]) for s in samples[i : i + 5]}) > 1 for i in (0, 5))
    assert plan_pack(scan_source(root), shards=3, multiple_of=2, seed=7).digest == plan.digest
    assert plan_pack(scan_source(root), shards=3, multiple_of=2, seed=8).digest != plan.digest


def test_gnu_tar_lists_and_extracts_a_packed_shard(tmp_path, image_folder):
    import subprocess

    root, sources = image_folder
    result = pack(plan_pack(scan_source(root), shards=1), tmp_path / "out", progress=False)
    shard = tmp_path / "out" / "shards" / "shard-000000.tar"
    assert result.shards_uri == f"{tmp_path / 'out' / 'shards'}/"
    listed = subprocess.run(
        ["tar", "-tf", str(shard)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert listed[:2] == ["000000.jpg", "000000.cls"] and len(listed) == 42
    (tmp_path / "x").mkdir()
    subprocess.run(["tar", "-xf", str(shard), "-C", str(tmp_path / "x")], check=True)
    extracted = {(tmp_path / "x" / name).read_bytes() for name in listed if name.endswith(".jpg")}
    assert extracted == {data for data, _ in sources.values()}
    with tarfile.open(shard) as tar:  # Python's reader agrees, and the archive ends with its zero blocks
        assert [m.name for m in tar.getmembers()] == listed
    assert shard.read_bytes()[-1024:] == bytes(1024)


def test_a_rerun_skips_complete_shards_and_a_changed_file_rewrites_only_its_shard(s3, bucket, image_folder):
    root, _ = image_folder
    uri = f"s3://{bucket}/p/"
    first = pack(plan_pack(scan_source(root), shards=3), uri, progress=False)
    assert (first.written, first.reused) == (3, 0)
    before = s3_blobs(s3, bucket, "p/shards/")
    again = pack(plan_pack(scan_source(root), shards=3), uri, progress=False)
    assert (again.written, again.reused) == (0, 3) and again.index == first.index
    changed = root / "emu" / "03.jpg"
    changed.write_bytes(jpeg(99, 5000))
    third = pack(plan_pack(scan_source(root), shards=3), uri, progress=False)
    after = s3_blobs(s3, bucket, "p/shards/")
    rewritten = [k for k in after if after[k] != before[k]]
    assert third.written >= 1 and len(rewritten) == third.written and third.reused == 3 - third.written
    assert jpeg(99, 5000) in {s["jpg"] for s in read_tar_shards(list(after.values()))}
    # fewer shards: those of the earlier plan that this one has not are deleted before the index is written
    fourth = pack(plan_pack(scan_source(root), shards=2), uri, progress=False)
    assert sorted(s3_blobs(s3, bucket, "p/shards/")) == [
        "p/shards/shard-000000.tar",
        "p/shards/shard-000001.tar",
    ]
    assert sorted(s3_blobs(s3, bucket, "p/.pack/")) == [
        "p/.pack/shard-000000.tar.json",
        "p/.pack/shard-000001.tar.json",
    ]
    assert fourth.index["records"] == 21


def test_a_file_pack_did_not_write_in_the_shards_folder_stops_it_before_anything_is_written(
    s3, bucket, image_folder
):
    root, _ = image_folder
    s3.put_object(Bucket=bucket, Key="p/shards/mine.csv", Body=b"1,2")
    with pytest.raises(PackError, match="holds 1 file.s. pack did not write, the first 'mine.csv'"):
        pack(plan_pack(scan_source(root), shards=2), f"s3://{bucket}/p/", progress=False)
    assert sorted(s3_blobs(s3, bucket, "p/")) == ["p/shards/mine.csv"]


def test_a_failure_midway_leaves_whole_shards_and_no_index_and_the_rerun_finishes(s3, bucket, image_folder):
    root, _ = image_folder
    plan = plan_pack(scan_source(root), shards=5)
    victim = plan.shards[3].samples[0].item.path
    (root / victim).unlink()  # gone after it was listed
    with pytest.raises(PackInputError, match=f"{victim}: could not be read while packing"):
        pack(plan, f"s3://{bucket}/p/", workers=1, progress=False)
    objects = s3_blobs(s3, bucket, "p/")
    assert "p/index.json" not in objects
    shards = {k: v for k, v in objects.items() if k.startswith("p/shards/")}
    for blob in shards.values():  # only whole shards: each one reads to its end-of-archive blocks
        assert blob.endswith(bytes(1024)) and len(read_tar_shards([blob])) > 0
    assert "p/shards/shard-000003.tar" not in shards
    result = pack(plan_pack(scan_source(root), shards=5), f"s3://{bucket}/p/", progress=False)
    assert result.index["records"] == 20 and "p/index.json" in s3_blobs(s3, bucket, "p/")


def test_json_lines_with_names_as_labels_and_extra_fields(tmp_path):
    root = tmp_path / "data"
    (root / "img").mkdir(parents=True)
    rows, sources = [], {}
    for i, label in enumerate(["zebra", "ant", "zebra", "bee", None, "ant"]):
        data = jpeg(i, 300 + i)
        (root / "img" / f"{i}.jpeg").write_bytes(data)
        row = {"path": f"img/{i}.jpeg", "caption": f"picture {i}"}
        if label is not None:
            row["label"] = label
            sources[data] = (label, f"picture {i}")
        rows.append(json.dumps(row))
    (root / "train.jsonl").write_text("\n".join(rows) + "\n\n")
    source = scan_source(root / "train.jsonl")
    assert source.classes == ["ant", "bee", "zebra"] and len(source.items) == 5
    assert [(s.path, s.reason) for s in source.skipped] == [("img/4.jpeg", "no label (train.jsonl, line 5)")]
    result = pack(plan_pack(source, shards=2), tmp_path / "out", progress=False)
    assert result.index["skipped"] == [{"path": "img/4.jpeg", "reason": "no label (train.jsonl, line 5)"}]
    blobs = [(tmp_path / "out" / s["name"]).read_bytes() for s in result.index["shards"]]
    samples = read_tar_shards(blobs)
    assert {
        s["jpg"]: (source.classes[int(s["cls"])], json.loads(s["json"])["caption"]) for s in samples
    } == sources
    with pytest.raises(
        PackInputError, match="1 file.s. of .* cannot be packed, the first 'img/4.jpeg': no label"
    ):
        scan_source(root / "train.jsonl", strict=True)


def test_a_csv_of_paths_and_int_labels_packs_to_tfrecord_read_back_by_the_runtime(tmp_path):
    from sagemaker_dist.runtime.framing import iter_records
    from sagemaker_dist.runtime.torch.records import parse_example

    (tmp_path / "a").mkdir()
    lines, sources = ["path,label"], {}
    for i in range(9):
        data = jpeg(i, 100 * i + 10)
        (tmp_path / "a" / f"{i}.png.jpg").write_bytes(data)
        lines.append(f"a/{i}.png.jpg,{i % 4}")
        sources[data] = i % 4
    (tmp_path / "list.csv").write_text("\n".join(lines))
    source = scan_source(tmp_path / "list.csv")
    assert source.classes is None and source.layout == "csv"
    result = pack(plan_pack(source, format="tfrecord", shards=2), tmp_path / "out", progress=False)
    assert result.index["record_format"] == "TFRecord" and result.index["labels"] == [0, 1, 2, 3]
    got = {}
    for shard in result.index["shards"]:
        blob = (tmp_path / "out" / shard["name"]).read_bytes()
        for record in iter_records(io.BytesIO(blob).readinto, "TFRecord"):
            example = parse_example(record)
            got[example["image"][0]] = int(example["label"][0])
            assert example["format"] == [b"jpg"]
    assert got == sources


@pytest.mark.parametrize(
    "listed, why",
    [
        ("../outside.jpg", "climbs out of its directory"),
        ("/etc/hostname", "is an absolute path"),
        ("link.jpg", "leads out of .* through a symbolic link"),
    ],
)
def test_a_name_that_leads_out_of_the_source_folder_is_an_error(tmp_path, listed, why):
    root = tmp_path / "src"
    root.mkdir()
    (tmp_path / "outside.jpg").write_bytes(jpeg(1, 10))
    (root / "link.jpg").symlink_to(tmp_path / "outside.jpg")
    (root / "list.csv").write_text(f"{listed},1\n")
    with pytest.raises(PackInputError, match=f"list.csv, line 1: path '{listed}', which {why}"):
        scan_source(root / "list.csv")


def test_an_image_folder_link_out_is_an_error_and_unreadable_files_are_skipped_and_reported(
    tmp_path, image_folder
):
    root, _ = image_folder
    os.mkfifo(root / "cat" / "pipe.jpg")  # not a regular file: never opened (it would block)
    (root / "cat" / "gone.jpg").symlink_to(root / "cat" / "missing.jpg")  # a dangling link inside
    (root / "dog" / "text.jpg").write_text("hello")  # named a JPEG, is not one
    source = scan_source(root)
    assert {(s.path, s.reason.split(" (")[0]) for s in source.skipped} == {
        ("cat/pipe.jpg", "not a regular file"),
        ("cat/gone.jpg", "missing"),
        ("dog/text.jpg", "not a JPG file"),
    }
    assert len(source.items) == 21
    (root / "emu" / "out.jpg").symlink_to(tmp_path / "elsewhere.jpg")
    (tmp_path / "elsewhere.jpg").write_bytes(jpeg(5, 5))
    with pytest.raises(PackInputError, match="'emu/out.jpg', which leads out of"):
        scan_source(root)


def test_sizes_and_plans_refuse_what_cannot_work(image_folder):
    root, _ = image_folder
    assert parse_size("64MB") == 64_000_000 and parse_size("1.5GiB") == 3 * 2**29 and parse_size(512) == 512
    with pytest.raises(PackError, match="is not a size"):
        parse_size("lots")
    source = scan_source(root)
    with pytest.raises(PackError, match="22 shards for 21 samples"):
        plan_pack(source, shards=22)
    by_size = plan_pack(source, shard_bytes=10_000)
    shards = len(by_size.shards)
    assert shards == -(-(by_size.bytes - shards * 1024) // 10_000)  # the end-of-archive blocks aside
    with pytest.raises(PackError, match="format 'zip' is not one of webdataset, tfrecord"):
        plan_pack(source, format="zip")


def test_the_command_packs_prints_and_names_bad_input(tmp_path, image_folder, capsys):
    root, _ = image_folder
    assert main(["pack", str(root), str(tmp_path / "out"), "--shards", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert (
        "21 samples, 3 classes (imagefolder)" in out
        and "packed 21 samples, 3 classes into 2 webdataset" in out
    )
    assert f"--train {tmp_path / 'out' / 'shards'}/" in out and (tmp_path / "out" / INDEX).exists()
    assert main(["pack", str(root), str(tmp_path / "dry"), "--dry-run"]) == 0
    assert "dry run: nothing written" in capsys.readouterr().out and not (tmp_path / "dry").exists()
    (tmp_path / "bad.csv").write_text("../x.jpg,1\n")
    assert main(["pack", str(tmp_path / "bad.csv"), str(tmp_path / "o2")]) == 2
    assert "climbs out of its directory" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):
        main(["pack", str(root), str(tmp_path / "o3"), "--shards", "0"])
    assert "argument --shards: '0': give a whole number >= 1" in capsys.readouterr().err


def test_a_file_swapped_for_a_link_after_the_scan_is_not_followed(tmp_path, image_folder):
    root, _ = image_folder
    plan = plan_pack(scan_source(root), shards=1)
    (tmp_path / "secret.jpg").write_bytes(jpeg(7, 50))
    swapped = root / "cat" / "00.jpg"
    swapped.unlink()
    swapped.symlink_to(tmp_path / "secret.jpg")
    with pytest.raises(PackInputError, match="00.jpg: could not be read while packing"):
        pack(plan, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "index.json").exists() and not list(
        (tmp_path / "out" / "shards").iterdir()
    )
