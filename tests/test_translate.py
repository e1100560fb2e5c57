"""code/translate.py: the book's translator on a reader's own sentences. Its output is the
module's `translate` line for line, blank lines kept; --reference is sacreBLEU's score, as
chapter 6.1's evaluate_bleu computes it; bad
input ends with one line on stderr, exit code 2 and no output file."""

import io
import json
import os
import pathlib
import subprocess
import sys

import pytest
import sacrebleu
import torch

import annotated_transformer as at
import fast_decoding as fd
import script_helpers as helpers
import translate

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "code" / "translate.py"
SHIPPED = ROOT / "results" / "multi30k" / "averaged.pt"
# the length penalty val chose for the shipped weights, as chapter 6.1's table reports it
SHIPPED_ALPHA = json.loads((SHIPPED.parent / "evaluation.json").read_text())["alpha"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Decoding small batches on two threads of a busy 2-core machine is several times
    slower than on one; the expected values are computed on the same thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def translator():
    return at.load_checkpoint(SHIPPED)


@pytest.fixture(scope="module")
def val():
    """Eight Multi30k validation pairs, their beam-4 translations by the module, and (for
    --greedy) the greedy ones."""
    pairs = helpers.load_multi30k("val")[:8]
    sources = [s for s, _ in pairs]
    model, tokenizer = at.load_checkpoint(SHIPPED)
    return {
        "sources": sources,
        "references": [t for _, t in pairs],
        "beam": at.translate(model, tokenizer, sources, beam_size=4, alpha=SHIPPED_ALPHA),
        "greedy": at.translate(model, tokenizer, sources, beam_size=1),
    }


def with_blanks(lines):
    """Blank lines before, between and after: ["", a, b, "", "", c, ...]."""
    out = [""]
    for i, line in enumerate(lines):
        out += [line] + [""] * (i % 3 == 1) * 2
    return out


def write_lines(path, lines):
    path.write_bytes("".join(line + "\n" for line in lines).encode())
    return path


def run_script(*args, cwd, stdin=b""):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=cwd, input=stdin, capture_output=True, env=env
    )


