"""The `estimator` command line: one program, subcommands.

    estimator run configs/iris.yaml                       # a YAML experiment
    estimator launch train.py --workers 2 --evaluator     # a local cluster
    estimator serve runs/iris/export/final                # TF Serving's REST API
    estimator server --address 10.0.0.2:2222              # a task, for a standalone client

Each subcommand module registers itself with `add_parser(subparsers)` and
sets `handler(args) -> exit status`.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from . import commands, launch, serve, server


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="estimator", description="TensorFlow-1-Estimator-shaped training on PyTorch.",
        epilog=commands.TOP_LEVEL_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parsers(subparsers)   # run, train, evaluate, predict, export, inspect
    launch.add_parser(subparsers)
    serve.add_parser(subparsers)
    server.add_parser(subparsers)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run `estimator COMMAND ...`; returns the exit status."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())   # (modules by name as `python -m estimator` finds them)
    parser = _parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
