"""Translate German into English with the book's translator (chapter 6.1), or any other
checkpoint: sentences from the command line, from a file or from standard input, one per
line; translations on standard output or into a file, one line for each input line, in order.

    python code/translate.py "Ein Hund rennt über die Wiese."
    python code/translate.py --input german.txt --output english.txt
    echo "Zwei Männer spielen Fußball." | python code/translate.py --greedy
    python code/translate.py --input test2016.de --reference test2016.en > hypotheses.en

By default: the averaged weights that ship in results/multi30k/averaged.pt, beam search with
beam 4 and the length penalty that val chose for the checkpoint (evaluate.py records it in
averaged.pt; §6.1's 0.6 for a checkpoint that records none), batches of sentences of similar
length, the GPU when there is one. An empty input line gives an empty output line, so files
stay aligned. With
--reference, the translations are scored as evaluate.py scores them (chapter 6.1's
evaluate_bleu: sacreBLEU, cased) and the score, its signature and the length ratio go to
standard error, so that standard output carries only translations. Bad input (bytes that
are not UTF-8, a sentence longer than the model can translate, a reference file of another
length, a file that is not a checkpoint) ends with one line on standard error and exit code
2 before anything is translated; --output is written only once every line is translated.
"""

import argparse
import sys

from tqdm import tqdm

