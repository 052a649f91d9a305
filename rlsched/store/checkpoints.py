"""Checkpoint directories that are whole or absent: written aside, checksummed, then renamed; copied
to a second location (a directory standing in for object storage) by a background thread; pruned
only behind the durable watermark (`rlsched.policy.durability`).

A checkpoint of iteration N is `iter-0000N/` holding whatever its writers put there (the training
state's `torch.distributed.checkpoint` shards and each rank's step and RNG, the BF16 weights as a
Hugging Face directory, the driver's `meta.json`) plus `MANIFEST.json`: every file's size and
SHA-256. The checkpoint's own checksum is the manifest's SHA-256. Until the rename, the directory is
`iter-0000N.partial/`, which nothing reads and the next save removes; after it, `verify` re-reads
every file against the manifest, so a torn or altered copy is never resumed from.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "MANIFEST.json"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete or does not match its manifest."""


@dataclass(frozen=True)
class Saved:
    iteration: int
    path: Path
    sha256: str  # of the manifest
    nbytes: int


def name(iteration: int) -> str:
    return f"iter-{iteration:07d}"


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)


def partial_dir(root: Path, iteration: int) -> Path:
    """Where the writers of checkpoint `iteration` put their files (emptied first)."""
    tmp = root / f"{name(iteration)}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def seal(root: Path, iteration: int) -> Saved:
    """Fsync every file, write the manifest, and rename the partial directory into place: from here on
    the checkpoint is whole (a crash before the rename leaves only a `.partial` that is ignored)."""
    tmp = root / f"{name(iteration)}.partial"
    entries: dict[str, dict[str, int | str]] = {}
    for f in _files(tmp):
        with f.open("rb") as handle:
            os.fsync(handle.fileno())
        entries[str(f.relative_to(tmp))] = {"bytes": f.stat().st_size, "sha256": _file_sha(f)}
    body = json.dumps({"iteration": iteration, "files": entries}, indent=1, sort_keys=True)
    with (tmp / MANIFEST).open("w") as out:
        out.write(body)
        out.flush()
        os.fsync(out.fileno())
    for d in sorted({p.parent for p in _files(tmp)} | {tmp}, key=lambda p: -len(p.parts)):
        _fsync_dir(d)
    final = root / name(iteration)
    shutil.rmtree(final, ignore_errors=True)  # a stale one from a redone iteration
    os.replace(tmp, final)
    _fsync_dir(root)
    nbytes = sum(int(e["bytes"]) for e in entries.values())
    return Saved(iteration, final, hashlib.sha256(body.encode()).hexdigest(), nbytes)


def verify(path: Path, sha256: str | None = None) -> None:
    """Every file present with its manifest's size and checksum (and the manifest the one recorded)."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        raise CheckpointError(f"{path} has no {MANIFEST}: it is not a whole checkpoint")
    body = manifest.read_text()
    if sha256 is not None and hashlib.sha256(body.encode()).hexdigest() != sha256:
        raise CheckpointError(f"{path}/{MANIFEST} is not the manifest the commit log recorded")
    for rel, entry in json.loads(body)["files"].items():
        f = path / rel
        if not f.is_file() or f.stat().st_size != entry["bytes"] or _file_sha(f) != entry["sha256"]:
            raise CheckpointError(f"{f} is missing or does not match its checksum")


def copy_verified(source: Path, dest_root: Path) -> Path:
    """Copy a checkpoint to `dest_root` aside, verify the copy, rename it into place."""
    dest_root.mkdir(parents=True, exist_ok=True)
    final = dest_root / source.name
    tmp = dest_root / f"{source.name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp)
    verify(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _fsync_dir(dest_root)
    return final


UploadDone = Callable[[int, Path | None, float, str | None], None]  # (iteration, copy or None, s, error)


class Uploader:
    """Copies sealed checkpoints to the second location one at a time, in order, off the job's thread;
    reports each outcome through `done`, which records it in the commit log."""

    def __init__(self, dest_root: Path, done: UploadDone) -> None:
        self.dest_root, self.done = dest_root, done
        self._queue: list[tuple[int, Path]] = []
        self._cv = threading.Condition()
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="checkpoint-upload", daemon=True)
        self._thread.start()

    def submit(self, iteration: int, path: Path) -> None:
        with self._cv:
            self._queue.append((iteration, path))
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                iteration, path = self._queue.pop(0)
                self._busy = True
            start = time.monotonic()
            try:
                copy = copy_verified(path, self.dest_root)
                self.done(iteration, copy, time.monotonic() - start, None)
            except (OSError, CheckpointError) as err:
                self.done(iteration, None, time.monotonic() - start, str(err))
            with self._cv:
                self._busy = False
                self._cv.notify_all()

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted upload has finished (True) or the timeout passes (False)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cv:
            while self._queue or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self, timeout_s: float | None = None) -> bool:
        finished = self.drain(timeout_s)
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        return finished
