"""What the scripts in code/ share: argument types that refuse a bad value with a message
naming it, the flags several scripts take (--device, --checkpoint, --data-dir, --threads:
each declared once, here), one way to end on a user's mistake (one line on stderr and
exit code 2; a bug keeps its traceback), a flag for every field of the config dataclasses (help
from their docstrings), thread set-up, a log, results tables and shared tokenizers.
No script imports another script: what two of them need lives here or in the module."""

import argparse
import contextlib
import csv
import dataclasses
import errno
import functools
import hashlib
import inspect
import io
import math
import os
import pathlib
import sys
import tempfile
import typing

import docstring_parser
import tokenizers as hf_tokenizers
import torch

import annotated_transformer as at
import multi30k_files
import profiles
import safe_files

# the book's translator, shipped with it: the scripts' default checkpoint
SHIPPED_TRANSLATOR = pathlib.Path(__file__).resolve().parent.parent / "results/multi30k/averaged.pt"

# errors of the file system that point at a path the user gave (a missing file, a file
# where a folder should be, a busy run folder, no permission) or at a full or read-only disk
PATH_ERRORS = (
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


def integer_at_least(minimum):
    """An argparse type for integers >= minimum: the text read as an int, then held to the
    paper module's one rule for a count, at.positive_int, shifted so that `minimum` is the
    smallest value allowed (value - minimum + 1 must be a positive integer)."""
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(text):
        try:
            value = int(text)
            at.positive_int("value", value - minimum + 1)
        except ValueError:  # not an integer (int's error) or too small (at.InputError)
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        return value

    return parse


positive_int_flag = integer_at_least(1)  # a flag's text, read as at.positive_int checks it
non_negative_int = integer_at_least(0)


def finite_number(inclusive, what):
    """An argparse type for finite numbers > 0, or >= 0 when inclusive; `what` names them."""

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (value >= 0 if inclusive else value > 0) or value == math.inf:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return parse


positive_float = finite_number(inclusive=False, what="a positive finite number")
non_negative_float = finite_number(inclusive=True, what="a finite number >= 0")


def non_negative_floats(text):
    """An argparse type for one or more finite numbers >= 0, separated by commas: a tuple."""
    try:
        return tuple(non_negative_float(part) for part in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be finite numbers >= 0 separated by commas (e.g. 0.6,0.8,1.0), got {text!r}"
        ) from None


def given_path(text):
    """An argparse type for a file or folder; an empty path (which would mean the working
    directory) is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a file or folder, got an empty path")
    return pathlib.Path(text)


def device(text):
    try:
        at.check_device(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def add_device_flag(parser):
    parser.add_argument(
        "--device",
        type=device,
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu, cuda or cuda:N (default: cuda when available)",
    )


def add_checkpoint_flag(parser):
    parser.add_argument(
        "--checkpoint",
        type=given_path,
        metavar="FILE",
        default=SHIPPED_TRANSLATOR,
        help="a train.py checkpoint or snapshot, or an evaluate.py averaged.pt "
        "(default: the book's translator, results/multi30k/averaged.pt)",
    )


PAPER_ALPHA = 0.6  # §6.1's length penalty, for a checkpoint that records no alpha of its own


def recorded_alpha(payload):
    """The length penalty val chose for a checkpoint (its payload, as at.read_checkpoint
    reads it), which evaluate.py records in the averaged.pt it writes (chapter 6.1's
    protocol); §6.1's 0.6 for one that records none, such as a training snapshot."""
    return payload.get("alpha", PAPER_ALPHA)


def add_data_dir_flag(parser):
    parser.add_argument(
        "--data-dir",
        type=given_path,
        metavar="FOLDER",
        default=None,
        help="a local copy of Multi30k's six .gz files, each verified by its SHA-256 "
        "(default: $MULTI30K_DIR, else downloaded once into the cache)",
    )


def add_threads_flag(parser, default=None):
    """--threads; `default` None leaves the count to PyTorch (one thread per core). A script
    whose measurements assume a count passes that count, and says why where it does."""
    shown = "PyTorch's choice, one per core" if default is None else default
    parser.add_argument(
        "--threads",
        type=positive_int_flag,
        default=default,
        help=f"CPU threads for PyTorch and the tokenizer (default: {shown})",
    )


def own_folder(out, run):
    """Refuse to write results into a training run's folder (its files would be replaced)."""
    out = pathlib.Path(out)
    if out.resolve() == pathlib.Path(run).resolve() or (out / "checkpoint.pt").exists():
        raise at.InputError(
            f"--out {out} is a training run's folder; results go to a folder of their own "
            f"(e.g. results/{pathlib.Path(run).name}), so that no training file is replaced"
        )
    return out


def users_to_fix(error):
    """Whether `error` is the user's to fix from what they typed or pointed at: a bad value
    (at.InputError), missing or damaged data (multi30k_files.DatasetError), or a file-system
    error on a path or a disk. Any other error is a bug, and keeps its traceback."""
    return isinstance(error, (at.InputError, multi30k_files.DatasetError, *PATH_ERRORS)) or (
        isinstance(error, OSError) and (error.filename is not None or error.errno in DISK_ERRNOS)
    )


def user_errors_exit_2(name):
    """Decorate a script's main(): an error the user can fix (users_to_fix) ends as one line
    on stderr and exit code 2; any other error propagates with its traceback."""

    def decorate(main):
        @functools.wraps(main)
        def guarded(*args, **kwargs):
            try:
                return main(*args, **kwargs)
            except Exception as error:
                if not users_to_fix(error):
                    raise
                print(f"{name}: {error}", file=sys.stderr)
                return 2

        return guarded

    return decorate


# ---- flags from the config dataclasses


def field_help(cls):
    """{field: help} from the "Attributes:" section of a dataclass's docstring, read by
    docstring_parser (Google style: `name: what it is`, continued on indented lines)."""
    helps = {}
    for klass in reversed(cls.__mro__):  # a subclass's Attributes add to its parent's
        parsed = docstring_parser.parse(klass.__doc__ or "")
        helps.update(
            (param.arg_name, " ".join(param.description.split()))
            for param in parsed.params
            if param.args[0] == "attribute" and param.description
        )
    return helps


def field_type(cls, name):
    """The Python type of a dataclass field (int for `int | None`)."""
    hint = typing.get_type_hints(cls)[name]
    options = [t for t in typing.get_args(hint) if t is not type(None)]
    return options[0] if options else hint


def run_config_classes():
    """(RunConfig, ModelConfig): a whole run's recipe and the paper's model, looked up when a
    script asks for its flags."""
    return profiles.RunConfig, at.ModelConfig


def config_fields(classes=None):
    """(field name, dataclass) for every field of the classes (default: RunConfig and
    ModelConfig, looked up when called), except the fields that hold another of them
    (RunConfig.model); a name in two classes would be one flag for both."""
    classes = classes or run_config_classes()
    found = [
        (f.name, cls)
        for cls in classes
        for f in dataclasses.fields(cls)
        if field_type(cls, f.name) not in classes
    ]
    names = [name for name, _ in found]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise RuntimeError(f"two config classes share the fields {clashes}: rename one")
    return found


def add_config_flags(parser, classes=None):
    """One flag per config field (--d-model for d_model), its help from the class docstring,
    default None (= keep the profile's value); booleans as --pre-norm / --no-pre-norm."""
    classes = classes or run_config_classes()
    group = parser.add_argument_group(
        "recipe and model (each overrides the profile; names as in "
        + " and ".join(cls.__name__ for cls in classes)
        + ")"
    )
    helps = {cls: field_help(cls) for cls in classes}
    for name, cls in config_fields(classes):
        kind = field_type(cls, name)
        flag = "--" + name.replace("_", "-")
        where = f"{cls.__name__}.{name}"
        text = f"{helps[cls][name]} ({where})" if name in helps[cls] else where
        if kind is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, help=text)
        else:
            group.add_argument(flag, type=kind, metavar=kind.__name__.upper(), help=text)


