"""``sagemaker-dist pack`` from an S3 prefix (the moto server over HTTP): an ImageFolder under a prefix and
a JSON Lines object of relative paths, packed into shards in S3 that the ``webdataset`` library reads back
with every image's bytes and label; a rerun reuses the complete shards; objects that are not what their
extension says, missing paths and rows without a label are skipped and reported; a path that climbs out
of the list's folder is an error before anything is written."""

from __future__ import annotations

import io
import json

import pytest

from sagemaker_dist.cli import main
from sagemaker_dist.launch.pack import PackInputError, pack_dataset


def jpeg(seed: int, size: int) -> bytes:
    return b"\xff\xd8\xff" + bytes((seed * 37 + i) % 251 for i in range(size))


def samples_of(s3, bucket: str, prefix: str) -> list[dict]:
    import webdataset as wds

    out = []
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
    for o in sorted(listed, key=lambda o: o["Key"]):
        blob = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        files = wds.tariterators.tar_file_iterator(io.BytesIO(blob))
        out += list(wds.tariterators.group_by_keys({**f, "__url__": "x"} for f in files))
    return out


@pytest.fixture
def images(s3, bucket):
    """s3://bucket/src/<class>/<image>: 3 classes x 5 images, a note (not an image), a file at the top,
    and a .jpg that is not a JPEG."""
    sources = {}
    for c, name in enumerate(("cat", "dog", "emu")):
        for i in range(5):
            data = jpeg(c * 10 + i, 150 + 90 * i)
            s3.put_object(Bucket=bucket, Key=f"src/{name}/{i}.jpg", Body=data)
            sources[data] = c
    s3.put_object(Bucket=bucket, Key="src/dog/notes.txt", Body=b"not an image")
    s3.put_object(Bucket=bucket, Key="src/top.jpg", Body=jpeg(99, 10))
    s3.put_object(Bucket=bucket, Key="src/emu/fake.jpg", Body=b"GIF89a, not a JPEG")
    return sources


def test_an_image_folder_in_s3_packs_into_shards_in_s3_and_a_rerun_reuses_them(s3, bucket, images, capsys):
    out = f"s3://{bucket}/packed/"
    result = pack_dataset(f"s3://{bucket}/src/", out, shards=3, seed=2, progress=False)
    assert result.index["records"] == 15 and result.index["classes"] == ["cat", "dog", "emu"]
    assert {s.path: s.reason for s in result.skipped} == {
        "top.jpg": "not in a class folder (root/<class>/<image>)",
        "emu/fake.jpg": "not a JPG file (its first bytes are b'GIF8')",
    }
    got = samples_of(s3, bucket, "packed/shards/")
    assert {s["jpg"]: int(s["cls"]) for s in got} == images
    assert result.index["source"] == {"layout": "imagefolder", "path": f"s3://{bucket}/src/"}
    again = pack_dataset(f"s3://{bucket}/src/", out, shards=3, seed=2, progress=False)
    assert (again.written, again.reused) == (0, 3) and again.index["shards"] == result.index["shards"]
    argv = ["pack", f"s3://{bucket}/src/", f"s3://{bucket}/cli/", "--shards", "2", "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "15 samples, 3 classes (imagefolder)" in printed and "skipped 2 file(s)" in printed


def test_json_lines_in_s3_name_objects_beside_them(s3, bucket):
    rows = []
    expected = {}
    for i in range(6):
        data = jpeg(i, 120 + 40 * i)
        s3.put_object(Bucket=bucket, Key=f"data/img/{i}.jpg", Body=data)
        rows.append({"path": f"img/{i}.jpg", "label": ["ant", "bee"][i % 2], "w": i})
        expected[data] = (i % 2, {"w": i})
    rows.append({"path": "img/gone.jpg", "label": "ant"})
    rows.append({"path": "img/0.jpg"})
    body = "\n".join(json.dumps(r) for r in rows).encode()
    s3.put_object(Bucket=bucket, Key="data/list.jsonl", Body=body)
    result = pack_dataset(f"s3://{bucket}/data/list.jsonl", f"s3://{bucket}/out/", shards=2, progress=False)
    assert result.index["classes"] == ["ant", "bee"] and result.index["records"] == 6
    assert sorted(s.reason for s in result.skipped) == ["missing", "no label (list.jsonl, line 8)"]
    got = samples_of(s3, bucket, "out/shards/")
    assert {s["jpg"]: (int(s["cls"]), json.loads(s["json"])) for s in got} == expected
    s3.put_object(Bucket=bucket, Key="data/bad.jsonl", Body=b'{"path": "../secret.jpg", "label": 1}\n')
    with pytest.raises(PackInputError, match="climbs out of its directory"):
        pack_dataset(f"s3://{bucket}/data/bad.jsonl", f"s3://{bucket}/never/", progress=False)
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="never/")


def test_a_scan_lists_the_prefix_once_and_reads_each_images_head_once(s3, bucket, images):
    from sagemaker_dist.launch.pack import scan_source

    calls: list[str] = []
    s3.meta.events.register("before-call.s3", lambda model, **_: calls.append(model.name))
    found = scan_source(f"s3://{bucket}/src/", client=s3)
    assert len(found.items) == 15 and len(found.skipped) == 2
    # one listing; a ranged GET per .jpg under a class folder (15 images and the fake one)
    assert calls.count("ListObjectsV2") == 1 and calls.count("GetObject") == 16
    s3.put_object(Bucket=bucket, Key="empty/", Body=b"")  # a folder placeholder only: no objects
    with pytest.raises(PackInputError, match="holds no objects"):
        scan_source(f"s3://{bucket}/empty/", client=s3)
