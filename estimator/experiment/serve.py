"""`estimator serve EXPORT_DIR_OR_BASE`: TF Serving's REST API over an export
(see `estimator.serving`); Ctrl-C or SIGTERM stops it."""
from __future__ import annotations

import argparse
import logging
import signal
import sys

from .. import serving


_EXAMPLES = """
examples:
  estimator serve runs/iris/export/final                 # the newest export there, port 8501
  estimator serve runs/iris/export/final/1732950000 --port 0 --model_name iris
  curl -d '{"instances": [{"x": [5.1, 3.5, 1.4, 0.2]}]}' \\
      localhost:8501/v1/models/default:predict
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "serve", help="answer TF Serving's REST API (:predict, :classify, :regress) with an "
                      "export", description=__doc__.split("\n\n")[0], epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export", help="an export directory, or a base of timestamped exports "
                                       "(the newest is served)")
    parser.add_argument("--port", type=_port, default=8501,
                        help="TF Serving's REST port: 8501 (0: any free port)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1; 0.0.0.0 for every interface)")
    parser.add_argument("--model_name", "--model-name", default="default",
                        help="the NAME in /v1/models/NAME (default: default)")
    parser.add_argument("--file_system_poll_wait_seconds", type=float, default=1.0,
                        help="TF Serving's: how often a base is looked at for a newer "
                             "version, served once loaded (default 1; 0: never)")
    parser.set_defaults(handler=_serve)
    return parser


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is a number 0-65535")
    return port


def _serve(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        server = serving.make_server(args.export, args.host, args.port, args.model_name,
                                     args.file_system_poll_wait_seconds)
    except (ValueError, OSError) as e:
        print(f"estimator serve: error: {e}", file=sys.stderr)
        return 2
    model = server.model
    host, port = server.server_address[:2]
    print(f"Serving {model.dir} (version {model.version}) as model {model.name!r} on "
          f"http://{host}:{port}/v1/models/{model.name}; signatures: "
          f"{', '.join(sorted(model.signatures))}", flush=True)
    # SIGTERM (docker stop, Kubernetes) stops it as Ctrl-C does: the requests
    # in flight are answered (it killed them before)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", flush=True)
    finally:
        server.server_close()
    return 0
