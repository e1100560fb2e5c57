"""Files written whole: every file the book writes is renamed into place once complete
(atomic_file, write_text, write_json), so a crash leaves the old file or the new one, never
half of one; the training-runs page explains it. No torch here: a script that only writes
files (code/export.py) loads this module in a blink."""

import contextlib
import json
import os
import pathlib
import stat
import tempfile


def permissions_for(path):
    """The permission bits of the file at `path`, or, where there is none, those a new file
    gets from open(): 0o666 less the process's umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)  # reading the umask means setting it: put it straight back
        os.umask(umask)
        return 0o666 & ~umask


@contextlib.contextmanager
def atomic_file(path, mode="w"):
    """Open a temporary file beside `path` (mode "w": UTF-8 text, "wb": bytes) and rename it
    onto `path` once the block has ended without an error, synced to disk: a reader finds
    the old file or the whole new one, never half of one. After an error, nothing is kept.
    The new file keeps the old one's permissions, or gets those open() would give it."""
    path = pathlib.Path(path)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    text = {} if "b" in mode else {"encoding": "utf-8", "newline": "\n"}
    try:
        os.chmod(handle, permissions_for(path))  # mkstemp's are the owner's alone (0o600)
        with os.fdopen(handle, mode, **text) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    finally:
        pathlib.Path(tmp).unlink(missing_ok=True)


def write_text(path, text):
    """Text (UTF-8) written as atomically as a checkpoint (a reader never sees half a file)."""
    with atomic_file(path) as file:
        file.write(text)


def write_json(path, data, indent=1):
    """JSON written as atomically as a checkpoint (a reader never sees half a file); indent
    None writes it on one line."""
    write_text(path, json.dumps(data, indent=indent) + "\n")
