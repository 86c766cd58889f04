"""An export is reused only while its files are the ones made: each file's sha256 is recorded
when it is made and checked on reuse, a start that finds a file unchanged since it was hashed
reads none of its bytes, and a file overwritten in place (same size, its mtime put back) is
found and made again, said once at WARNING."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from structlog.testing import capture_logs

from worker.engine.export import cached
from worker.engine.export_manifest import SEAL_AGE_NS, manifest_path

MADE_FROM = {"source": {"model": "m", "weights": [["model.safetensors", 10, 1]]}, "variant": "plain"}
CONTENT = {"model.xml": b"<net>" + b"x" * 4000 + b"</net>", "model.bin": bytes(range(256)) * 64}


class Exporter:
    """Makes the two files of an export (an XML graph and its weights), counting how often."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(self, directory: Path) -> list[Path]:
        self.made += 1
        files = []
        for name, content in CONTENT.items():
            (directory / name).write_bytes(content)
            files.append(directory / name)
        return files


def events(logs: list[dict], name: str) -> list[dict]:
    return [e for e in logs if e["event"] == name]


def wait_until_older_than_a_seal_age(*files: Path) -> None:
    # A file's seal is taken only once its last change is a timestamp tick in the past.
    deadline = time.monotonic() + 30
    while any(time.time_ns() - f.stat().st_ctime_ns < SEAL_AGE_NS for f in files):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_file_overwritten_under_its_old_size_and_mtime_is_found_and_made_again(tmp_path: Path):
    path, bin_file, make = tmp_path / "model.xml", tmp_path / "model.bin", Exporter()
    first = cached(path, MADE_FROM, make)
    assert first.exported and make.made == 1
    recorded = json.loads(manifest_path(path).read_text())["files"]
    assert recorded == {
        name: {"size": len(content), "sha256": hashlib.sha256(content).hexdigest()} for name, content in CONTENT.items()
    }

    # A start after the files settled hashes them once and seals them; the next reads no byte.
    wait_until_older_than_a_seal_age(path, bin_file)
    with capture_logs() as logs:
        assert not cached(path, MADE_FROM, make).exported
    assert [e["sealed"] for e in events(logs, "export_hashed")] == [True]
    with capture_logs() as logs:
        again = cached(path, MADE_FROM, make)
    assert not again.exported and again.digest == first.digest and make.made == 1
    assert not events(logs, "export_hashed")

    # Other bytes of the same size written over the weights, and the old mtime put back.
    stat = bin_file.stat()
    with open(bin_file, "r+b") as file:
        file.write(b"\0" * stat.st_size)
    os.utime(bin_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (bin_file.stat().st_size, bin_file.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)

    with capture_logs() as logs:
        remade = cached(path, MADE_FROM, make)

    assert remade.exported and make.made == 2 and bin_file.read_bytes() == CONTENT["model.bin"]
    (damaged,) = events(logs, "export_damaged")
    assert damaged["log_level"] == "warning" and "model.bin" in damaged["reason"]
    assert remade.digest == first.digest  # the same export, made again: its scores' identity holds
    with capture_logs() as logs:
        assert not cached(path, MADE_FROM, make).exported
    assert not events(logs, "export_damaged") and make.made == 2


def test_a_missing_or_cut_file_is_made_again(tmp_path: Path):
    path, make = tmp_path / "model.xml", Exporter()
    cached(path, MADE_FROM, make)
    (tmp_path / "model.bin").unlink()
    with capture_logs() as logs:
        assert cached(path, MADE_FROM, make).exported
    assert "model.bin is missing" in events(logs, "export_damaged")[0]["reason"]

    path.write_bytes(CONTENT["model.xml"][:100])
    with capture_logs() as logs:
        assert cached(path, MADE_FROM, make).exported
    assert "model.xml is 100 bytes" in events(logs, "export_damaged")[0]["reason"] and make.made == 3


def test_an_export_whose_manifest_records_no_digests_is_made_again(tmp_path: Path):
    # As an older rerankq left it: the options alone, no digest of any file to check it by.
    path, make = tmp_path / "model.xml", Exporter()
    for name, content in CONTENT.items():
        (tmp_path / name).write_bytes(content)
    manifest_path(path).write_text(json.dumps(MADE_FROM))
    with capture_logs() as logs:
        assert cached(path, MADE_FROM, make).exported
    assert make.made == 1 and not events(logs, "export_damaged")
    assert "records no digests" in events(logs, "model_exported")[0]["reason"]
    assert json.loads(manifest_path(path).read_text())["files"]


def test_a_manifest_that_is_not_what_rerankq_writes_is_made_again_not_trusted(tmp_path: Path):
    # Valid JSON, the right made_from, but entries no rerankq wrote: each is an unreadable
    # manifest (the export is made again), never an exception out of the start nor a read
    # outside the export's directory.
    path, make = tmp_path / "model.xml", Exporter()
    cached(path, MADE_FROM, make)
    whole = json.loads(manifest_path(path).read_text())
    outside = tmp_path.parent / "outside.bin"
    outside.write_bytes(b"x")
    entry = {"size": 1, "sha256": hashlib.sha256(b"x").hexdigest()}
    for files, seals in (
        ({"model.xml": 5}, {}),
        ({"model.xml": {"size": "4011", "sha256": None}}, {}),
        ({f"../{outside.name}": entry}, {}),
        ({"/etc/hostname": entry}, {}),
    ):
        manifest_path(path).write_text(json.dumps({**whole, "files": files, "seals": seals}))
        made = make.made
        with capture_logs() as logs:
            assert cached(path, MADE_FROM, make).exported, files
        assert make.made == made + 1
        assert "unreadable" in events(logs, "model_exported")[0]["reason"], files
    assert json.loads(manifest_path(path).read_text())["files"] == whole["files"]
    # A seal that is not one is no reason to export again: the file is hashed instead.
    made = make.made
    manifest_path(path).write_text(json.dumps({**whole, "seals": {"model.xml": "sealed", "model.bin": [1, "2"]}}))
    with capture_logs() as logs:
        assert not cached(path, MADE_FROM, make).exported
    assert make.made == made and events(logs, "export_hashed")


def test_a_manifest_that_is_a_fifo_or_too_large_is_not_read(tmp_path: Path):
    path, make = tmp_path / "model.xml", Exporter()
    cached(path, MADE_FROM, make)
    manifest_path(path).unlink()
    os.mkfifo(manifest_path(path))  # read as a file, it would hang the start for ever
    with capture_logs() as logs:
        assert cached(path, MADE_FROM, make).exported and make.made == 2
    assert "unreadable" in events(logs, "model_exported")[0]["reason"]
    whole = json.loads(manifest_path(path).read_text())
    # Valid JSON, the manifest as written, but 2 MiB of it: not ours.
    manifest_path(path).write_text(json.dumps(whole) + " " * (2 << 20))
    with capture_logs() as logs:
        assert cached(path, MADE_FROM, make).exported and make.made == 3
    assert "unreadable" in events(logs, "model_exported")[0]["reason"]
