"""`vaswani-mt demo MODEL`: try a model in a web page on this machine (`vaswani_mt.inference.demo_app`).

    vaswani-mt demo runs/multi30k-en-de/model [--port 7860] [--device cpu]

Serves the page on http://127.0.0.1:PORT until Ctrl+C. MODEL is a saved model folder or a Hub id. Needs the demo
extra (gradio, matplotlib): ``pip install "vaswani-mt[demo]"``. Refused with one line and exit status 2: gradio or
matplotlib missing, a model folder that does not exist or cannot be loaded, a device that cannot be used; exit
status 1: the port is taken.
"""

from __future__ import annotations

import argparse
import errno
import socket
import sys

from ..inference.demo import DemoError, load_demo_model
from ..inference.heatmaps import require_matplotlib

try:  # the page needs gradio, an optional extra: without it, the command says how to install it
    from ..inference import demo_app
except ImportError as error:
    demo_app, MISSING = None, error
else:
    MISSING = None

INSTALL_HINT = 'the demo needs gradio and matplotlib: pip install "vaswani-mt[demo]"'
DEFAULT_PORT = 7860


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-mt demo",
        description="Try a model in a web page on this machine: translations, the beam's n-best list with scores, "
                    "and attention heatmaps.",
    )
    parser.add_argument("model", help="a saved model folder with its tokenizer (e.g. runs/NAME/model), or a Hub id")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="the port on 127.0.0.1 (default: %(default)s)")
    parser.add_argument("--device", help="cpu, cuda, cuda:N or mps, Apple's GPU (default: cuda, else mps, when "
                                         "available, else cpu)")
    return parser


def port_problem(port: int) -> str | None:
    """Why the page cannot be served on 127.0.0.1:`port`, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return f"port {port} on 127.0.0.1 is in use: choose another with --port"
            return f"cannot serve on 127.0.0.1:{port}: {error.strerror}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 1 <= args.port <= 65535:
        parser.error(f"--port must be from 1 to 65535, not {args.port}")
    try:
        if demo_app is None:
            raise ImportError(f"{INSTALL_HINT} ({MISSING})")
        require_matplotlib()
    except ImportError as error:
        message = str(error) if INSTALL_HINT in str(error) else f"{INSTALL_HINT} ({error})"
        print(f"vaswani-mt demo: error: {message}", file=sys.stderr)
        return 2
    problem = port_problem(args.port)
    if problem is not None:
        print(f"vaswani-mt demo: error: {problem}", file=sys.stderr)
        return 1
    try:
        model, tokenizer = load_demo_model(args.model, args.device)
    except DemoError as error:
        print(f"vaswani-mt demo: error: {error}", file=sys.stderr)
        return 2
    page = demo_app.build_demo(model, tokenizer, name=args.model)
    try:
        try:
            page.launch(server_name="127.0.0.1", server_port=args.port, quiet=True, share=False,
                        prevent_thread_lock=True)
        except OSError as error:  # the port was taken since it was checked
            print(f"vaswani-mt demo: error: cannot serve on 127.0.0.1:{args.port}: {error}", file=sys.stderr)
            return 1
        print(f"vaswani-mt demo: {args.model} on http://127.0.0.1:{args.port} (on {model.device}); Ctrl+C stops it",
              file=sys.stderr, flush=True)
        page.block_thread()  # until Ctrl+C, which it handles by closing the server
    except KeyboardInterrupt:  # Ctrl+C while the server was starting
        page.close()
    return 0
