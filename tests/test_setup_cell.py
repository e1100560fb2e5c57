"""The setup cell that opens every chapter, run as Colab would run it: in a folder without
the repository. It must fetch the book (git clone), install what Colab lacks and make the
module importable. `git` is replaced by a stand-in that copies this checkout instead of
reaching GitHub; pip finds the requirements already installed, so no network is used."""

import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def setup_cell_source():
    notebook = json.loads((ROOT / "chapters" / "03_1_encoder_decoder_stacks.ipynb").read_text())
    first = next(c for c in notebook["cells"] if c["cell_type"] == "code")
    return "".join(first["source"])


def fake_git(folder, log):
    """A `git` that records its arguments and 'clones' by copying this checkout."""
    script = folder / "git"
    script.write_text(
        f"#!{sys.executable}\n"
        "import shutil, sys\n"
        f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"shutil.copytree({str(ROOT)!r}, sys.argv[-1], "
        "ignore=shutil.ignore_patterns('.venv', '_build', '.git', '__pycache__'))\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def run_cell(cwd, bin_dir):
    program = (
        setup_cell_source()
        + "\nimport annotated_transformer\nprint(annotated_transformer.__file__)\n"
    )
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        [sys.executable, "-c", program],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_setup_cell_fetches_the_book_when_code_is_absent(tmp_path):
    colab, bin_dir, log = tmp_path / "content", tmp_path / "bin", tmp_path / "git.log"
    colab.mkdir()
    bin_dir.mkdir()
    fake_git(bin_dir, log)
    result = run_cell(colab, bin_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(colab / "aiayn" / "code" / "annotated_transformer.py")
    assert log.read_text().startswith("clone -q --depth=1 https://github.com/")
    # a second run (the cell executed again) reuses the clone instead of cloning twice
    assert run_cell(colab, bin_dir).returncode == 0
    assert len(log.read_text().splitlines()) == 1


def test_setup_cell_uses_the_checkout_it_is_in(tmp_path):
    bin_dir, log = tmp_path / "bin", tmp_path / "git.log"
    bin_dir.mkdir()
    fake_git(bin_dir, log)
    result = run_cell(ROOT / "chapters", bin_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(ROOT / "code" / "annotated_transformer.py")
    assert not log.exists()  # nothing fetched
    assert shutil.which("git")  # the real git is untouched for everything else
