"""`radixrt launch` (the server), `radixrt generate` (one prompt through the offline engine),
`radixrt --version`.

A bad flag (unknown, a bad choice or type, a value ServerArgs refuses) is one line on stderr
and exit status 2, before anything is loaded."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from typing import NoReturn

from radixrt.server_args import ServerArgs

USAGE_ERROR = 2  # argparse's exit status for a bad command line


class _OneLineErrors(argparse.ArgumentParser):
    """argparse, but an error is one line, not the usage of ~45 flags before it."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrors(prog="radixrt")
    parser.add_argument("--version", action="version", version=f"radixrt {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    launch = sub.add_parser(
        "launch",
        help="serve the model over HTTP (native and OpenAI APIs)",
        usage="%(prog)s [options]",
    )
    ServerArgs.add_cli_args(launch)
    gen = sub.add_parser(
        "generate",
        help="generate text for one prompt with the offline engine",
        usage="%(prog)s --prompt TEXT [options]",
    )
    own = gen.add_argument_group("Generate")
    own.add_argument("--prompt", required=True, help="the prompt text")
    own.add_argument(
        "--sampling-params",
        default="{}",
        help='JSON dict, e.g. \'{"temperature": 0, "max_new_tokens": 32}\' (default: {})',
    )
    own.add_argument(
        "--stream", action="store_true", help="print text as it is generated (default: off)"
    )
    ServerArgs.add_cli_args(gen)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("radixrt")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "(not installed)"


def _usage_error(command: str, message: str) -> int:
    print(f"radixrt {command}: {message}", file=sys.stderr)
    return USAGE_ERROR


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        args = ServerArgs.from_cli_args(ns)
    except ValueError as e:
        return _usage_error(ns.command, str(e))
    if ns.command == "launch":
        from radixrt.entrypoints.launch import launch_server

        return launch_server(args)
    try:
        params = json.loads(ns.sampling_params)
    except json.JSONDecodeError as e:
        return _usage_error("generate", f"--sampling-params is not valid JSON: {e}")
    if not isinstance(params, dict):
        return _usage_error("generate", "--sampling-params must be a JSON object")
    return _generate(args, ns.prompt, params, ns.stream)


def _generate(args: ServerArgs, prompt: str, params: dict, stream: bool) -> int:
    from radixrt.frontend.engine import Engine
    from radixrt.observability.log_setup import configure_logging

    configure_logging("frontend", args.log_level)
    engine = Engine(**vars(args))
    try:
        if stream:
            for chunk in engine.generate(prompt, params, stream=True):
                print(chunk["text"], end="", flush=True)
            print()
        else:
            out = engine.generate(prompt, params)
            print(out["text"])
            print(json.dumps(out["meta_info"]), file=sys.stderr)
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
