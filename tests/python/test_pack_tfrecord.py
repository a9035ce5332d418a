"""TFRecord sources: files written by the `tfrecord` package (TensorFlow's framing and
tf.train.Example protobufs, written by protobuf itself), packed and read back."""

from __future__ import annotations

import gzip
import json
import pickle
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import stoker
from stoker.packing.members import Options
from stoker.packing.sources.tfrecord import TFRecordSource, parse_example

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

tfrecord = pytest.importorskip("tfrecord")

IMAGES = sorted(
    (Path(__file__).resolve().parents[3] / "shared/data/imagenet-sample").glob("*.JPEG")
)


def _images(n: int) -> list[bytes]:
    if len(IMAGES) < n:
        pytest.skip("../shared/data/imagenet-sample is not here")
    return [p.read_bytes() for p in IMAGES[:n]]


def write_imagenet_style(path: Path, images: list[bytes], first_label: int = 0) -> list[int]:
    """TF's ImageNet layout (inception's build_imagenet_data.py): image/encoded, a 1-based
    image/class/label and the metadata beside them."""
    writer = tfrecord.TFRecordWriter(str(path))
    labels = []
    for i, data in enumerate(images):
        label = first_label + i % 5 + 1
        labels.append(label)
        writer.write(
            {
                "image/encoded": (data, "byte"),
                "image/format": (b"JPEG", "byte"),
                "image/filename": (f"img_{first_label + i:04d}.JPEG".encode(), "byte"),
                "image/class/label": (label, "int"),
                "image/class/synset": (b"n01440764", "byte"),
                "image/height": (100, "int"),
                "image/object/bbox/xmin": ([0.1, 0.25], "float"),
            }
        )
    writer.close()
    return labels


def members_of(out: Path) -> list[dict[str, bytes]]:
    """Every sample of a pack as {member: bytes}, in key order (tar members read by tarfile)."""
    import tarfile

    samples: dict[str, dict[str, bytes]] = {}
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for info in tar:
                key, _, member = info.name.partition(".")
                f = tar.extractfile(info)
                assert f is not None
                samples.setdefault(key, {})[member] = f.read()
    return [samples[k] for k in sorted(samples)]


def test_imagenet_style_records_round_trip_byte_for_byte(tmp_path):
    images = _images(12)
    labels = write_imagenet_style(tmp_path / "train-00000-of-00002", images[:7])
    labels += write_imagenet_style(tmp_path / "train-00001-of-00002", images[7:], first_label=7)
    out = tmp_path / "pack"
    result = stoker.pack(tmp_path, out, restart_interval=0, progress=False, threads=2)
    assert result.num_samples == 12 and result.source_format == "tfrecord"
    samples = members_of(out)
    assert [s["jpg"] for s in samples] == images
    assert [int(s["cls"]) for s in samples] == labels
    assert all(set(s) == {"jpg", "cls"} for s in samples)  # the image and the label only
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source_format"] == "tfrecord"
    # image/filename is the source's name for each sample
    rows = (out / "sources.tsv").read_text().splitlines()
    assert rows[0].split("\t")[3] == "img_0000.JPEG" and rows[8].split("\t")[3] == "img_0008.JPEG"
    assert "train-00001-of-00002: record 1" in rows[8]
    loader = stoker.ImageLoader(out, batch_size=4, size=32, shuffle=False)
    got = [int(y) for _, ys in loader for y in ys]
    assert got == labels


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_compressed_files_are_found_and_read(tmp_path, compression):
    images = _images(5)
    plain = tmp_path / "plain.tfrecord"
    labels = write_imagenet_style(plain, images)
    data = plain.read_bytes()
    packed = tmp_path / f"data.tfrecord.{compression}"
    packed.write_bytes(gzip.compress(data) if compression == "gzip" else zlib.compress(data))
    plain.unlink()
    for named in (None, compression):  # found from the bytes, or named
        out = tmp_path / f"out-{named}"
        stoker.pack(packed, out, compression=named, restart_interval=0, progress=False)
        samples = members_of(out)
        assert [s["jpg"] for s in samples] == images
        assert [int(s["cls"]) for s in samples] == labels


