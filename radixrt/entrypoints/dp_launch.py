"""`radixrt launch --dp-size N`: N data-parallel replicas, each a whole radixrt server (its own
HTTP frontend, scheduler, KV pool and radix cache) on ports --port .. --port+N-1, for a router
(SGLang's model gateway, SMG) to put in front: `smg launch --policy cache_aware --worker-urls
...`. radixrt routes nothing itself; each replica is what a separate `radixrt launch` would be,
so a replica on another machine (a Kubernetes pod) joins the same router the same way.

This process only supervises: it starts the replicas, says when all answer /health and prints
the router's command line; if a replica exits, it stops the others and exits 1 naming it;
SIGINT or SIGTERM is passed on to every replica (each drains as `radixrt launch` does) and it
exits 0 once they have stopped. Devices: with several CUDA devices, replica i runs on device
i mod count (CUDA_VISIBLE_DEVICES); otherwise they share what there is, and on the CPU each gets
its share of the cores (--num-threads) unless --num-threads says otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

from radixrt.server_args import ServerArgs

logger = logging.getLogger("radixrt.server")

POLL_S = 0.5
STOP_TIMEOUT_S = 30.0  # for a replica to drain and exit after SIGTERM before it is killed
# A replica is one rank; the keys go by environment (`ps` shows a command line).
_NOT_PASSED = ("dp_size", "api_key", "disaggregation_bootstrap_key")


@dataclass
class Replica:
    rank: int
    port: int
    proc: subprocess.Popen
    host: str = "127.0.0.1"  # as a URL spells it
    ready: bool = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def describe(self) -> str:
        return f"replica {self.rank} (port {self.port}, pid {self.proc.pid})"


def launch_replicas(args: ServerArgs) -> int:
    """Run --dp-size replicas until stopped: 0 after SIGINT/SIGTERM, 1 if a replica exited."""
    from radixrt.entrypoints.launch import _check_port_free
    from radixrt.observability.log_setup import configure_logging

    configure_logging("frontend", args.log_level)
    check_replica_args(args)
    for port in replica_ports(args):
        _check_port_free(args.host, port)  # fail before any replica spends seconds loading
    stop_requested: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _: stop_requested.append(signum))
    replicas = [start_replica(args, rank) for rank in range(args.dp_size)]
    try:
        return supervise(args, replicas, stop_requested)
    finally:
        stop_all(replicas)


def check_replica_args(args: ServerArgs) -> None:
    """SystemExit naming a flag that several replicas on one node cannot share."""
    if args.nnodes > 1:
        raise SystemExit(
            "--dp-size with --nnodes > 1: start one `radixrt launch` per replica on its nodes "
            "(e.g. one LeaderWorkerSet group each) and list them all in SMG's --worker-urls"
        )
    if args.dist_init_addr is not None:
        raise SystemExit(
            "--dist-init-addr cannot be shared by --dp-size replicas: leave it unset (each "
            "replica's tensor-parallel ranks meet on a free loopback port of their own)"
        )
    if args.port + args.dp_size - 1 > 65535:
        raise SystemExit(
            f"--port {args.port} with --dp-size {args.dp_size}: the ports "
            f"{args.port}..{args.port + args.dp_size - 1} pass 65535"
        )


def replica_ports(args: ServerArgs) -> list[int]:
    return [args.port + rank for rank in range(args.dp_size)]


def start_replica(args: ServerArgs, rank: int) -> Replica:
    port = args.port + rank
    cmd = [sys.executable, "-m", "radixrt.cli", "launch", *replica_flags(args, rank)]
    proc = subprocess.Popen(cmd, env=replica_env(args, rank), start_new_session=True)
    replica = Replica(rank, port, proc, host=_url_host(args.host))
    logger.info("started %s: %s", replica.describe(), replica.url)
    return replica


def replica_flags(args: ServerArgs, rank: int) -> list[str]:
    """The command line of replica `rank`: every flag given to this process (the fields that
    differ from their default) but --dp-size, with its own --port (and KV events ports)."""
    values = dataclasses.asdict(args)
    values["port"] = args.port + rank
    if args.kv_events_config:
        values["kv_events_config"] = offset_kv_event_ports(args.kv_events_config, rank)
    if values["num_threads"] is None and _runs_on_cpu(args):
        values["num_threads"] = max(1, (os.cpu_count() or 1) // args.dp_size)
    flags: list[str] = []
    for f in dataclasses.fields(ServerArgs):
        value = values[f.name]
        if f.name in _NOT_PASSED or (value == f.default and f.name != "port"):
            continue
        flag = "--" + f.name.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not False and value is not None:
            flags += [flag, str(value)]
    return flags


def offset_kv_event_ports(config: str, rank: int) -> str:
    """The KV events config of replica `rank`: each tcp:// endpoint's port plus `rank`, so
    that the replicas' publishers do not bind the same socket."""
    parsed = json.loads(config)
    for key in ("endpoint", "replay_endpoint"):
        endpoint = parsed.get(key)
        match = re.fullmatch(r"(tcp://.*):(\d+)", endpoint) if isinstance(endpoint, str) else None
        if match:
            parsed[key] = f"{match[1]}:{int(match[2]) + rank}"
    return json.dumps(parsed)


