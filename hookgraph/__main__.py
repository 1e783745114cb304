"""``python -m hookgraph [overrides]`` (and the ``hookgraph`` script): see the README.

Two sub-commands are taken before Hydra sees the command line (a bare word is never a
Hydra override): ``hookgraph report DIR...`` rebuilds report.html of run or sweep folders,
``hookgraph plan [--svg PATH] [overrides...]`` draws a config's plan without running it,
``hookgraph list [--config-dir DIR] [hooks|experiments|models|data|actions]`` shows every
option and where it comes from, ``hookgraph probe [CONFIG.yaml] [key=value...]`` trains a
linear probe on a run's records (``hookgraph.probe``).
"""

from __future__ import annotations

import re
import sys

COMMANDS = ("report", "plan", "list", "probe")


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] == "report":
        from hookgraph.report.__main__ import main as report_main  # lazy: a report loads no Hydra, no runner

        sys.exit(report_main(argv[1:]))
    if argv and argv[0] == "plan":
        from hookgraph.cli.plan import main as plan_main  # lazy: each command loads only what it needs

        sys.exit(plan_main(argv[1:]))
    if argv and argv[0] == "list":
        from hookgraph.cli.listing import main as list_main  # lazy: each command loads only what it needs

        sys.exit(list_main(argv[1:]))
    if argv and argv[0] == "probe":
        from hookgraph.probe import main as probe_main  # lazy: each command loads only what it needs

        sys.exit(probe_main(argv[1:]))
    if argv and re.fullmatch(r"[A-Za-z_][\w-]*", argv[0]):
        # A bare word is never an override: Hydra would say "missing EQUAL" (hookgraph lis).
        from hookgraph.errors import did_you_mean  # lazy: the commands above import what they need

        print(f"hookgraph: error: unknown command {argv[0]!r}; {did_you_mean(argv[0], COMMANDS, 'commands')} "
              "(a run takes key=value overrides: python -m hookgraph --help)", file=sys.stderr)
        sys.exit(2)
    from hookgraph.cli.app import main as app_main  # lazy: Hydra and the configs load only for runs

    app_main()


if __name__ == "__main__":
    main()
