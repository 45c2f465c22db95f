"""Files written atomically, the one way this library writes what a crash
must not leave half-written (checkpoints, the checkpoint index, markers in
model_dir, the resolved experiment, profiler traces)."""
from __future__ import annotations

import os
import tempfile
from typing import Callable, IO


def _umask() -> int:
    """The process's umask, read without changing it (Linux), else by setting
    and restoring it once."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_MODE = 0o666 & ~_umask()   # what open() would give a new file


def atomic_write(path: str, write: Callable[[IO[bytes]], None], sync_dir: bool = True) -> None:
    """Write `path` through `write(fileobj)` (binary) to a temp file in the
    same directory, fsync, rename over `path`, fsync the directory. A crash
    leaves the old file or the new one, never a mix; the temp file is removed
    on an error. The file's mode follows the umask, as open()'s does (a task
    running as another user of the group can read checkpoints).
    `sync_dir=False`: the rename is made durable by a later atomic_write in
    the same directory (one directory fsync covers both renames)."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp-", dir=directory)
    try:
        os.fchmod(fd, _MODE)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    if not sync_dir:
        return
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


_CHUNK = 1 << 20


def atomic_write_bytes(path: str, data: bytes, sync_dir: bool = True) -> None:
    """`atomic_write` of `data`, in 1 MiB writes: on the VMs we measure on one
    multi-megabyte write() costs 2-7x the CPU of the same bytes in 1 MiB
    pieces (a 2.7 MB checkpoint, fsync included: 1.4 ms while old checkpoints
    are deleted, 5.2 ms while the page cache grows, against 0.7 ms)."""
    def write(f):
        view = memoryview(data)
        for start in range(0, len(view), _CHUNK):
            f.write(view[start:start + _CHUNK])
    atomic_write(path, write, sync_dir=sync_dir)