def replica_env(args: ServerArgs, rank: int) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if args.api_key:
        env["RADIXRT_API_KEY"] = args.api_key  # kept off the command line (`ps` shows it)
    if args.disaggregation_bootstrap_key:
        env["RADIXRT_DISAGGREGATION_BOOTSTRAP_KEY"] = args.disaggregation_bootstrap_key
    devices = _cuda_devices(args)
    if len(devices) > 1:
        env["CUDA_VISIBLE_DEVICES"] = devices[rank % len(devices)]
    return env


def supervise(args: ServerArgs, replicas: list[Replica], stop_requested: list[int]) -> int:
    """Wait for a stop signal (0) or a replica's exit (1); announce once every replica is up."""
    announced = False
    while not stop_requested:
        for replica in replicas:
            code = replica.proc.poll()
            if code is not None:
                logger.error(
                    "%s exited with status %d: stopping the other replicas",
                    replica.describe(),
                    code,
                )
                return 1
        if not announced and all(_check_ready(r) for r in replicas):
            announced = True
            print_banner(args, replicas)
        time.sleep(POLL_S)
    logger.info("%s: stopping %d replicas", signal.Signals(stop_requested[0]).name, len(replicas))
    return 0


def stop_all(replicas: list[Replica]) -> None:
    """SIGTERM every replica still running, then wait; kill one that outlives the timeout."""
    for replica in replicas:
        if replica.proc.poll() is None:
            replica.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for replica in replicas:
        try:
            replica.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop in %g s: killed", replica.describe(), STOP_TIMEOUT_S)
            replica.proc.kill()
            replica.proc.wait()


def print_banner(args: ServerArgs, replicas: list[Replica]) -> None:
    urls = " ".join(r.url for r in replicas)
    print(
        f"radixrt: {len(replicas)} data-parallel replicas ready: {urls}\n"
        f"  route between them with SGLang's model gateway (pip install smg), e.g.:\n"
        f"  smg launch --host {args.host} --port {args.port + len(replicas)} "
        f"--policy cache_aware --worker-urls {urls}",
        flush=True,
    )


def _check_ready(replica: Replica) -> bool:
    if not replica.ready:
        with contextlib.suppress(httpx.HTTPError):
            replica.ready = httpx.get(replica.url + "/health", timeout=2).status_code == 200
    return replica.ready


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _runs_on_cpu(args: ServerArgs) -> bool:
    return args.device == "cpu" or (args.device is None and not _cuda_devices(args))


def _cuda_devices(args: ServerArgs) -> list[str]:
    """The CUDA devices the replicas may spread over: CUDA_VISIBLE_DEVICES's list, else every
    device torch sees; none with --device cpu."""
    if args.device == "cpu":
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]
