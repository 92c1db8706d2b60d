"""``python -m nnabla_mpt.report MONITOR_DIR``: the report of a run from the series a
:class:`~nnabla_mpt.LossScaleMonitor` wrote there: the summary on stdout, the figure in a
PNG (``--out``, by default ``MONITOR_DIR/<prefix>-report.png``).

A directory that is missing, is a file, holds no loss-scale series or holds a file that is
no ``MonitorSeries`` ends the command with status 2 and a message naming the path. Without
matplotlib the summary is printed all the same, and the command says how to install it.
"""
import argparse
import os
import sys
from typing import List, Optional

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


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        report = read_report(args.directory, prefix=args.prefix)
    except (OSError, ValueError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    sys.stdout.write(report.text() + "\n")
    out = args.out or os.path.join(args.directory, f"{args.prefix}-report.png")
    try:
        report.save(out)
    except ImportError as err:
        sys.stderr.write(f"{parser.prog}: no figure: {err}\n")
        return 0
    sys.stdout.write(f"  wrote {out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
