"""`radixrt launch` (the server) and `radixrt generate` (one prompt through the offline engine)."""

from __future__ import annotations

import argparse
import json
import sys

from radixrt.server_args import ServerArgs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixrt")
    sub = parser.add_subparsers(dest="command", required=True)
    launch = sub.add_parser("launch", help="serve the model over HTTP (native and OpenAI APIs)")
    ServerArgs.add_cli_args(launch)
    gen = sub.add_parser("generate", help="generate text for one prompt with the offline engine")
    gen.add_argument("--prompt", required=True, help="the prompt text")
    gen.add_argument(
        "--sampling-params",
        default="{}",
        help='JSON dict, e.g. \'{"temperature": 0, "max_new_tokens": 32}\'',
    )
    gen.add_argument("--stream", action="store_true", help="print text as it is generated")
    ServerArgs.add_cli_args(gen)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    if ns.command == "launch":
        from radixrt.server.launch import launch_server

        try:
            args = ServerArgs.from_cli_args(ns)
        except ValueError as e:
            print(f"radixrt launch: {e}", file=sys.stderr)
            return 2
        return launch_server(args)
    try:
        params = json.loads(ns.sampling_params)
    except json.JSONDecodeError as e:
        print(f"--sampling-params is not valid JSON: {e}", file=sys.stderr)
        return 2
    from radixrt.engine import Engine

    args = ServerArgs.from_cli_args(ns)
    engine = Engine(**vars(args))
    try:
        if ns.stream:
            for chunk in engine.generate(ns.prompt, params, stream=True):
                print(chunk["text"], end="", flush=True)
            print()
        else:
            out = engine.generate(ns.prompt, params)
            print(out["text"])
            print(json.dumps(out["meta_info"]), file=sys.stderr)
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
