"""`estimator server --address HOST:PORT`: a task's server for TF1's
standalone client mode (see `estimator.remote`): runs the task a client's
`train_and_evaluate` sends, one at a time; Ctrl-C or SIGTERM stops it and
its task (which also gets SIGTERM if the server is killed)."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from .. import remote


_EXAMPLES = """
examples:
  ESTIMATOR_SERVER_TOKEN=s3cret estimator server --address 10.0.0.5:2222
  estimator server --address 127.0.0.1:2222 --token s3cret --once

Then, on the client: RunConfig(experimental_distribute=DistributeConfig(
    train_distribute=..., remote_cluster={"chief": ["10.0.0.5:2222"], ...}))
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "server", help="run the tasks a standalone client's train_and_evaluate sends",
        description=__doc__.split("\n\n")[0], epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", required=True,
                        help="this task's address in the client's remote_cluster (host:port)")
    parser.add_argument("--token", default=None,
                        help=f"the shared secret (default: ${remote.TOKEN_ENV})")
    parser.add_argument("--once", action="store_true", help="run one task, then exit")
    parser.set_defaults(handler=_server)
    return parser


def _server(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    token = args.token or os.environ.get(remote.TOKEN_ENV, "")

    def on_sigterm(signum, frame):   # as Ctrl-C: the running task is stopped with the server
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        remote.serve(args.address, token, once=args.once)
    except ValueError as e:
        print(f"estimator server: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("stopped", flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0