def test_features_become_members_as_named(tmp_path):
    images = _images(4)
    write_imagenet_style(tmp_path / "a.tfrecord", images)
    out = tmp_path / "out"
    members = {"jpg": "image/encoded", "xmin.npy": "image/object/bbox/xmin",
               "synset.txt": "image/class/synset"}  # fmt: skip
    stoker.pack(tmp_path / "a.tfrecord", out, members=members, label="image/height",
                restart_interval=0, progress=False)  # fmt: skip
    samples = members_of(out)
    assert [s["jpg"] for s in samples] == images
    assert all(int(s["cls"]) == 100 for s in samples)
    xmin = np.load(__import__("io").BytesIO(samples[0]["xmin.npy"]))
    assert xmin.dtype == np.float32 and xmin.tolist() == pytest.approx([0.1, 0.25])
    assert samples[0]["synset.txt"] == b"n01440764"


def test_records_without_an_image_keep_every_feature(tmp_path):
    path = tmp_path / "feats.tfrecord"
    writer = tfrecord.TFRecordWriter(str(path))
    for i in range(6):
        writer.write({"tokens": (list(range(i, i + 4)), "int"), "score": ([i / 2], "float"),
                      "text": (f"sample {i}".encode(), "byte"),
                      "label": (i % 3, "int")})  # fmt: skip
    writer.close()
    out = tmp_path / "out"
    stoker.pack(path, out, progress=False)
    samples = members_of(out)
    assert len(samples) == 6
    assert set(samples[2]) == {"tokens.npy", "score.npy", "text.txt", "cls"}
    assert np.load(__import__("io").BytesIO(samples[2]["tokens.npy"])).tolist() == [2, 3, 4, 5]
    assert samples[2]["text.txt"] == b"sample 2" and samples[2]["cls"] == b"2"


def test_parser_agrees_with_protobuf_on_negative_and_large_values(tmp_path):
    from tfrecord import example_pb2

    example = example_pb2.Example()
    feature = example.features.feature
    feature["ints"].int64_list.value.extend([-1, 0, 2**62, -(2**63)])
    feature["floats"].float_list.value.extend([1.5, -2.25])
    feature["empty"].bytes_list.value.extend([])
    feature["two"].bytes_list.value.extend([b"a", b"\x00\xff"])
    parsed = parse_example(example.SerializeToString())
    assert parsed["ints"] == ("int64", [-1, 0, 2**62, -(2**63)])
    assert parsed["floats"] == ("float", [1.5, -2.25])
    assert parsed["two"] == ("bytes", [b"a", b"\x00\xff"])
    assert parsed["empty"][1] == []


def _frame_offsets(data: bytes) -> list[int]:
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        pos += 12 + length + 4
    return offsets


def test_a_bad_data_crc_spoils_one_record_and_is_named(tmp_path):
    images = _images(6)
    path = tmp_path / "bad.tfrecord"
    labels = write_imagenet_style(path, images)
    data = bytearray(path.read_bytes())
    third = _frame_offsets(bytes(data))[2]
    data[third + 12 + 40] ^= 0xFF  # a byte inside record 2's data
    path.write_bytes(bytes(data))
    result = stoker.pack(path, tmp_path / "out", restart_interval=0, progress=False)
    assert result.num_samples == 5
    assert len(result.failed) == 1
    where, why = result.failed[0]
    assert where == f"{path}: record 2 (byte {third})" and "data CRC" in why
    samples = members_of(tmp_path / "out")
    assert [s["jpg"] for s in samples] == images[:2] + images[3:]
    assert [int(s["cls"]) for s in samples] == labels[:2] + labels[3:]
    with pytest.raises(stoker.CorruptDataError, match=r"bad\.tfrecord: record 2 .*data CRC"):
        stoker.pack(path, tmp_path / "out2", on_error="raise", progress=False)
    assert not (tmp_path / "out2").exists() and not (tmp_path / ".out2.partial").exists()


