"""SmolLM3's and Phi-3's pieces against transformers' own: partial rotary (an odd rotary dim
too), LongRoPE's cos/sin per sequence length, NoPE layers and windows read from the config,
refusals naming the field, stacked checkpoint tensors split over tensor-parallel ranks, and
the scheduler's LongRoPE rule (a request computed again when it grows past the switch length;
its long-frequency K/V never shared through the prefix cache)."""

from __future__ import annotations

import pytest
import torch

from radixrt.attention.forward_batch import ForwardBatch
from radixrt.cache.allocator import PageAllocator
from radixrt.cache.base import create_prefix_cache
from radixrt.cache.req_to_token import ReqToTokenTable
from radixrt.layers import rotary
from radixrt.layers.config import RopeConfig
from radixrt.layers.linear import MergedLinear
from radixrt.layers.sharding import Narrow
from radixrt.models.registry import get_model_class
from radixrt.models.weight_loader import load_hf_weights
from radixrt.protocol.sampling_params import SamplingParams
from radixrt.scheduler.kv_manager import KVManager
from radixrt.scheduler.planner import Planner
from radixrt.scheduler.policy import SchedulePolicy
from radixrt.scheduler.req import Req
from radixrt.scheduler.stats import SchedulerStats

PHI3, SMOLLM3 = "Phi3ForCausalLM", "SmolLM3ForCausalLM"


def _config(make_tiny_config, arch: str, **overrides):
    return get_model_class(PHI3 if arch == "phi3" else SMOLLM3).config_from_hf(
        make_tiny_config(arch, **overrides)
    )


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_partial_rotary_with_an_odd_dim_matches_transformers(make_tiny_config, monkeypatch, native):
    """head_dim 20 * 0.75 = 15: transformers takes 8 frequencies over 15 and rotates 16 dims;
    the other 4 pass as they are. In place on a strided view (the fused op) or a new tensor."""
    from transformers.models.phi3 import modeling_phi3 as hf

    if not native:
        monkeypatch.setattr(rotary, "native_cpu", lambda x: None)
    config = make_tiny_config("phi3", hidden_size=80, partial_rotary_factor=0.75, rope_scaling=None)
    positions = torch.arange(11)
    x = torch.randn(1, 11, 6, 20)
    cos_hf, sin_hf = hf.Phi3RotaryEmbedding(config)(x, positions[None])
    want, _ = hf.apply_rotary_pos_emb(x.transpose(1, 2), x.transpose(1, 2), cos_hf, sin_hf)
    rope = RopeConfig.from_hf(config)
    assert rope.rotary_dim(20) == 16
    cos, sin = rotary.RotaryEmbedding(20, rope).cos_sin(positions, torch.float32)
    assert torch.equal(torch.cat((cos, cos), -1)[:, 0], cos_hf[0])
    wide = torch.cat((x[0], torch.zeros(11, 6, 4)), -1)[..., :20]  # a view, head stride 24
    got = rotary.rotate_qk(wide, cos, sin)
    assert torch.equal(got, want.transpose(1, 2)[0])


def _batch(positions: list[int], seq_lens: list[int], extend: list[int], rope_lens) -> ForwardBatch:
    t = torch.tensor
    return ForwardBatch(
        input_ids=t(positions), positions=t(positions), out_cache_loc=t(positions),
        qo_indptr=t([0, extend[0], sum(extend)]), kv_indices=t(positions),
        kv_indptr=t([0, seq_lens[0], sum(seq_lens)]), seq_lens=t(seq_lens), extend_lens=t(extend),
        seq_lens_cpu=seq_lens, extend_lens_cpu=extend, prefix_lens_cpu=[0, 0], kv_pool=None,
        attn_backend=None, rope_lens=None if rope_lens is None else t(rope_lens),
    )  # type: ignore[arg-type]  # fmt: skip


def test_longrope_cos_sin_per_sequence_length(make_tiny_config):
    """Two sequences in one step, each taking transformers' frequencies for its whole length:
    a 10-token chunk of a 70-token prompt (over the original 64: long) beside a 10-token
    prompt (short), both scaled by the attention factor."""
    from transformers.models.phi3 import modeling_phi3 as hf

    config = make_tiny_config("phi3")
    ours = rotary.RotaryEmbedding(24, RopeConfig.from_hf(config))
    batch = _batch(list(range(10)) * 2, [10, 10], [10, 10], [70, 10])
    cos, sin = ours.for_batch(batch.positions, torch.float32, batch)
    theirs = hf.Phi3RotaryEmbedding(config)
    x = torch.zeros(1)
    for rows, length in ((slice(0, 10), 70), (slice(10, 20), 10)):
        cos_hf, sin_hf = theirs(x, torch.arange(length)[None])
        assert torch.equal(cos[rows, 0], cos_hf[0, :10, :9]), length
        assert torch.equal(sin[rows, 0], sin_hf[0, :10, :9]), length
    # Without rope_lens the step's own lengths (10, 10) decide: short for both.
    short, _ = ours.for_batch(
        batch.positions, torch.float32, _batch(batch.positions.tolist(), [10, 10], [10, 10], None)
    )
    assert torch.equal(short[:10], short[10:]) and not torch.equal(short[:10], cos[:10])