import annotated_transformer as at
import fast_decoding as fd
import safe_files
import script_helpers as helpers


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "sentences",
        nargs="*",
        help="German sentences, one per argument (default: read --input or standard input)",
    )
    files = {
        "--input": "a UTF-8 text file of German sentences, one a line",
        "--output": "write the translations here (default: stdout)",
        "--reference": "English references, one for each input line: print sacreBLEU on stderr",
    }
    for flag, text in files.items():
        parser.add_argument(flag, type=helpers.given_path, metavar="FILE", help=text)
    helpers.add_checkpoint_flag(parser)
    decoding = parser.add_mutually_exclusive_group()
    decoding.add_argument(
        "--beam-size",
        type=helpers.positive_int_flag,
        default=4,
        help="hypotheses kept (default: 4)",
    )
    decoding.add_argument("--greedy", action="store_true", help="greedy decoding (beam 1)")
    parser.add_argument(
        "--alpha",
        type=helpers.non_negative_float,
        default=None,
        help="length penalty of beam search (default: the one val chose for the checkpoint, "
        "which evaluate.py records in it; 0.6, §6.1's, where none is recorded)",
    )
    parser.add_argument(
        "--batch-size", type=helpers.positive_int_flag, default=64, help="sentences per batch"
    )
    helpers.add_device_flag(parser)
    helpers.add_threads_flag(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.sentences and args.input:
        parser.error("give sentences as arguments or --input FILE, not both")
    return args


def read_lines(data, name):
    """The lines of `data` (bytes), decoded as UTF-8; a line that is not UTF-8 is refused
    by number. Lines end at "\\n" only (a trailing "\\r" is dropped), so that line i of the
    output answers line i of the input."""
    lines = data.removeprefix(b"\xef\xbb\xbf").split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the newline that ends the last line
    decoded = []
    for number, line in enumerate(lines, 1):
        try:
            decoded.append(line.removesuffix(b"\r").decode("utf-8"))
        except UnicodeDecodeError as error:
            raise at.InputError(
                f"line {number} of {name} is not UTF-8 text (byte {line[error.start]:#04x} "
                f"at column {error.start + 1})"
            ) from None
    return decoded


def read_sources(args):
    """The sentences to translate, and how to name sentence i in a message."""
    if args.sentences:
        for number, sentence in enumerate(args.sentences, 1):
            try:
                sentence.encode("utf-8")
            except UnicodeEncodeError:  # bytes that are not UTF-8 arrive as surrogates
                raise at.InputError(f"argument {number} is not UTF-8 text") from None
        return list(args.sentences), lambda i: f"argument {i + 1}"
    if args.input is not None:
        return read_lines(
            args.input.read_bytes(), args.input
        ), lambda i: f"line {i + 1} of {args.input}"
    if sys.stdin.isatty() and not args.quiet:
        print("German sentences, one a line; end with Ctrl-D:", file=sys.stderr)
    lines = read_lines(sys.stdin.buffer.read(), "standard input")
    return lines, lambda i: f"line {i + 1} of standard input"


def load_translator(path, device):
    """(model, tokenizer, the length penalty recorded with them) from one reading of the
    file, with any failure to build a translator from it said in one line (the file may
    hold anything: its contents decide what fails)."""
    try:
        at.check_device(device)  # before the file is read
        payload = at.read_checkpoint(path)
        return *at.translator_from(payload, device), helpers.recorded_alpha(payload)
    except (OSError, at.InputError):
        raise  # check_device's and read_checkpoint's messages name the problem
    except Exception as error:  # a checkpoint of something else: a wrong config or weights
        first = str(error).strip().partition("\n")[0]
        raise at.InputError(
            f"{path} is not a translator's checkpoint ({type(error).__name__}: {first})"
        ) from None


def translate_and_score(model, tokenizer, sentences, *, references, decode, **options):
    """(the translations, their scores), `options` as at.translate takes them (beam_size,
    alpha, batch_size) and `decode` its decoder: without references, at.translate's
    translations and None; with them, at.evaluate_bleu's hypotheses and figures, so that the
    sentences are translated once and scored as every other script scores them."""
    if references is None:
        return at.translate(model, tokenizer, sentences, decode=decode, **options), None
    pairs = list(zip(sentences, references))
    scores = at.evaluate_bleu(model, tokenizer, pairs, decode=decode, **options)
    return scores["hypotheses"], scores


@helpers.user_errors_exit_2("translate.py")
def main(argv=None):
    args = parse_args(argv)
    helpers.set_threads(args.threads)
    sentences, where = read_sources(args)
    references = None
    if args.reference is not None:
        references = read_lines(args.reference.read_bytes(), args.reference)
        if len(references) != len(sentences):
            raise at.InputError(
                f"--reference {args.reference} has {len(references)} lines and the input "
                f"{len(sentences)}: it needs one reference for each input line"
            )
        if not sentences:
            raise at.InputError("--reference: the input has no lines, so there is nothing to score")
    if args.output is not None and not args.output.parent.is_dir():
        raise at.InputError(f"--output {args.output}: no folder {args.output.parent}")
    if args.output is not None and args.output.is_dir():
        raise at.InputError(f"--output {args.output} is a folder; name a file")
    model, tokenizer, recorded = load_translator(args.checkpoint, args.device)
    alpha = recorded if args.alpha is None else args.alpha
    beam_size = 1 if args.greedy else args.beam_size
    quiet = args.quiet or bool(args.sentences) or not sys.stderr.isatty()
    blank = sum(not sentence.strip() for sentence in sentences)  # nothing to translate
    with tqdm(
        total=len(sentences), initial=blank, unit="sentence", disable=quiet, file=sys.stderr
    ) as bar:

        def decode(model, src, src_mask, beam_size, alpha):  # fast decoding, counted on the bar
            out = fd.fast_decode_batch(model, src, src_mask, beam_size=beam_size, alpha=alpha)
            bar.update(src.size(0))
            return out

        try:
            options = {"beam_size": beam_size, "alpha": alpha, "batch_size": args.batch_size}
            translations, score = translate_and_score(
                model, tokenizer, sentences, references=references, decode=decode, **options
            )
        except at.InputError as error:  # a sentence too long: named as the user numbers it
            if getattr(error, "index", None) is None:
                raise
            raise at.InputError(f"{where(error.index)} {error.problem}") from None
    text = "".join(line + "\n" for line in translations)
    if args.output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        safe_files.write_text(args.output, text)
    if score is not None:  # sacreBLEU's own layout: BLEU|signature = score
        print(
            f"BLEU|{score['signature']} = {score['bleu']:.2f} "
            f"(ratio = {score['length_ratio']:.3f})",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
