"""A run's folder: its weight snapshots, and the lock that gives it to one process at a time.

GENERATED FILE, DO NOT EDIT. code/export.py writes it from the cells marked
`#| export run_folder` in chapters/training_runs.ipynb;
change them, then run `python code/export.py`.
"""

import os
import pathlib
import socket

# --------------------------------------------------------------------------------------
# Training runs that survive (ours), from chapters/training_runs.ipynb
# --------------------------------------------------------------------------------------

def snapshot_paths(out_dir):
    """The weight snapshots of a run, oldest first: out_dir/checkpoint-<step>.pt."""
    return sorted(pathlib.Path(out_dir).glob("checkpoint-*.pt"))


class RunFolderBusy(FileExistsError):
    """Another live process is training in this folder."""


class RunFolder:
    """with RunFolder(out, resume): out exists, holds no finished run unless resume, is
    locked by this process (out/.lock: host and pid), and holds no stale temporary files;
    owner=False (torchrun ranks > 0) touches nothing."""

    def __init__(self, out, resume=False, owner=True):
        self.out, self.resume, self.owner = pathlib.Path(out), resume, owner
        self.lock = self.out / ".lock"

    def __enter__(self):
        if not self.owner:
            return self
        if not self.resume and (self.out / "checkpoint.pt").exists():
            raise FileExistsError(
                f"{self.out / 'checkpoint.pt'} already exists; resume it (--resume) or "
                f"start the new run in another folder, so the earlier one is kept"
            )
        self.out.mkdir(parents=True, exist_ok=True)
        me = f"{socket.gethostname()} {os.getpid()}"
        try:
            fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            holder = self.lock.read_text().strip()
            host, _, pid = holder.partition(" ")
            if host != socket.gethostname() or process_alive(int(pid or 0)):
                raise RunFolderBusy(
                    f"{self.out} is in use by process {holder} (lock file {self.lock}); wait "
                    f"for it to finish or train into another folder"
                ) from None
            self.lock.write_text(me + "\n")  # the holder died: take the folder over
        else:
            with os.fdopen(fd, "w") as file:
                file.write(me + "\n")
        for stale in self.out.glob("*.tmp"):  # from a save that was killed
            stale.unlink()
        return self

    def __exit__(self, *exc):
        if self.owner:
            self.lock.unlink(missing_ok=True)


def process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0
