"""What the scripts in code/ share: argument types that refuse a bad value with a message
naming it, the --device flag, and one way to end on a user's mistake: one line on stderr
and exit code 2, never a traceback."""

import argparse
import functools
import math
import pathlib
import sys

import torch

import annotated_transformer as at

# what a user can cause by what they typed or pointed at: bad values, missing or damaged
# files, a busy folder, a read-only or full disk
USER_ERRORS = (ValueError, TypeError, OSError, at.DatasetError)


def integer_at_least(minimum, what):
    """An argparse type for integers >= minimum; `what` names them."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be a {what}, got {text!r}")
        return value

    return parse


positive_int = integer_at_least(1, "positive integer")
non_negative_int = integer_at_least(0, "integer >= 0")


def finite_number(inclusive, what):
    """An argparse type for finite numbers > 0, or >= 0 when inclusive; `what` names them."""

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (value >= 0 if inclusive else value > 0) or value == math.inf:
            raise argparse.ArgumentTypeError(f"must be a {what}, got {text!r}")
        return value

    return parse


positive_float = finite_number(inclusive=False, what="positive finite number")
non_negative_float = finite_number(inclusive=True, what="finite number >= 0")


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


def own_folder(out, run):
    """Refuse to write results into a training run's folder (its files would be replaced)."""
    out = pathlib.Path(out)
    if out.resolve() == pathlib.Path(run).resolve() or (out / "checkpoint.pt").exists():
        raise ValueError(
            f"--out {out} is a training run's folder; results go to a folder of their own "
            f"(e.g. results/{pathlib.Path(run).name}), so that no training file is replaced"
        )
    return out


def user_errors_exit_2(name):
    """Decorate a script's main(): a user's error ends as one line on stderr, exit code 2."""

    def decorate(main):
        @functools.wraps(main)
        def guarded(*args, **kwargs):
            try:
                return main(*args, **kwargs)
            except USER_ERRORS as error:
                print(f"{name}: {error}", file=sys.stderr)
                return 2

        return guarded

    return decorate