def test_a_bad_length_or_a_truncation_ends_the_file_as_one_failure(tmp_path):
    images = _images(6)
    path = tmp_path / "len.tfrecord"
    write_imagenet_style(path, images)
    clean = path.read_bytes()
    offsets = _frame_offsets(clean)
    damaged = bytearray(clean)
    damaged[offsets[4] + 3] ^= 0x10  # record 4's length
    path.write_bytes(bytes(damaged))
    result = stoker.pack(path, tmp_path / "out", restart_interval=0, progress=False)
    assert result.num_samples == 4
    assert result.failed == [
        (f"{path}: record 4 (byte {offsets[4]})",
         "bad length CRC: the record's length is damaged; the rest of the file is unreadable")
    ]  # fmt: skip
    # Cut inside record 3: three records, then the truncation named
    path.write_bytes(clean[: offsets[3] + 100])
    result = stoker.pack(path, tmp_path / "out2", progress=False)
    assert result.num_samples == 3
    ((where, why),) = result.failed
    assert where == f"{path}: record 3 (byte {offsets[3]})" and "truncated" in why
    # a GZIP file cut short: the records before the cut are kept
    gz = tmp_path / "cut.tfrecord.gz"
    gz.write_bytes(gzip.compress(clean)[: len(gzip.compress(clean)) * 2 // 3])
    result = stoker.pack(gz, tmp_path / "out3", progress=False)
    assert 0 < result.num_samples < 6 and len(result.failed) == 1
    assert "cut.tfrecord.gz: record" in result.failed[0][0]


def test_a_record_that_is_not_an_example_is_named(tmp_path):
    from stoker.packing.sources.tfrecord import masked_crc

    path = tmp_path / "junk.tfrecord"
    with open(path, "wb") as f:
        for data in (b"\x0a\xff\xff\xff\xff\x0f", b"\x0f"):  # a length past the end; wire type 7
            head = struct.pack("<Q", len(data))
            f.write(head + struct.pack("<I", masked_crc(head)) + data)
            f.write(struct.pack("<I", masked_crc(data)))
    with pytest.raises(
        stoker.StokerError, match=r"junk\.tfrecord: record 0 .*not a tf.train.Example"
    ):
        stoker.pack(path, tmp_path / "out", on_error="raise", progress=False)
    with pytest.raises(stoker.StokerError, match="none of its 2 records"):
        stoker.pack(path, tmp_path / "out", progress=False)


def test_ranges_and_pickling_give_the_same_records(tmp_path):
    images = _images(9)
    write_imagenet_style(tmp_path / "x-00000-of-00002.tfrecord", images[:4])
    write_imagenet_style(tmp_path / "x-00001-of-00002.tfrecord", images[4:])
    source = TFRecordSource(tmp_path, Options())
    assert len(source) == 9
    whole = [job.where for job in source.jobs()]
    assert [job.where for job in source.jobs(3, 7)] == whole[3:7]
    copy = pickle.loads(pickle.dumps(source))
    assert [job.make().members for job in copy.jobs(5, 6)] == [
        job.make().members for job in source.jobs(5, 6)
    ]


def test_detection_format_and_the_command_line(tmp_path):
    images = _images(3)
    path = tmp_path / "noext"
    write_imagenet_style(path, images)
    assert stoker.packing.sources.detect(path) == "tfrecord"  # by its framing
    with pytest.raises(stoker.InvalidArgumentError, match="does not take images="):
        stoker.pack(path, tmp_path / "o", images=tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "stoker", "pack", str(path), str(tmp_path / "cli"),
         "--format", "tfrecord", "--restart-interval", "0"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert [s["jpg"] for s in members_of(tmp_path / "cli")] == images
    r = subprocess.run([sys.executable, "-m", "stoker", "inspect", str(tmp_path / "cli")],
                       capture_output=True, text=True, check=True)  # fmt: skip
    assert "packed from tfrecord" in r.stdout and "samples     3" in r.stdout


def test_mutated_records_fail_as_located_records_never_otherwise(tmp_path):
    """Random byte flips, truncations and length rewrites of a real Example: the parser either
    parses or raises SampleFailure; nothing else, and no allocation beyond the record."""
    from stoker.packing.sources.tfrecord import example_sample, masked_crc

    from tfrecord import writer as tf_writer

    data = tf_writer.TFRecordWriter.serialize_tf_example(
        {"image/encoded": (_images(1)[0][:3000], "byte"), "image/class/label": (3, "int"),
         "image/object/bbox/xmin": ([0.5, 0.25], "float"), "ids": (list(range(40)), "int")}
    )  # fmt: skip
    rng = np.random.default_rng(0)
    outcomes = {"parsed": 0, "failed": 0}
    for trial in range(3000):
        mutated = bytearray(data)
        kind = trial % 3
        if kind == 0:
            for _ in range(int(rng.integers(1, 6))):
                mutated[int(rng.integers(0, len(mutated)))] = int(rng.integers(0, 256))
        elif kind == 1:
            mutated = mutated[: int(rng.integers(0, len(mutated)))]
        else:  # a varint length somewhere set huge
            at = int(rng.integers(0, len(mutated) - 5))
            mutated[at : at + 5] = b"\xff\xff\xff\xff\x0f"
        blob = bytes(mutated)
        try:
            example_sample(blob, masked_crc(blob), f"r{trial}", {"ids.npy": "ids"}, None, Options())
            outcomes["parsed"] += 1
        except stoker.packing.source.SampleFailure as e:
            assert e.where == f"r{trial}" and e.reason
            outcomes["failed"] += 1
    assert outcomes["failed"] > 1000 and outcomes["parsed"] > 0
