"""``python -m nnabla_mpt.report MONITOR_DIR``: the report of a run from the series a
:class:`~nnabla_mpt.LossScaleMonitor` wrote there: the summary on stdout, the figure in a
PNG (``--out``, by default ``MONITOR_DIR/<prefix>-report.png``).

A directory that is missing, is a file, holds no loss-scale series, or holds a file that is
no ``MonitorSeries``, a special file (a FIFO, refused without waiting) or values that make
no sense ends the command with status 2 and a message naming the path and the line; so
does an ``--out`` that cannot be written (a folder, a missing or read-only folder, a suffix
matplotlib does not write), checked before anything is read. Without
matplotlib the summary is printed all the same, and the command says how to install it.
"""
import argparse
import os
import sys
from typing import List, Optional

from ..files.regular_file import check_existing
from ..files.writable import cannot_write_in
from .figure import figure_formats
from .run_report import read_report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m nnabla_mpt.report",
        description="The report of a training run's loss scale, from the series a "
                    "LossScaleMonitor wrote: a summary, and a figure of the scale, the "
                    "skipped steps, the overflow rate and the gradient statistics.")
    p.add_argument("directory", metavar="MONITOR_DIR",
                   help="the directory of the series (the Monitor's save_path)")
    p.add_argument("--out", metavar="FILE.png", default=None,
                   help="where to draw the figure (default: MONITOR_DIR/PREFIX-report.png)")
    p.add_argument("--prefix", default="loss-scale",
                   help="the LossScaleMonitor's prefix (default: %(default)s)")
    return p


def checked_out(out: str) -> str:
    """Why the figure cannot be written to ``out``, or ``""``: a folder, a special file, a
    missing or read-only folder, or a suffix matplotlib does not write (where matplotlib
    is installed)."""
    if os.path.isdir(out):
        return (f"--out {out}: a folder; give the figure's file name, such as "
                f"{os.path.join(out, 'loss-scale-report.png')}")
    try:
        check_existing(out, f"--out {out}")
    except OSError as err:
        return str(err.strerror)
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        return f"--out {out}: no folder {folder} to write the figure in"
    why = cannot_write_in(folder)
    if why:
        return f"--out {out}: the folder {folder} cannot be written to ({why})"
    formats = figure_formats()
    suffix = os.path.splitext(out)[1][1:].lower()
    if formats is not None and suffix not in formats:
        return (f"--out {out}: matplotlib writes {', '.join(f'.{f}' for f in formats)}, not "
                f"{'.' + suffix if suffix else 'a file without a suffix'}")
    return ""


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    out = args.out or os.path.join(args.directory, f"{args.prefix}-report.png")
    why = checked_out(out) if args.out is not None else ""
    if why:
        parser.exit(2, f"{parser.prog}: error: {why}\n")
    try:
        report = read_report(args.directory, prefix=args.prefix)
    except (OSError, ValueError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    sys.stdout.write(report.text() + "\n")
    try:
        report.save(out)
    except ImportError as err:
        sys.stderr.write(f"{parser.prog}: no figure: {err}\n")
        return 0
    except OSError as err:
        parser.exit(2, f"{parser.prog}: error: cannot write the figure to {out}: {err}\n")
    sys.stdout.write(f"  wrote {out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
