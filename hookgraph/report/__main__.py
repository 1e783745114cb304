"""``python -m hookgraph.report RUN_OR_SWEEP_DIR...`` (also ``hookgraph report ...``):
(re)build report.html in each folder and print its path."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hookgraph.errors import HookGraphError
from hookgraph.report import report
from hookgraph.runs import layout


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hookgraph report", description=f"Write {layout.REPORT} into run or sweep folders."
    )
    parser.add_argument("dirs", nargs="+", metavar="RUN_OR_SWEEP_DIR")
    args = parser.parse_args(argv)
    status = 0
    for d in args.dirs:
        try:
            print(report(d))
        except (HookGraphError, OSError) as exc:
            print(f"hookgraph: error: {exc}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
