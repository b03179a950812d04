"""The transports, for the scheduler's side: they live in radixrt/transport.py (torch-free, so
that the HTTP process can import them without importing this package)."""

from radixrt.transport import QueueTransport, Transport, ZmqTransport, queue_pair

__all__ = ["QueueTransport", "Transport", "ZmqTransport", "queue_pair"]
