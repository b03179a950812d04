"""The scheduler's tensor-parallel roles in one process: a rank 0 and a rank 1 scheduler (fake
model runners, a fake group that queues what rank 0 broadcasts for rank 1) agree turn by turn;
a single-rank scheduler gets the lockstep that adds nothing."""

from __future__ import annotations

from collections import deque

import pytest
import torch
from test_scheduler_step import expected, make_scheduler

from radixrt.errors import LockstepError
from radixrt.protocol.messages import (
    AbortReq,
    BatchOutput,
    GenerateReq,
    decode_from_scheduler,
    encode,
)
from radixrt.protocol.sampling_params import SamplingParams
from radixrt.scheduler.lockstep import (
    Follower,
    Leader,
    NullTransport,
    Relay,
    ReplicaMatcher,
    join_group,
    state_digest,
)
from radixrt.scheduler.lockstep_base import SingleRank
from radixrt.scheduler.req import Req
from radixrt.scheduler.scheduler import Scheduler
from radixrt.server_args import ServerArgs


class QueueGroup:
    """Two ranks of one process: rank 0's broadcasts wait in `sent` until rank 1 takes them."""

    def __init__(self, rank: int, sent: deque[bytes]) -> None:
        self.rank = rank
        self.sent = sent
        self.timeout_s = 60.0
        self.device = torch.device("cpu")

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes:
        if data is not None:
            self.sent.append(data)
            return data
        return self.sent.popleft()


def roles() -> tuple[Leader, Follower, deque[bytes]]:
    sent: deque[bytes] = deque()
    leader = Leader(QueueGroup(0, sent), check=False, local_ranks=range(2))
    follower = Follower(QueueGroup(1, sent), check=False, local_ranks=range(2))
    return leader, follower, sent


def outputs_of(front) -> dict[str, list[int]]:
    outs: dict[str, list[int]] = {}
    for data in front.recv(timeout=0):
        msg = decode_from_scheduler(data)
        assert isinstance(msg, BatchOutput)
        for out in msg.outputs:
            outs[out.rid] = outs.get(out.rid, []) + out.new_output_ids
    return outs


def turn(scheduler: Scheduler) -> None:
    """One iteration of run_forever."""
    scheduler._take_turn(0)
    if scheduler.running or scheduler.waiting:
        scheduler.step()


def test_rank_1_follows_rank_0_through_preemption_and_an_abort():
    leader_role, follower_role, sent = roles()
    # A pool small enough that the decodes preempt each other.
    kw = dict(pool_tokens=48, page_size=4, schedule_conservativeness=0.0)
    leader, _, front = make_scheduler(lockstep=leader_role, **kw)
    follower, _, follower_front = make_scheduler(lockstep=follower_role, **kw)
    prompts = {f"r{i}": [i + 2] * 8 for i in range(4)}
    params = {"temperature": 0, "max_new_tokens": 20}
    for rid, ids in prompts.items():
        front.send(encode(GenerateReq(rid, ids, params)))
    front.send(encode(GenerateReq("gone", [9] * 8, params)))
    for i in range(500):
        if i == 3:
            front.send(encode(AbortReq("gone")))
        turn(leader)
        turn(follower)
        assert not sent, "rank 1 took every broadcast of rank 0, in turn"
        assert state_digest(follower) == state_digest(leader)
        if not (leader.running or leader.waiting):
            break
    outs = outputs_of(front)
    assert {rid: outs[rid] for rid in prompts} == {
        rid: expected(ids, 20) for rid, ids in prompts.items()
    }
    assert leader.stats.num_preemptions > 0
    ranks = [s.get_stats() for s in (leader, follower)]
    for stats in ranks:  # the block timings' sums are times: they differ a little
        stats["histograms"] = stats["histograms"]["iteration_tokens_total"]
    assert ranks[0] == ranks[1]
    assert not follower.running and not follower.waiting


def test_rank_1_holds_a_constrained_request_until_rank_0_relays_it():
    leader, follower, _ = roles()
    req = Req("c", [1, 2], SamplingParams(regex="a+"))
    req.arrival_order = 7
    assert follower.submit(req, None)  # a follower never touches `structured`
    assert not follower.submit(Req("p", [1], SamplingParams()), None)
    leader.relay(Relay([b"m"], compiled=[7], refused=[], stop=True))
    assert follower.receive(NullTransport(), None) == [b"m"]
    compiled, stop = follower.end_turn(None, stopped=False)
    assert compiled.ready == [req] and compiled.failed == [] and stop
    assert req.grammar is not None and isinstance(req.grammar.matcher, ReplicaMatcher)


def test_rank_1_forgets_a_held_request_its_client_aborted():
    leader, follower, _ = roles()
    req = Req("c", [1, 2], SamplingParams(regex="a+"))
    follower.submit(req, None)
    assert follower.cancel("c", None) == []  # rank 0 tells the client
    leader.relay(Relay([], compiled=[0], refused=[]))
    follower.receive(NullTransport(), None)
    with pytest.raises(LockstepError, match="which rank 1 does not hold"):
        follower.end_turn(None, stopped=False)


def test_rank_0_waits_for_messages_no_longer_than_the_others_wait_for_it():
    leader, _, _ = roles()
    waits: list[float | None] = []

    class Recording:
        def recv(self, timeout: float | None) -> list[bytes]:
            waits.append(timeout)
            return []

    for asked in (None, 0, 0.005, 30.0):
        leader.receive(Recording(), asked)
    assert waits == [1.0, 0, 0.005, 1.0]


def test_a_single_rank_gets_the_lockstep_that_adds_nothing():
    assert isinstance(make_scheduler()[0].lockstep, SingleRank)
    group, lockstep = join_group(ServerArgs(tp_size=1), 0, None)
    assert group is None and isinstance(lockstep, SingleRank)
    assert lockstep.failure_message(RuntimeError("boom")) == "boom"