def test_a_file_translates_as_the_module_does_blank_lines_kept(val, tmp_path):
    # from another working directory: the shipped weights are found from the script
    lines = with_blanks(val["sources"])
    source = write_lines(tmp_path / "de.txt", lines)
    done = run_script("--input", "de.txt", "--output", "en.txt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b""
    expected = with_blanks(val["beam"])
    assert (tmp_path / "en.txt").read_text(encoding="utf-8").split("\n") == expected + [""]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["de.txt", "en.txt"]  # no temp file
    assert source.read_text().count("\n") == len(expected)


def test_sentences_as_arguments_go_to_stdout_and_nothing_else(val, tmp_path):
    done = run_script(val["sources"][0], "", val["sources"][1], cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode("utf-8") == f"{val['beam'][0]}\n\n{val['beam'][1]}\n"
    assert done.stderr == b""  # no progress bar when stderr is not a terminal


def test_standard_input_and_small_batches_give_the_same_lines(val, monkeypatch, capsys):
    data = "".join(line + "\r\n" for line in with_blanks(val["sources"])).encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert translate.main(["--batch-size", "3"]) == 0
    out = capsys.readouterr().out
    assert out.split("\n") == with_blanks(val["beam"]) + [""]


def test_beam_search_decodes_at_the_alpha_val_chose_for_the_checkpoint(
    val, tmp_path, capsys, monkeypatch
):
    assert SHIPPED_ALPHA != 0.6  # val chose another than §6.1's, so the default is seen
    alphas, real = [], fd.fast_decode_batch

    def recorded(model, src, src_mask, *, beam_size, alpha):
        alphas.append(alpha)
        return real(model, src, src_mask, beam_size=beam_size, alpha=alpha)

    monkeypatch.setattr(fd, "fast_decode_batch", recorded)
    reads, read = [], torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: reads.append(a[0]) or read(*a, **k))
    source = write_lines(tmp_path / "de.txt", val["sources"])
    assert translate.main(["--input", str(source)]) == 0
    assert set(alphas) == {SHIPPED_ALPHA}
    assert reads == [SHIPPED]  # the weights and their alpha from one reading of the file
    assert capsys.readouterr().out.splitlines() == val["beam"]
    alphas.clear()
    assert translate.main(["--input", str(source), "--alpha", "0.6"]) == 0  # the flag wins
    assert set(alphas) == {0.6}
    # a checkpoint that records no alpha (a training snapshot) decodes at §6.1's 0.6
    payload = at.read_checkpoint(SHIPPED)
    del payload["alpha"], payload["format"]
    at.save_checkpoint(tmp_path / "snapshot.pt", payload)
    alphas.clear()
    assert (
        translate.main(["--input", str(source), "--checkpoint", str(tmp_path / "snapshot.pt")]) == 0
    )
    assert set(alphas) == {0.6}


def test_greedy_is_the_module_with_beam_1(val, tmp_path, capsys):
    source = write_lines(tmp_path / "de.txt", val["sources"])
    assert val["greedy"] != val["beam"]  # so that the flag is seen to change the decoding
    assert translate.main(["--input", str(source), "--greedy"]) == 0
    assert capsys.readouterr().out.splitlines() == val["greedy"]


def test_reference_score_is_sacrebleu_on_stderr(val, tmp_path, capsys):
    source = write_lines(tmp_path / "de.txt", val["sources"])
    reference = write_lines(tmp_path / "en.txt", val["references"])
    assert translate.main(["--input", str(source), "--reference", str(reference)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == val["beam"]  # stdout: translations only
    expected = sacrebleu.corpus_bleu(val["beam"], [val["references"]]).score
    assert 5 < expected < 95  # a real score, not a degenerate one
    assert f"= {expected:.2f} " in err
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in err


def test_the_score_is_chapter_6_1s_evaluate_bleu_on_the_translations_made_once(
    val, tmp_path, capsys, monkeypatch
):
    scored, translated = [], []
    evaluate_bleu, translate_sentences = at.evaluate_bleu, at.translate

    def evaluate(model, tokenizer, pairs, **options):
        scored.append(pairs)
        return {**evaluate_bleu(model, tokenizer, pairs, **options), "signature": "as 6.1 signs"}

    def counted(model, tokenizer, sentences, **options):
        translated.append(sentences)
        return translate_sentences(model, tokenizer, sentences, **options)

    monkeypatch.setattr(at, "evaluate_bleu", evaluate)
    monkeypatch.setattr(at, "translate", counted)  # evaluate_bleu translates with it
    source = write_lines(tmp_path / "de.txt", val["sources"])
    reference = write_lines(tmp_path / "en.txt", val["references"])
    assert translate.main(["--input", str(source), "--reference", str(reference)]) == 0
    out, err = capsys.readouterr()
    assert scored == [list(zip(val["sources"], val["references"]))]
    assert translated == [val["sources"]]  # once: the scored hypotheses are the output
    assert out.splitlines() == val["beam"]
    assert err.startswith("BLEU|as 6.1 signs = ") and err.count("\n") == 1


def test_progress_bar_on_a_terminal_and_not_with_quiet(val, tmp_path, capsys, monkeypatch):
    source = write_lines(tmp_path / "de.txt", val["sources"][:4])
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert translate.main(["--input", str(source), "--greedy", "--batch-size", "2"]) == 0
    assert "4/4" in capsys.readouterr().err
    assert translate.main(["--input", str(source), "--greedy", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


# ---- bad input: exit 2, one line naming the problem, no output file


def refused(argv, capsys, output):
    """Run main(argv + --output); check exit 2, one line on stderr, no output file and no
    temporary file beside it; return the line."""
    assert translate.main([*argv, "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("translate.py: ") and err.count("\n") == 1, err
    assert not output.exists()
    assert not [p for p in output.parent.iterdir() if p.name.startswith(f".{output.name}")]
    return err


def test_bytes_that_are_not_utf8_name_the_line(tmp_path, capsys):
    source = tmp_path / "de.txt"
    source.write_bytes("Ein Hund.\nZwei Männer.\nDrei \xff Katzen.\n".encode("latin-1"))
    err = refused(["--input", str(source)], capsys, tmp_path / "en.txt")
    assert f"line 2 of {source} is not UTF-8" in err  # "ä" in Latin-1 is 0xe4: line 2 fails


def test_an_argument_that_is_not_utf8_is_named(tmp_path, capsys):
    undecodable = b"Ein \xff Hund".decode("utf-8", "surrogateescape")  # how argv brings it
    err = refused(["Ein Hund.", undecodable], capsys, tmp_path / "en.txt")
    assert "argument 2 is not UTF-8" in err


def test_a_sentence_too_long_names_the_line_and_the_limit(translator, tmp_path, capsys):
    model, tokenizer = translator
    # the output may be 50 tokens longer than the input: both positional tables must hold it
    limit = min(model.src_embed[1].max_len, model.tgt_embed[1].max_len - 50)
    words = " ".join(["Hund"] * limit)  # one token each, and </s>: one more than fits
    assert len(tokenizer.encode(words).ids) == limit
    source = write_lines(tmp_path / "de.txt", ["Ein Hund.", "", words])
    err = refused(["--input", str(source)], capsys, tmp_path / "en.txt")
    assert f"line 3 of {source} is {limit + 1} tokens long" in err
    assert f"at most {limit} tokens fit" in err


def test_a_reference_of_another_length_is_refused(val, tmp_path, capsys):
    source = write_lines(tmp_path / "de.txt", val["sources"][:3])
    reference = write_lines(tmp_path / "ref.txt", val["references"][:2])
    err = refused(["--input", str(source), "--reference", str(reference)], capsys, tmp_path / "o")
    assert f"--reference {reference} has 2 lines and the input 3" in err


def test_a_file_that_is_not_a_checkpoint_is_refused(tmp_path, capsys):
    junk = tmp_path / "notes.pt"
    junk.write_text("not a checkpoint\n")
    err = refused(["Ein Hund.", "--checkpoint", str(junk)], capsys, tmp_path / "en.txt")
    assert f"{junk} cannot be read as a checkpoint" in err


def test_a_checkpoint_of_something_else_is_refused(tmp_path, capsys):
    other = tmp_path / "other.pt"
    torch.save({"config": {"model": {"layers": 2}}, "model": {}, "tokenizer": "{}"}, other)
    err = refused(["Ein Hund.", "--checkpoint", str(other)], capsys, tmp_path / "en.txt")
    assert f"{other} is not a translator's checkpoint" in err


def test_a_missing_checkpoint_is_refused(tmp_path, capsys):
    missing = tmp_path / "runs" / "averaged.pt"
    err = refused(["Ein Hund.", "--checkpoint", str(missing)], capsys, tmp_path / "en.txt")
    assert f"no checkpoint at {missing}" in err


def test_a_failure_while_translating_keeps_its_traceback_and_writes_nothing(
    val, tmp_path, monkeypatch
):
    calls = []

    def fails_on_the_second_batch(model, src, *args, **options):
        calls.append(len(src))
        if len(calls) == 2:
            raise RuntimeError("out of memory")  # not the user's to fix: a traceback
        return torch.full((len(src), 1), at.EOS_ID)

    monkeypatch.setattr(fd, "fast_decode_batch", fails_on_the_second_batch)
    source = write_lines(tmp_path / "de.txt", val["sources"])
    output = tmp_path / "en.txt"
    with pytest.raises(RuntimeError, match="out of memory"):
        translate.main(["--input", str(source), "--batch-size", "4", "--output", str(output)])
    assert len(calls) == 2 and list(tmp_path.iterdir()) == [source]


def test_a_failure_while_writing_leaves_no_output_file(tmp_path, capsys, monkeypatch):
    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    err = refused(["Ein Hund."], capsys, tmp_path / "en.txt")
    assert "No space left on device" in err


def test_the_translator_page_names_the_alpha_the_shipped_weights_decode_at():
    page = (ROOT / "chapters" / "try_translator.md").read_text(encoding="utf-8")
    assert f"α = {SHIPPED_ALPHA} (§6.1" in page  # the prose
    assert f"beam search (4, α = {SHIPPED_ALPHA})" in page  # the menu, before the page loads
    assert (
        helpers.recorded_alpha(at.read_checkpoint(SHIPPED)) == SHIPPED_ALPHA
    )  # what translate.py decodes at
