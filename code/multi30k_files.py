"""Multi30k as published: the six files of the German-English data, each verified against
its SHA-256, read from a local copy (data_dir or $MULTI30K_DIR) or downloaded once into a
cache. Chapter 5 reads its data from multi30k_folder; the training-runs page explains why.
No torch here, like safe_files, through which a download is written whole."""

import hashlib
import os
import pathlib
import urllib.request

from safe_files import atomic_file

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
# SHA-256 of the gzip files as published; a download or local copy that differs is refused
MULTI30K_SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
}


class DatasetError(RuntimeError):
    """A data file is missing, corrupt or cannot be downloaded; the message says what to do."""


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_cache_dir():
    """Where downloads go: $XDG_CACHE_HOME (or ~/.cache)/annotated-transformer/multi30k."""
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "annotated-transformer" / "multi30k"


def download(url, path, sha256):
    """Fetch url to path, verified: the bytes go to a temporary file in the same folder,
    renamed into place only once their checksum matches; nothing else is left behind."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, atomic_file(path, "wb") as file:
            digest = hashlib.sha256()
            for block in iter(lambda: response.read(1 << 20), b""):
                digest.update(block)
                file.write(block)
            if digest.hexdigest() != sha256:  # raised inside the block: nothing is kept
                raise DatasetError(f"its SHA-256 is not {sha256}")
    except (OSError, DatasetError) as error:  # urllib's URLError is an OSError
        raise DatasetError(
            f"could not download {url} ({error}); nothing was kept. Try again, or point "
            f"the loader at a verified local copy: set MULTI30K_DIR or pass data_dir"
        ) from error
    return path


def multi30k_file(filename, data_dir=None, base_url=MULTI30K_URL):
    """The verified path of one Multi30k file: from data_dir (or $MULTI30K_DIR) when given,
    otherwise from the cache, downloading it there first if needed."""
    expected = MULTI30K_SHA256[filename]
    local = data_dir or os.environ.get("MULTI30K_DIR")
    if not local:
        path = default_cache_dir() / filename
        if path.is_file() and sha256_of(path) == expected:
            return path
        return download(base_url + filename, path, expected)
    path = pathlib.Path(local) / filename
    problem = "does not exist" if not path.is_file() else None
    if problem is None and sha256_of(path) != expected:
        problem = "has the wrong SHA-256: it is corrupt or not the published file"
    if problem:
        raise DatasetError(
            f"{path} {problem}; the local Multi30k copy (data_dir or MULTI30K_DIR={local}) "
            f"must hold {filename} with SHA-256 {expected}: download it from {base_url}{filename}"
        )
    return path


def multi30k_folder(data_dir=None, base_url=MULTI30K_URL):
    """A folder in which all six Multi30k files are verified against their SHA-256: data_dir
    (or $MULTI30K_DIR) when given, otherwise the cache, where what is missing is downloaded.
    Chapter 5's read_multi30k reads a split from it."""
    paths = [multi30k_file(name, data_dir, base_url) for name in MULTI30K_SHA256]
    return paths[0].parent