def given_changes(args, classes=None):
    """{field: value} for every config flag given on the command line."""
    return {
        name: getattr(args, name)
        for name, _ in config_fields(classes)
        if getattr(args, name, None) is not None
    }


def command_for(config, profile="quick"):
    """The train.py command that turns the profile into `config` (a RunConfig): one flag
    for each field that differs from the profile's."""
    base, flags = profiles.PROFILES[profile], [f"--profile {profile}"]
    for name, cls in config_fields():
        owner, base_owner = (config.model, base.model) if cls is at.ModelConfig else (config, base)
        value = getattr(owner, name)
        if value != getattr(base_owner, name):
            flag = name.replace("_", "-")
            if isinstance(value, bool):  # not a dict lookup: 1 == True
                flags.append(f"--{flag}" if value else f"--no-{flag}")
            else:
                flags.append(f"--{flag} {value}")
    return "python code/train.py " + " ".join(flags)


# ---- what the long-running scripts share


def set_threads(threads):
    """CPU threads for PyTorch and for the tokenizer (whose thread pool starts on first use
    and reads RAYON_NUM_THREADS then); None leaves both to their own choice (--threads)."""
    if threads is None:
        return
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


@contextlib.contextmanager
def log_to(path, echo=print):
    """A log(message) function that appends each message to the file at `path` (nothing
    when path is None) and passes it to `echo` (nothing when echo is None)."""
    if path is not None:
        pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(os.devnull if path is None else path, "a") as file:

        def log(message):
            if echo is not None:
                echo(message)
            print(message, file=file, flush=True)

        yield log


