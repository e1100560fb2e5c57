"""Re-execute chapters, each on a fresh kernel, and store their outputs in place.

    python code/run_chapters.py                       # every chapter, in _toc.yml order
    python code/run_chapters.py chapters/03_5_*.ipynb # some of them

The book shows stored outputs and nbval compares against them, so outputs are never
edited by hand: change a chapter, run this, commit. It first regenerates the module
(code/export.py), because chapters import what earlier chapters exported.
"""

import argparse
import pathlib
import sys
import time

import nbformat
from nbclient import NotebookClient

import export

KERNEL = {"display_name": "Python 3", "language": "python", "name": "python3"}


def tidy(notebook):
    """Keep only metadata that matters, so diffs show content, not bookkeeping."""
    notebook.metadata = nbformat.from_dict(
        {"kernelspec": KERNEL, "language_info": {"name": "python"}}
    )
    for cell in notebook.cells:
        tags = cell.metadata.get("tags")
        cell.metadata = nbformat.from_dict({"tags": tags} if tags else {})
    return notebook


def execute(path, timeout):
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    nbformat.write(tidy(notebook), path)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "notebooks", nargs="*", type=pathlib.Path, help="default: all chapters in _toc.yml"
    )
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per cell")
    args = parser.parse_args(argv)
    if export.main([]) != 0:
        return 2
    paths = args.notebooks or [
        export.ROOT / f"{file}.ipynb"
        for file in export.toc_files()
        if (export.ROOT / f"{file}.ipynb").exists()
    ]
    for path in paths:
        start = time.perf_counter()
        execute(path.resolve(), args.timeout)
        print(f"executed {path} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