@pytest.mark.parametrize(
    "arch, overrides, field",
    [
        ("phi3", {"partial_rotary_factor": 0.0}, "partial_rotary_factor"),
        ("phi3", {"partial_rotary_factor": 1.5}, "partial_rotary_factor"),
        ("phi3", {"partial_rotary_factor": 0.01}, "partial_rotary_factor"),
        ("phi3", {"rope_type": "dynamic"}, "rope_type"),
        ("phi3", {"short_factor": [1.0] * 8}, "short_factor"),
        ("phi3", {"long_factor": None}, "long_factor"),
        ("smollm3", {"no_rope_layers": [1, 2, 1, 0]}, "no_rope_layers"),
        ("smollm3", {"no_rope_layers": [1, 0]}, "no_rope_layers"),
        ("smollm3", {"sliding_window": None}, "sliding_window"),
    ],
)
def test_refusals_name_the_field(make_tiny_config, arch, overrides, field):
    config = make_tiny_config(arch)
    for key, value in overrides.items():  # set after construction: transformers checks some
        if key in config.rope_parameters or key in ("rope_type", "long_factor"):
            config.rope_parameters[key] = value
        else:
            setattr(config, key, value)
    with pytest.raises(ValueError, match=field):
        get_model_class(PHI3 if arch == "phi3" else SMOLLM3).config_from_hf(config)


def test_windows_and_nope_layers_from_the_config(make_tiny_config):
    assert _config(make_tiny_config, "smollm3").nope_layers == (1, 3)
    assert _config(make_tiny_config, "smollm3").layer_windows == (0, 9, 0, 9)
    # The defaults: every fourth layer NoPE and, with use_sliding_window, windowed.
    default = _config(make_tiny_config, "smollm3", no_rope_layers=None, layer_types=None)
    assert default.nope_layers == (3,) and default.layer_windows == (0, 0, 0, 9)
    assert _config(make_tiny_config, "phi3").layer_windows == (40, 40)
    # Phi-4-mini's 262,144 is longer than any sequence (max_position_embeddings): dropped.
    assert _config(make_tiny_config, "phi3", sliding_window=262144).layer_windows == ()
    plain = _config(make_tiny_config, "phi3", sliding_window=None, rope_scaling=None)
    assert plain.layer_windows == () and plain.rope.switch_length is None


def test_stacked_tensor_gives_each_rank_its_rows():
    """Rank 1 of 2 of a q/k/v projection (q 16 rows, k and v 8 each, whole): its rows of each
    out of the stacked [32, in] tensor equal those it takes from the separate tensors."""
    narrows = {"q_proj": Narrow(0, 8, 8, 16), "k_proj": Narrow(0, 4, 4, 8),
               "v_proj": Narrow(0, 4, 4, 8)}  # fmt: skip
    names = ["q_proj", "k_proj", "v_proj"]
    parts = {n: torch.randn(narrows[n].full, 5) for n in names}
    stacked, separate = (
        torch.nn.ModuleDict({"qkv": MergedLinear(5, [8, 4, 4], names, False, narrows)})
        for _ in range(2)
    )
    assert [n.start for _, n in stacked.qkv.fused_narrows()] == [8, 20, 28]
    fused = torch.cat([parts[n] for n in names])
    load_hf_weights(stacked, [("qkv.weight", fused)], lambda n: False)
    load_hf_weights(separate, [(f"{n}.weight", parts[n]) for n in names], lambda n: False)
    assert torch.equal(stacked.qkv.weight, separate.qkv.weight)
    with pytest.raises(ValueError, match=r"missing weights .*k_proj\.weight"):
        load_hf_weights(separate, [("q_proj.weight", parts["q_proj"])], lambda n: False)


SWITCH = 7


def _engine_parts() -> tuple[KVManager, Planner]:
    alloc = PageAllocator(64, 1)
    kv = KVManager(alloc, create_prefix_cache("radix", alloc), ReqToTokenTable(4, 32, "cpu"),
                   rope_switch=SWITCH)  # fmt: skip
    planner = Planner(kv, SchedulePolicy("fcfs", kv), 64, 0, 4, 0.0, SchedulerStats())
    return kv, planner


def _step(planner: Planner, running: list[Req], waiting: list[Req]):
    batch = planner.plan(running, waiting)
    batch.commit()
    for req in batch.logits.sample_reqs:
        req.output_ids.append(9)
    return batch


def test_a_request_past_the_switch_is_computed_again_and_not_cached():
    """A 6-token prompt decodes with the short frequencies until its length would pass 7; then
    its K/V (published: short K/V stays shareable) is dropped and all 8 positions computed with
    the long ones, which the cache neither gives nor takes."""
    kv, planner = _engine_parts()
    req = Req("a", [1, 2, 3, 4, 5, 6], SamplingParams(max_new_tokens=8))
    running, waiting = [], [req]
    assert _step(planner, running, waiting).rope_lens == (6,)
    assert _step(planner, running, waiting).extend_lens == (1,)  # length 7: still short
    batch = _step(planner, running, waiting)  # length 8: computed again, long
    assert (batch.prefix_lens, batch.extend_lens, batch.rope_lens) == ((0,), (8,), (8,))
    assert req.long_rope_kv and planner.stats.num_preemptions == 0
    assert kv.cache.match_prefix([1, 2, 3, 4, 5, 6, 9]).indices.numel() == 7
    kv.release(req)
    assert kv.cache.match_prefix([1, 2, 3, 4, 5, 6, 9, 9]).indices.numel() == 7
    twin = Req("b", [1, 2, 3, 4, 5, 6, 9, 9], SamplingParams(max_new_tokens=1))
    assert kv.match(twin).indices.numel() == 0  # long: the cache's short K/V is not its
