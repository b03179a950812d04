"""The command line every DSL example shares: `--url URL` of a running server, else a local
server started here (rt.Runtime) for the run."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import radixrt as rt


def run_example(main: Callable[[rt.Backend], Any], doc: str) -> None:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--url", help="a running radixrt server (default: start one here)")
    args = parser.parse_args()
    backend = rt.RuntimeEndpoint(args.url) if args.url else rt.Runtime()
    try:
        main(backend)
    finally:
        backend.shutdown()