def load_multi30k(split, *, data_dir=None):
    """The (German, English) pairs of one Multi30k split, as the scripts take them: chapter 5's
    read_multi30k on the folder that multi30k_files.multi30k_folder has verified."""
    return at.read_multi30k(multi30k_files.multi30k_folder(data_dir), split)


def read_csv(path):
    """A CSV table's rows as dicts of strings; [] when there is no file yet."""
    path = pathlib.Path(path)
    if not path.exists():
        return []
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def write_csv(path, rows, columns):
    """Write a CSV table atomically, so that a crash never leaves half a table and a reader
    never sees one."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    safe_files.write_text(path, text.getvalue())


def tokenizers(pairs, folder=None):
    """get(vocab_size): one BPE vocabulary per size, learned from `pairs` once and shared by
    every run that uses it; with a folder, kept there as tokenizer-<size>.json, so that
    several processes and later runs share it too."""
    learned = {}

    def get(vocab_size):
        if vocab_size not in learned:
            path = None if folder is None else pathlib.Path(folder) / f"tokenizer-{vocab_size}.json"
            if path is not None and path.exists():
                learned[vocab_size] = at.load_tokenizer(path)
            else:
                learned[vocab_size] = at.train_bpe(pairs, vocab_size)
                if path is not None:  # whole or not at all: other processes read it
                    safe_files.write_text(path, learned[vocab_size].to_str(pretty=True))
        return learned[vocab_size]

    return get


def tokenizer_cache_folder(pairs, cache=None):
    """The folder of `cache` (default: the system's temporary folder) that keeps the
    vocabularies learned from these pairs (see tokenizers). Its name digests the pairs, the
    tokenizers library's version and the source of at.train_bpe: a vocabulary is reused only
    where learning it again would give the same one."""
    learner = pairs_digest(pairs), hf_tokenizers.__version__, inspect.getsource(at.train_bpe)
    digest = hashlib.sha256("\n".join(learner).encode()).hexdigest()
    return pathlib.Path(cache or default_tokenizer_cache()) / digest[:16]


def cached_tokenizer(pairs, vocab_size, cache=None):
    """The BPE vocabulary of this size learned from `pairs`: read from its folder of `cache`
    (tokenizer_cache_folder) when an earlier run learned it, else learned and kept there."""
    folder = tokenizer_cache_folder(pairs, cache)
    folder.mkdir(parents=True, exist_ok=True)
    return tokenizers(pairs, folder)(vocab_size)


def pairs_digest(pairs):
    """SHA-256 of sentence pairs, in hex."""
    digest = hashlib.sha256()
    for source, target in pairs:
        digest.update(f"{source}\t{target}\n".encode())
    return digest.hexdigest()


def default_tokenizer_cache():
    return pathlib.Path(tempfile.gettempdir()) / "annotated-transformer-tokenizers"


def add_tokenizer_cache_flag(parser):
    parser.add_argument(
        "--tokenizer-cache",
        type=given_path,
        default=default_tokenizer_cache(),
        help="where BPE vocabularies learned from the training pairs are kept, one folder per "
        "set of pairs, and reused (default: %(default)s)",
    )
