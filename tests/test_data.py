"""§5.1 data: Multi30k read from a folder (chapter 5's read_multi30k), the folder a local
copy or downloaded, always verified by SHA-256 (the training-runs page), and a shared BPE
vocabulary. No network: downloads are exercised with file:// addresses
and an unreachable local port."""

import gzip
import os
import pathlib
import shutil

import pytest

import annotated_transformer as at
import multi30k_files
import safe_files

ROOT = pathlib.Path(__file__).resolve().parent.parent
LOCAL_COPY = pathlib.Path(
    os.environ.get("MULTI30K_DIR") or ROOT.parent / "shared" / "data" / "multi30k"
)
needs_data = pytest.mark.skipif(
    not (LOCAL_COPY / "val.de.gz").is_file(),
    reason=f"no local Multi30k copy at {LOCAL_COPY}; set MULTI30K_DIR",
)
UNREACHABLE = "http://127.0.0.1:9/"  # the discard port: connection refused, like no network


def load_multi30k(split, src_lang="de", tgt_lang="en", data_dir=None, base_url=None):
    """A split's pairs from the verified folder, as chapter 5 reads them."""
    url = {} if base_url is None else {"base_url": base_url}
    return at.read_multi30k(
        multi30k_files.multi30k_folder(data_dir, **url), split, src_lang, tgt_lang=tgt_lang
    )


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No MULTI30K_DIR, and a cache of our own."""
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def copy_of_data(folder, corrupt=None):
    folder.mkdir(parents=True, exist_ok=True)
    for name in multi30k_files.MULTI30K_SHA256:
        shutil.copy(LOCAL_COPY / name, folder / name)
    if corrupt:
        data = bytearray((folder / corrupt).read_bytes())
        data[100] ^= 0xFF
        (folder / corrupt).write_bytes(bytes(data))
    return folder


def gzip_file(path, lines):
    with gzip.open(path, "wt", encoding="utf-8") as file:
        file.write("".join(line + "\n" for line in lines))


def test_read_multi30k_pairs_the_two_files_of_a_split_line_by_line(tmp_path):
    gzip_file(tmp_path / "val.de.gz", ["Ein Hund läuft.", "Zwei Männer, ein Boot"])
    gzip_file(tmp_path / "val.en.gz", ["A dog runs.", "Two men, one boat"])
    gzip_file(tmp_path / "test_2016_flickr.de.gz", ["Ein Kind."])
    gzip_file(tmp_path / "test_2016_flickr.en.gz", ["A child."])
    assert at.read_multi30k(tmp_path, "val") == [
        ("Ein Hund läuft.", "A dog runs."),
        ("Zwei Männer, ein Boot", "Two men, one boat"),
    ]
    assert at.read_multi30k(str(tmp_path), "val", "en", tgt_lang="de")[1] == (
        "Two men, one boat",
        "Zwei Männer, ein Boot",
    )
    assert at.read_multi30k(tmp_path, "test2016") == [("Ein Kind.", "A child.")]
    with pytest.raises(FileNotFoundError, match=r"train\.de\.gz"):
        at.read_multi30k(tmp_path, "train")


def test_read_multi30k_names_what_is_wrong(tmp_path):
    with pytest.raises(
        at.InputError, match=r"split must be one of \['test2016', 'train', 'val'\], got 'dev'"
    ):
        at.read_multi30k(tmp_path, "dev")
    with pytest.raises(at.InputError, match=r"'de' and 'en', in either order, got src_lang='fr'"):
        at.read_multi30k(tmp_path, "val", src_lang="fr")
    with pytest.raises(at.InputError, match="src_lang='de', tgt_lang='de'"):
        at.read_multi30k(tmp_path, "val", "de", tgt_lang="de")


def test_read_multi30k_refuses_files_that_are_not_aligned(tmp_path):
    gzip_file(tmp_path / "val.de.gz", ["Eins.", "Zwei."])
    gzip_file(tmp_path / "val.en.gz", ["One."])
    with pytest.raises(ValueError, match="shorter"):
        at.read_multi30k(tmp_path, "val")


@needs_data
def test_the_verified_folder_holds_all_six_files(isolated):
    assert multi30k_files.multi30k_folder(data_dir=LOCAL_COPY) == LOCAL_COPY
    assert load_multi30k("val", data_dir=LOCAL_COPY) == at.read_multi30k(LOCAL_COPY, "val")


@needs_data
def test_local_copy_gives_aligned_pairs_of_every_split(isolated):
    sizes = {"train": 29000, "val": 1014, "test2016": 1000}
    for split, size in sizes.items():
        pairs = load_multi30k(split, data_dir=LOCAL_COPY)
        assert len(pairs) == size and all(src and tgt for src, tgt in pairs)
    de_en = load_multi30k("val", data_dir=LOCAL_COPY)
    en_de = load_multi30k("val", "en", "de", data_dir=LOCAL_COPY)
    assert de_en[0] == en_de[0][::-1]
    with gzip.open(LOCAL_COPY / "val.en.gz", "rt", encoding="utf-8") as file:
        assert de_en[0][1] == file.readline().rstrip("\n")


@needs_data
def test_environment_variable_points_at_the_local_copy(isolated, monkeypatch):
    monkeypatch.setenv("MULTI30K_DIR", str(LOCAL_COPY))
    assert len(load_multi30k("val", base_url=UNREACHABLE)) == 1014
    assert not (isolated / "cache").exists()  # nothing downloaded


def test_missing_local_file_says_what_to_set(isolated):
    with pytest.raises(multi30k_files.DatasetError, match=r"train\.de\.gz.*MULTI30K_DIR"):
        load_multi30k("val", data_dir=isolated / "empty")


@needs_data
def test_corrupt_local_file_is_refused(isolated):
    folder = copy_of_data(isolated / "copy", corrupt="val.en.gz")
    with pytest.raises(multi30k_files.DatasetError, match=r"val\.en\.gz has the wrong SHA-256"):
        load_multi30k("val", data_dir=folder)


@needs_data
def test_download_is_verified_and_cached(isolated):
    mirror = copy_of_data(isolated / "mirror")
    pairs = load_multi30k("val", base_url=mirror.as_uri() + "/")
    assert len(pairs) == 1014
    cached = sorted(p.name for p in multi30k_files.default_cache_dir().iterdir())
    assert cached == sorted(multi30k_files.MULTI30K_SHA256)  # the folder is complete once verified
    # a second call reads the verified cache and needs no network
    assert load_multi30k("val", base_url=UNREACHABLE) == pairs


@needs_data
def test_corrupt_download_is_discarded(isolated):
    mirror = copy_of_data(isolated / "mirror", corrupt="val.de.gz")
    with pytest.raises(
        multi30k_files.DatasetError, match="could not download .*SHA-256 is not .*nothing was kept"
    ):
        load_multi30k("val", base_url=mirror.as_uri() + "/")
    # the files verified before it are kept; of the corrupt one, neither the file nor a .tmp
    kept = sorted(p.name for p in multi30k_files.default_cache_dir().iterdir())
    assert kept == ["train.de.gz", "train.en.gz"]


def test_no_network_and_no_local_copy_says_what_to_set(isolated):
    with pytest.raises(multi30k_files.DatasetError, match="could not download .*set MULTI30K_DIR"):
        load_multi30k("test2016", base_url=UNREACHABLE)
    assert not any(multi30k_files.default_cache_dir().iterdir())


@needs_data
def test_interrupted_download_leaves_nothing_behind(isolated, monkeypatch):
    mirror = copy_of_data(isolated / "mirror")

    opened = multi30k_files.urllib.request.urlopen

    class CutOff:  # a response that breaks after its first 1000 bytes
        def __init__(self, url, timeout):
            self.response, self.sent = opened(url, timeout=timeout), False

        def __enter__(self):
            return self

        def __exit__(self, *error):
            self.response.close()

        def read(self, size):
            if self.sent:
                raise ConnectionResetError("connection lost")
            self.sent = True
            return self.response.read(1000)

    monkeypatch.setattr(multi30k_files.urllib.request, "urlopen", CutOff)
    with pytest.raises(multi30k_files.DatasetError, match="could not download"):
        load_multi30k("val", base_url=mirror.as_uri() + "/")
    assert not any(multi30k_files.default_cache_dir().iterdir())


@needs_data
def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="split must be one of"):
        load_multi30k("dev", data_dir=LOCAL_COPY)
    with pytest.raises(ValueError, match="'de' and 'en', in either order, .*src_lang='fr'"):
        load_multi30k("val", src_lang="fr", data_dir=LOCAL_COPY)
    with pytest.raises(ValueError, match="tgt_lang='de'"):
        load_multi30k("val", "de", "de", data_dir=LOCAL_COPY)


# ---- BPE ---------------------------------------------------------------------------------

PAIRS = [
    ("Zwei junge weiße Männer sind im Freien.", "Two young, White males are outside."),
    ("Ein kleines Mädchen klettert in ein Spielhaus.", "A little girl climbing into a playhouse."),
    ("Ein Mann schläft auf einer Bank.", "A man sleeps on a bench."),
] * 5


def test_bpe_is_shared_deterministic_and_reversible(tmp_path):
    path = tmp_path / "tokenizer.json"
    tokenizer = at.train_bpe(PAIRS, vocab_size=120)
    safe_files.write_text(path, tokenizer.to_str(pretty=True))  # as train and the scripts save it
    again = at.train_bpe(PAIRS, vocab_size=120)
    assert tokenizer.to_str() == again.to_str()
    reloaded = at.load_tokenizer(path)
    assert [tokenizer.token_to_id(t) for t in at.SPECIAL_TOKENS] == [0, 1, 2, 3]
    for src, tgt in PAIRS[:3]:
        for sentence in (src, tgt):  # one vocabulary for both languages
            ids = tokenizer.encode(sentence).ids
            assert reloaded.encode(sentence).ids == ids
            assert tokenizer.decode(ids) == sentence
    unseen = tokenizer.encode("Zwei Mädchen schlafen.").ids
    assert tokenizer.decode(unseen) == "Zwei Mädchen schlafen."


def test_bpe_vocabulary_size_is_checked():
    with pytest.raises(ValueError, match="vocab_size must be an integer > 4"):
        at.train_bpe(PAIRS, vocab_size=3)
