"""The step-time model against counts made another way: FLOPs against 6N + attention from an independent
parameter count, collective costs against hand-derived volumes, the pipeline simulation against the closed-form
bubble, and the command's contract (exit 2 naming the field; no MindSpore)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.config import ConfigError, load_config
from core.memory.estimate import terms
from core.model.flops import param_groups, param_shapes
from core.parallel.pipeline.schedules import build, compile_schedule, simulate
from core.perf import estimate_step, links, planned_config
from core.perf.device import Device, Link, device
from core.perf.work import block_work, head_work
from tests.unit.core.perf.conftest import CLUSTER

ROOT = Path(__file__).resolve().parents[4]
PRESETS = sorted(p.stem for p in (ROOT / "configs" / "model").glob("*.yaml"))


def _params(m) -> tuple[int, int]:
    """(weights a token multiplies, routed-expert weights it does not) by the textbook formula: attention
    d (H hd) + 2 d (K hd) + (H hd) d (MLA, DeepSeek-V2's eqs. 9-14: d Q + Q H (N + R) + d (L + R) + L H (N + V) +
    H V d), SwiGLU 3 d F, MoE router d E and k of E experts, the head V d."""
    hd = m.head_dim or m.d_model // m.n_heads
    attn = 2 * m.d_model * m.n_heads * hd + 2 * m.d_model * m.n_kv_heads * hd
    if m.attention == "mla":
        H, N, R, V, L, Q = (
            m.n_heads,
            m.qk_nope_head_dim,
            m.qk_rope_head_dim,
            m.v_head_dim,
            m.kv_lora_rank,
            m.q_lora_rank,
        )
        attn = m.d_model * Q + Q * H * (N + R) + m.d_model * (L + R) + L * H * (N + V) + H * V * m.d_model
    total = m.vocab_size * m.d_model
    for i in range(m.n_layers):
        if m.n_experts and i >= m.moe_dense_layers:
            width = m.moe_ffn_hidden or m.ffn_hidden
            total += attn + m.d_model * m.n_experts + 3 * m.d_model * width * (m.moe_top_k + m.moe_shared_experts)
        else:
            total += attn + 3 * m.d_model * m.ffn_hidden
    return total, 0


@pytest.mark.parametrize("preset", PRESETS)
def test_flops_are_6n_plus_attention(preset):
    overrides = [f"model={preset}", "model.moe_capacity_factor=null", "training.seq_len=128"]  # dropless: k experts
    cfg = load_config([*overrides, "training.global_batch_size=2"])
    m, T, S = cfg.model, cfg.training.micro_batch_size * 128, 128
    works = [block_work(cfg, i) for i in range(m.n_layers)]
    weights = sum(f for w in works for f, _ in [*w.matmuls, w.router]) + head_work(cfg)[0]
    attention = sum(w.attention[0] for w in works)
    n, _ = _params(m)
    assert 3 * weights / T == pytest.approx(6 * n, rel=1e-12)
    # causal: half of the PaLM term 12 L S D, which counts the whole S x S matrix (q k^T and p v H hd wide; MLA:
    # q k^T H (N + R) wide, p v H V wide)
    heads = m.n_heads * (m.head_dim or m.d_model // m.n_heads)  # H hd: d_model unless head_dim says
    width = m.n_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) / 2 if m.mla else heads
    assert 3 * attention / T == pytest.approx(12 * m.n_layers * S * width / 2, rel=1e-12)


def test_collectives_cost_their_ring_volumes():
    link = Link(bandwidth=1e9, latency=1e-6)
    assert links.all_reduce(8e9, 4, link) == pytest.approx(2 * 3 / 4 * 8 + 2 * 3 * 1e-6)
    assert links.all_gather(8e9, 4, link) == pytest.approx(3 / 4 * 8 + 3e-6)
    assert links.all_to_all(8e9, 8, link) == pytest.approx(7 / 8 * 8 + 7e-6)
    assert links.p2p(1e9, link) == pytest.approx(1 + 1e-6)
    assert links.all_reduce(8e9, 1, link) == 0.0


def test_collectives_composed_from_all_reduce_cost_what_they_send():
    """The core on CPU (core.parallel.comm.collectives): an all-gather all-reduces the whole tensor with the
    local block among zeros, a reduce-scatter the whole tensor, an all-to-all gathers every rank's whole tensor."""
    link = Link(bandwidth=1e9, latency=1e-6, composed=True)
    assert links.all_gather(8e9, 4, link) == pytest.approx(2 * 3 / 4 * 8 + 2 * 3 * 1e-6)
    assert links.reduce_scatter(8e9, 4, link) == pytest.approx(2 * 3 / 4 * 8 + 2 * 3 * 1e-6)
    assert links.all_to_all(1e9, 8, link) == pytest.approx(2 * 7 / 8 * 8 + 2 * 7 * 1e-6)
    assert links.all_gather(8e9, 1, link) == links.all_to_all(8e9, 1, link) == 0.0


def test_a_full_mesh_group_reaches_the_links_to_its_peers_where_a_switch_gives_any_group_all():
    """An 8-device node of 28 GB/s links, each device wired to its 7 peers (196 GB/s in all, Ascend's HCCS), against
    a switched node of the same 196 GB/s per device: by hand, a group of k reaches 28 (k - 1) GB/s on the mesh, all
    196 through the switch; the mesh's collectives send to all peers at once, one latency per phase."""
    mesh, switch = Link(196e9, 1e-6, mesh=7), Link(196e9, 1e-6)
    B = 1e9
    for k in (2, 4, 8):
        assert mesh.among(k) == pytest.approx(28e9 * (k - 1))
        assert switch.among(k) == 196e9
        assert links.all_reduce(B, k, mesh) == pytest.approx(2 * (k - 1) / k * B / (28e9 * (k - 1)) + 2e-6)
        assert links.all_gather(B, k, mesh) == pytest.approx((k - 1) / k * B / (28e9 * (k - 1)) + 1e-6)
        assert links.all_reduce(B, k, switch) == pytest.approx(2 * (k - 1) / k * B / 196e9 + 2 * (k - 1) * 1e-6)
    # the pipeline's pair: one link on the mesh
    assert links.p2p(B, mesh) == pytest.approx(B / 28e9 + 1e-6) and links.p2p(B, switch) == pytest.approx(
        B / 196e9 + 1e-6
    )
    # the same bytes: tp=4's all-reduce twice tp=8's on the mesh (a quarter of them against an eighth over one link
    # each), 6/7 of it through the switch; with dp_replicate=2 beside it, tp=4 runs half the micro-batches, so a
    # step's tensor-parallel traffic is about tp=8's on the mesh and 0.43x of it through the switch
    assert links.all_reduce(B, 4, mesh) / links.all_reduce(B, 8, mesh) == pytest.approx(2.0, rel=1e-3)
    assert links.all_reduce(B, 4, switch) / links.all_reduce(B, 8, switch) == pytest.approx(6 / 7, rel=1e-3)


def test_an_all_to_all_with_one_rank_per_mesh_node_crosses_the_network_alone():
    """Two ranks 8 apart on nodes of 8 (an expert group spread one rank a node): nothing stays on the node, so the
    mesh carries nothing and the network carries half of what a rank holds, by hand."""
    dev = Device(1, 1, 1, 1, None, 0.0, intra=Link(196e9, 1e-6, mesh=7), inter=Link(25e9, 5e-6), devices_per_node=8)
    assert links.strided_all_to_all(1e9, 2, 8, dev) == pytest.approx(0.5e9 / 25e9 + 5e-6)


def test_the_910b_profile_prices_a_tp4_group_on_three_of_its_seven_hccs_links():
    """cluster=ascend-910b is a full mesh (its yaml cites Huawei's guide): its tp=4 group's link is 3/7 of the
    device's 196 GB/s (times the collective efficiency), and the same node declared switched gives the group all."""
    base = ["model=llama3-8b", "cluster=ascend-910b", "cluster.devices_per_node=8", "parallel.tp=4"]
    base += ["parallel.dp_replicate=2", "training.precision=bf16"]
    for topology, share in (("full_mesh", 3 / 7), ("switched", 1.0)):
        cfg = planned_config([*base, f"cluster.intra_node_topology={topology}"])
        dev = device(cfg.cluster, "bf16")
        link = links.group_link(cfg.parallel, ("tp",), dev)
        assert link.among(4) == pytest.approx(196e9 * cfg.cluster.collective_efficiency_intra * share)


def test_an_unknown_topology_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"cluster.intra_node_topology.*switched or full_mesh"):
        load_config(["cluster.intra_node_topology=torus"])


def test_groups_cross_nodes_by_their_span():
    dev = Device(1, 1, 1, 1, None, 0.0, intra=Link(100, 0), inter=Link(10, 0), devices_per_node=8)
    par = load_config(["model=small", "parallel.dp_shard=4", "parallel.tp=4", "training.global_batch_size=8"]).parallel
    assert links.group_link(par, ("tp",), dev).bandwidth == 100  # ranks 0-3
    assert links.group_link(par, ("dp_shard",), dev).bandwidth == 10  # stride 4, 4 of them: 16 ranks, 2 nodes


def test_an_all_to_all_across_nodes_sends_each_share_over_its_own_tier():
    """16 expert ranks on 2 nodes of 8: 7 of a rank's 16 shares go over the node's links, 8 over the network, at
    once; with tp=2 inside them, 4 of 8 expert ranks share a node (3 shares in, 4 out)."""
    dev = Device(1, 1, 1, 1, None, 0.0, intra=Link(100, 1), inter=Link(10, 5), devices_per_node=8)
    par = load_config(
        [
            "model=moe-small",
            "model.n_experts=16",
            "parallel.dp_shard=16",
            "parallel.ep=16",
            "training.global_batch_size=16",
        ]
    )
    B = 1600.0
    expected = max(7 / 16 * B / 100 + 7 * 1, 8 / 16 * B / 10 + 8 * 5)
    assert links.group_all_to_all(B, par.parallel, "dp_shard", dev) == pytest.approx(expected)
    par = load_config(
        ["model=moe-small", "parallel.dp_shard=8", "parallel.ep=8", "parallel.tp=2", "training.global_batch_size=8"]
    )
    expected = max(3 / 8 * B / 100 + 3 * 1, 4 / 8 * B / 10 + 4 * 5)
    assert links.group_all_to_all(B, par.parallel, "dp_shard", dev) == pytest.approx(expected)
    one_node = load_config(["model=moe-small", "parallel.dp_shard=8", "parallel.ep=8", "training.global_batch_size=8"])
    assert links.group_all_to_all(B, one_node.parallel, "dp_shard", dev) == links.all_to_all(B, 8, dev.intra)
    assert links.expert_all_to_all(B, par.parallel, dev) == pytest.approx(expected)  # the layout the core trains
    # Megatron's folding (ETP 1): 16 expert ranks over tp x dp_shard, 1 apart: 8 on each node (7 shares in, 8 out);
    # 8 of them: one node
    folded = ["model=moe-small", "model.n_experts=16", "parallel.dp_shard=8", "parallel.tp=2", "parallel.sp=true"]
    folded += ["parallel.etp=1", "training.global_batch_size=8"]
    par = load_config([*folded, "parallel.ep=16"]).parallel
    expected = max(7 / 16 * B / 100 + 7 * 1, 8 / 16 * B / 10 + 8 * 5)
    assert links.expert_all_to_all(B, par, dev) == pytest.approx(expected)
    par = load_config([*folded, "parallel.ep=8"]).parallel
    assert links.expert_all_to_all(B, par, dev) == links.all_to_all(B, 8, dev.intra)


def _cfg(*overrides):
    return planned_config([*CLUSTER, "model=llama3-8b", "training.precision=bf16", *overrides])


def test_a_stages_recompute_is_read_as_the_runtime_reads_it():
    """Without a pipeline, memory.recompute_stages of one entry is the whole model's setting (the runtime's
    RecomputePlan), whatever memory.recompute says."""
    base = ["cluster.devices_per_node=1", "training.seq_len=1024", "training.global_batch_size=1"]
    staged = estimate_step(_cfg(*base, "memory.recompute=none", "memory.recompute_stages=[full]"))
    full = estimate_step(_cfg(*base, "memory.recompute=full"))
    assert staged.breakdown["recompute"] == full.breakdown["recompute"] > 0


def test_tensor_parallel_traffic_is_four_all_reduces_per_block():
    base = ["cluster.devices_per_node=2", "training.seq_len=1024", "training.global_batch_size=1"]
    est = estimate_step(_cfg(*base, "parallel.tp=2"))
    m = load_config(["model=llama3-8b"]).model
    tokens, bw = 1024, 100e9
    expected = m.n_layers * 4 * (2 * 1 / 2 * tokens * m.d_model * 2 / bw)
    assert est.breakdown["comm_tp"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("recompute", "per_block"), [("none", 3), ("full", 4)])
def test_launches_are_counted_per_block_and_micro_batch(recompute, per_block):
    """A block launches its kernels once forward, twice backward (once more with full recompute); the embedding
    and the head count one block each, never recomputed; PyNative adds its dispatch to each launch."""
    base = ["cluster.devices_per_node=1", "training.seq_len=1024", "training.global_batch_size=4"]
    base.append("training.micro_batch_size=1")
    est = estimate_step(_cfg(*base, "cluster.launch_overhead_us=100", f"memory.recompute={recompute}"))
    layers, micro_batches = 32, 4  # llama3-8b
    expected = micro_batches * (layers * per_block + 2 * 3) * 100e-6
    assert est.breakdown["launch"] == pytest.approx(expected, rel=1e-9)
    without = estimate_step(_cfg(*base, f"memory.recompute={recompute}"))
    assert est.step_time_sec - without.step_time_sec == pytest.approx(expected, rel=1e-9)
    # PyNative's dispatch is counted as launches are: 250 us more per block forward, the same count
    eager = estimate_step(
        _cfg(
            *base,
            "cluster.launch_overhead_us=100",
            "cluster.pynative_overhead_us=250",
            "training.mode=pynative",
            f"memory.recompute={recompute}",
        )
    )
    assert eager.breakdown["launch"] == pytest.approx(expected, rel=1e-9)  # the launches alone, and beside them
    assert eager.breakdown["dispatch"] == pytest.approx(expected * 250 / 100, rel=1e-9)  # Python's dispatch


def test_fsdp_hides_what_compute_covers_and_exposes_the_rest():
    base = ["cluster.nodes=2", "parallel.dp_shard=16", "training.seq_len=8192", "training.global_batch_size=16"]
    hidden = estimate_step(_cfg(*base))
    exposed = estimate_step(_cfg(*base, "cluster.overlap_fsdp=false"))
    assert 0 <= hidden.breakdown.get("comm_fsdp", 0.0) < exposed.breakdown["comm_fsdp"]
    assert exposed.step_time_sec > hidden.step_time_sec


@pytest.mark.parametrize(("schedule", "virtual"), [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (4, 16)])
def test_uniform_stages_give_the_closed_form_bubble(schedule, virtual, pp, m):
    timing = simulate(build(schedule, pp, m, virtual), m, virtual, durations=lambda op, s: 1.0 if op == "F" else 2.0)
    assert timing.bubble == pytest.approx((pp - 1) / (virtual * m + pp - 1))


def test_uneven_stages_cost_more_than_balanced_ones():
    def makespan(times):
        return simulate(build("1f1b", 2, 8), 8, durations=lambda op, s: times[s] * (1 if op == "F" else 2)).makespan

    assert makespan([1.5, 0.5]) > makespan([1.0, 1.0])
    slow = simulate(build("1f1b", 2, 8), 8, durations=lambda op, s: 1.0, transfer=0.5).makespan
    assert slow > simulate(build("1f1b", 2, 8), 8, durations=lambda op, s: 1.0).makespan


def test_interleaving_shrinks_the_pipeline_idle_time():
    def idle(*overrides):
        cfg = _cfg(
            "cluster.devices_per_node=4",
            "parallel.pp=4",
            "training.seq_len=2048",
            "training.global_batch_size=8",
            "training.micro_batch_size=1",
            "cluster.stage_recompute=false",  # stages alike but for the embedding and the head
            *overrides,
        )
        return estimate_step(cfg).breakdown["comm_pp"]

    one = idle("parallel.pp_schedule=1f1b")
    assert 0 < idle("parallel.pp_schedule=interleaved", "parallel.pp_virtual=2") < one
    assert idle("parallel.pp_schedule=gpipe") == pytest.approx(one, rel=0.05)  # same bubble, other order


def test_bf16_halves_activations_and_keeps_fp32_states():
    fp32 = estimate_step(_cfg("cluster.nodes=1", "parallel.dp_shard=8", "training.precision=fp32"))
    bf16 = estimate_step(_cfg("cluster.nodes=1", "parallel.dp_shard=8"))
    assert bf16.step_time_sec < fp32.step_time_sec  # bf16 peak is twice fp32's here
    assert bf16.mfu == pytest.approx(fp32.mfu * fp32.step_time_sec / bf16.step_time_sec / 2)


def _perf(*args, hide_mindspore=False):
    code = "import runpy, sys\n"
    if hide_mindspore:
        code += "sys.modules['mindspore'] = None\n"
    code += "sys.argv = ['core.perf', *sys.argv[1:]]\nrunpy.run_module('core.perf', run_name='__main__')\n"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_the_command_answers_without_mindspore():
    done = _perf(
        *CLUSTER,
        "model=llama3-70b",
        "cluster.nodes=4",
        "parallel.dp_shard=4",
        "parallel.tp=8",
        "training.seq_len=4096",
        "training.global_batch_size=16",
        "training.precision=bf16",
        "--json",
        hide_mindspore=True,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert 0 < out["mfu"] < 1 and out["step_time_sec"] > 0 and out["peak_memory_bytes_per_rank"] > 0
    assert set(out["breakdown"]) >= {"compute", "comm_tp", "optimizer"}


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["model=llama3-8b", "cluster.nodes=2", "parallel.tp=16"], "parallel.tp"),  # 8 KV heads
        (["model=llama3-8b", "cluster.nodes=2", "parallel.tp=8"], "cluster.nodes"),  # 8 ranks, 16 devices
        (["model=llama3-8b", "cluster.nodes=1", "cluster.matmul_efficiency=2"], "cluster.matmul_efficiency"),
        (["model=llama3-8b", "cluster.nodes=1", "cluster.attention_tflops_bwd=0"], "cluster.attention_tflops_bwd"),
    ],
)
def test_invalid_configs_exit_2_naming_the_field(args, field):
    done = _perf(*CLUSTER, *args)
    assert done.returncode == 2
    assert field in done.stderr


@pytest.mark.parametrize(
    ("schedule", "pp", "m", "virtual"), [("gpipe", 3, 5, 1), ("1f1b", 4, 7, 1), ("interleaved", 2, 6, 3)]
)
def test_a_compiled_schedule_times_as_the_checked_simulation(schedule, pp, m, virtual):
    rng = np.random.default_rng(0)
    cost = {(op, s): float(rng.uniform(0.5, 2.0)) for op in "FB" for s in range(pp * virtual)}
    for transfer in (0.0, 0.3):
        want = simulate(
            build(schedule, pp, m, virtual), m, virtual, durations=lambda op, s: cost[(op, s)], transfer=transfer
        )
        got = compile_schedule(schedule, pp, m, virtual).time(lambda op, s: cost[(op, s)], transfer)
        assert got.makespan == pytest.approx(want.makespan, rel=1e-12)
        assert got.busy == pytest.approx(want.busy, rel=1e-12)
        assert got.in_flight == want.in_flight


@pytest.mark.parametrize("preset", ["llama3-8b", "mixtral-8x7b"])
def test_param_groups_partition_the_parameters_by_owner(preset):
    model = load_config([f"model={preset}"]).model
    groups = param_groups(model)
    assert {n: s for g in groups.values() for n, s in g.items()} == param_shapes(model)
    for owner, names in groups.items():
        assert all(n.startswith(owner) for n in names)
    assert len([g for g in groups if g.startswith("layers.")]) == model.n_layers


def test_the_core_s_pipeline_recomputes_stages_where_the_others_keep_micro_batches():
    """cluster.stage_recompute: the core's runtime reruns each stage's forward but the last, and keeps stage
    inputs; torchtitan/Megatron keep each in-flight micro-batch's activations (core.memory.estimate.terms)."""
    base = [
        "cluster.devices_per_node=4",
        "parallel.pp=4",
        "training.seq_len=2048",
        "training.global_batch_size=16",
        "training.micro_batch_size=1",
    ]
    core_cfg, stacks_cfg = _cfg(*base), _cfg(*base, "cluster.stage_recompute=false")
    core_step, stacks_step = estimate_step(core_cfg), estimate_step(stacks_cfg)
    assert stacks_step.breakdown["recompute"] == 0 < core_step.breakdown["recompute"]
    assert core_step.step_time_sec > stacks_step.step_time_sec
    kept, stashed = terms(stacks_cfg, 0), terms(core_cfg, 0)
    in_flight = compile_schedule("1f1b", 4, 16).in_flight[0]
    assert in_flight == 4 and kept.stash == 0 < stashed.stash
    assert kept.activations == in_flight * stashed.activations


MPIPE = ["cluster.devices_per_node=2", "parallel.pp=2", "training.global_batch_size=8", "training.micro_batch_size=1"]


def test_mpipe_moves_stage_0s_work_and_adds_none_where_stages_recompute():
    """Under the core's stage recompute 1F1B's stage 0 runs its forward twice (F, then again in B) and its
    backward once; MPipe runs the preprocess forward once (P), then again with its backward (R), and the body as
    1F1B does: the same work. Without stage recompute the preprocess forward is paid twice, once more a micro-batch."""
    from core.perf.device import device
    from core.perf.step import _preprocess_passes, _stage_passes

    for recompute, extra in (("true", 0.0), ("false", 1.0)):
        plain = _cfg(*MPIPE, f"cluster.stage_recompute={recompute}")
        mpipe = _cfg(
            *MPIPE,
            f"cluster.stage_recompute={recompute}",
            "parallel.pp_schedule=mpipe",
            "parallel.pp_transpose_layers=1",
        )
        dev = device(plain.cluster, plain.training.precision)
        work = sum(f.total + b.total for f, b in _stage_passes(plain, dev))
        pre, redo = _preprocess_passes(mpipe, dev)
        moved = sum(f.total + b.total for f, b in _stage_passes(mpipe, dev)) + pre.total + redo.total
        assert moved == pytest.approx(work + extra * pre.total, rel=1e-12)


def test_mpipe_without_a_block_is_1f1b_and_the_schedule_times_its_messages():
    plain = estimate_step(_cfg(*MPIPE))
    loading = estimate_step(_cfg(*MPIPE, "parallel.pp_schedule=mpipe"))  # T = 0: tokens shipped, nothing else
    assert loading.step_time_sec == pytest.approx(plain.step_time_sec, rel=1e-9)
    schedule = compile_schedule("mpipe", 2, 8, overflow="full", trained=True)
    cost = {("F", 0): 1.0, ("F", 1): 1.0, ("B", 0): 2.0, ("B", 1): 2.0, ("P", 0): 0.5, ("R", 0): 1.0}
    for transfer in ({"F": 0.1, "B": 0.1, "P": 0.2, "W": 3.0}, 0.25):
        want = simulate(build("mpipe", 2, 8), 8, durations=lambda op, s: cost[(op, s)], transfer=transfer)
        got = schedule.time(lambda op, s: cost[(op, s)], transfer)
        assert got.makespan == pytest.approx(want.makespan, rel=1e-12) and got.busy == want.busy
    # slow weights delay rank 1's first preprocess, so rank 0 waits for micro-batch 1
    slow = schedule.time(lambda op, s: cost[(op, s)], {"F": 0.1, "B": 0.1, "P": 0.2, "W": 3.0})
    fast = schedule.time(lambda op, s: cost[(op, s)], {"F": 0.1, "B": 0.1, "P": 0.2, "W": 0.0})
    assert slow.makespan > fast.makespan


def test_bf16_on_a_cpu_cluster_is_refused_naming_the_field():
    """The trainer emulates bf16 on CPU at several times fp32's step, which the model does not price."""
    with pytest.raises(ConfigError) as info:
        planned_config(["cluster=cpu-local", "model=tiny", "training.precision=bf16"])
    assert info.value.field == "training.precision"
    assert planned_config(["cluster=cpu-local", "model=tiny"]).compute_precision == "fp32"
    bf16 = planned_config([*CLUSTER, "cluster.devices_per_node=1", "model=llama3-8b", "training.precision=bf16"])
    assert bf16.compute_precision == "bf16"


def test_fp8_runs_the_blocks_weight_matmuls_at_the_fp8_peak_and_pays_for_the_casts():
    """fp8 against bf16 on one device, by hand: each block's weight matmuls (3 x 2 T P forward and backward, P the
    block's matrix elements) take half the time at an FP8 peak of twice bf16's, every matmul here bounded by its T =
    1024 tokens (rate 1024 / (1024 + 128) of peak); the casts, as torchao's roofline counts them, read 2 bytes and
    write 1 twice (row- and column-major) of each input and weight forward, with the weight's max-abs another read
    of 2, and of each output gradient backward. The head and attention stay bf16."""
    base = ["cluster.devices_per_node=1", "training.seq_len=1024", "training.global_batch_size=1"]
    base.append("cluster.matmul_half_dim=128")
    bf16 = estimate_step(_cfg(*base))
    fp8 = estimate_step(_cfg(*base, "cluster.peak_tflops_fp8=400", "training.precision=fp8"))
    m, T = load_config(["model=llama3-8b"]).model, 1024
    D, A, kv, F = m.d_model, m.n_heads * m.head_size, m.n_kv_heads * m.head_size, m.ffn_hidden
    P = 2 * D * A + 2 * D * kv + 3 * D * F
    ins = 3 * D + A + 2 * D + F  # q, k, v, o; gate, up, down
    outs = A + 2 * kv + D + 2 * F + D
    matmuls = 3 * 2 * T * P / (200e12 * 1024 / 1152)
    casts = (4 * T * ins + (2 + 4) * P + 4 * T * outs) / 2000e9
    expected = m.n_layers * (casts - matmuls / 2)
    assert fp8.breakdown["compute"] - bf16.breakdown["compute"] == pytest.approx(expected, rel=1e-9)
    assert fp8.mfu == pytest.approx(bf16.mfu * bf16.step_time_sec / fp8.step_time_sec)  # against bf16's peak
    assert fp8.peak_memory_bytes_per_rank == bf16.peak_memory_bytes_per_rank  # every value it holds is bf16's


def test_fp8_needs_fp8_matmuls_and_is_estimated_not_trained():
    from core.config.rules import check_runnable

    for overrides in (
        ["cluster=cpu-local", "model=tiny"],  # no FP8 peak: refused by the estimate and the trainer alike
        [*CLUSTER, "cluster.devices_per_node=1", "model=tiny"],
    ):
        with pytest.raises(ConfigError, match="cluster.peak_tflops_fp8") as info:
            load_config([*overrides, "training.precision=fp8"])
        assert info.value.field == "training.precision"
    cfg = planned_config(
        [*CLUSTER, "cluster.devices_per_node=1", "cluster.peak_tflops_fp8=400", "model=tiny", "training.precision=fp8"]
    )
    assert cfg.compute_precision == "bf16"
    with pytest.raises(ConfigError, match="not trained") as info:
        check_runnable(cfg)
    assert info.value.field == "training.precision"


def _moe(*overrides):
    return planned_config([*CLUSTER, "model=qwen3-30b-a3b", "training.precision=bf16", *overrides])


# Qwen3-30B-A3B on one node of 8: tp 2 with SP, dp_shard 4, one sequence of 1024 tokens per rank
FOLD = ["training.seq_len=1024", "training.global_batch_size=4", "parallel.tp=2", "parallel.sp=true"]
FOLD.append("parallel.dp_shard=4")


def test_folded_experts_route_each_tp_ranks_own_tokens_to_whole_experts():
    """Megatron's MoE parallel folding (ETP 1: ep 8 over the tp x dp_shard ranks) against the layout the core trains
    (ep 4 = dp_shard, experts split by tp 2), by hand. Per rank the same expert FLOPs (T/2 tokens x k through whole
    experts, not T x k through half-width ones) and the same expert weights (16 whole experts, not 32 halves); the
    dispatch and combine carry the rank's own T/2 tokens' k copies over 8 ranks, not all T tokens' over 4; an MoE
    block without a shared expert keeps attention's tp pair only. Qwen3-30B-A3B: every block MoE, no shared expert."""
    m = load_config(["model=qwen3-30b-a3b"]).model
    T, D, F, k, L = 1024, m.d_model, m.moe_ffn_hidden, m.moe_top_k, m.n_layers
    core, folded = _moe(*FOLD, "parallel.ep=4"), _moe(*FOLD, "parallel.ep=8", "parallel.etp=1")
    assert not core.parallel.experts_folded and folded.parallel.experts_folded and folded.parallel.expert_dp == 1
    routed = {}
    for name, cfg in (("core", core), ("folded", folded)):
        w = block_work(cfg, 0)
        routed[name] = sum(f for f, _ in w.matmuls) - sum(f for f, _ in block_work(_moe(*FOLD), 0).matmuls[:4])
    assert routed["core"] == pytest.approx(routed["folded"]) == pytest.approx(3 * 2 * T * k * D * F / 2)
    a, b = estimate_step(core), estimate_step(folded)
    bw, B = 100e9, T * k * D * 2  # one sequence's routed copies in bf16
    assert a.breakdown["comm_ep"] == pytest.approx(L * 4 * (3 / 4 * B / bw))
    assert b.breakdown["comm_ep"] == pytest.approx(L * 4 * (7 / 8 * (B / 2) / bw))
    assert b.breakdown["comm_tp"] == pytest.approx(a.breakdown["comm_tp"] / 2)
    assert a.breakdown["comm_fsdp"] == pytest.approx(b.breakdown["comm_fsdp"])  # experts are not gathered (EDP 1)
    assert terms(core).optimizer == terms(folded).optimizer


def test_folded_experts_save_the_activations_of_their_own_tokens():
    """The memory model counts the folded layout as core.perf prices it: under ETP 1 a rank saves the routed slots of
    its own T/2 tokens through whole experts (input and output D each, gate/up/silu/product F each) and their router
    scores, where the core's layout saves all T tokens' slots through half-width experts, their router scores and
    the sequence it gathers to route; by hand, bf16, every block MoE, no recompute."""
    m = load_config(["model=qwen3-30b-a3b"]).model
    T, D, F, k, E, L = 1024, m.d_model, m.moe_ffn_hidden, m.moe_top_k, m.n_experts, m.n_layers
    core, folded = _moe(*FOLD, "parallel.ep=4"), _moe(*FOLD, "parallel.ep=8", "parallel.etp=1")
    core_mlp = 2 * (T * k * (2 * D + 4 * F / 2) + T * (4 * E + D))
    folded_mlp = 2 * (T / 2 * k * (2 * D + 4 * F) + T / 2 * 4 * E)
    assert terms(core).activations - terms(folded).activations == pytest.approx(L * (core_mlp - folded_mlp))


def test_folded_experts_are_fsdp_sharded_over_the_ranks_that_hold_the_same_ones():
    """ep 4 with ETP 1 on the 8 ranks of tp 2 x dp_shard 4: two ranks hold each expert (EDP 2), which shard its
    weights, gradients and states (torchtitan's and Megatron-FSDP's layout) and gather them for each micro-batch
    forward and backward, scattering the gradients: FSDP's traffic of 128 / 4 whole experts per block over 2 ranks
    of the node. Their states per rank equal the unsharded 16 of ep 8's and the 32 halves of the core's layout."""
    m = load_config(["model=qwen3-30b-a3b"]).model
    D, F, L = m.d_model, m.moe_ffn_hidden, m.n_layers
    exposed = ["cluster.overlap_fsdp=false"]
    edp2 = _moe(*FOLD, *exposed, "parallel.ep=4", "parallel.etp=1")
    edp1 = _moe(*FOLD, *exposed, "parallel.ep=8", "parallel.etp=1")
    assert edp2.parallel.expert_dp == 2
    experts = 128 / 4 * 3 * D * F
    gather, scatter = 1 / 2 * experts * 2 / 100e9, 1 / 2 * experts * 4 / 100e9  # bf16 weights, fp32 gradients
    extra = estimate_step(edp2).breakdown["comm_fsdp"] - estimate_step(edp1).breakdown["comm_fsdp"]
    assert extra == pytest.approx(L * (2 * gather + scatter))
    assert terms(edp2).optimizer == terms(edp1).optimizer == terms(_moe(*FOLD, "parallel.ep=4")).optimizer


def test_per_stage_recompute_counts_are_priced_stage_by_stage():
    """memory.recompute_stage_layers prices each stage's own count: all of a stage's blocks or none is
    recompute_stages, one count everywhere recompute_layers, and each block more re-runs more."""
    base = ["cluster.devices_per_node=4", "parallel.pp=4", "training.seq_len=1024", "training.global_batch_size=8"]
    est = lambda *o: estimate_step(_cfg(*base, *o))  # noqa: E731
    full = lambda counts: est("memory.recompute=full", f"memory.recompute_stage_layers={counts}")  # noqa: E731
    assert full("[8,0,0,0]") == est("memory.recompute_stages=[full,none,none,none]")
    assert full("[2,2,2,2]") == est("memory.recompute=full", "memory.recompute_layers=2")
    steps = [
        e.step_time_sec
        for e in (est(), full("[1,0,0,0]"), full("[8,0,0,0]"), full("[8,4,2,0]"), est("memory.recompute=full"))
    ]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)


def test_the_attention_core_runs_at_the_stacks_kernel_where_it_is_slower_than_a_matmul():
    """By hand, one device, llama3-8b, 1,024 tokens: each block's causal attention core is 2 T S A FLOPs forward
    (half of q k^T and p v, A = H x head dim) and 2.5 times that backward (flash attention recomputes the scores).
    At a kernel of 50 TFLOP/s forward and 40 backward, under the matmul rate of 200 x 1024 / 1152 that a large
    matmul bounded by T = 1024 reaches, the step pays the difference, and full recompute pays the forward's again;
    a kernel faster than the matmul rate changes nothing."""
    base = ["cluster.devices_per_node=1", "training.seq_len=1024", "training.global_batch_size=1"]
    base += ["cluster.matmul_half_dim=128", "memory.recompute=full"]
    matmul = estimate_step(_cfg(*base))
    kernel = estimate_step(_cfg(*base, "cluster.attention_tflops_fwd=50", "cluster.attention_tflops_bwd=40"))
    fast = estimate_step(_cfg(*base, "cluster.attention_tflops_fwd=1000", "cluster.attention_tflops_bwd=1000"))
    m, T = load_config(["model=llama3-8b"]).model, 1024
    core = 2 * T * T * m.n_heads * m.head_size
    rate = 200e12 * 1024 / 1152
    forward = core / 50e12 - core / rate
    backward = 2.5 * core / 40e12 - 2.5 * core / rate
    assert kernel.breakdown["compute"] - matmul.breakdown["compute"] == pytest.approx(
        m.n_layers * (forward + backward), rel=1e-9
    )
    assert kernel.breakdown["recompute"] - matmul.breakdown["recompute"] == pytest.approx(
        m.n_layers * forward, rel=1e-9
    )
    assert fast.step_time_sec == matmul.step_time_sec


def test_the_experts_all_to_alls_are_hidden_by_the_share_cluster_overlap_ep():
    """Qwen3-30B-A3B over 2 nodes, 16 expert ranks: the exposed all-to-all time is (1 - overlap_ep) of the
    exposed one's, nothing else in the step moves, and a share outside [0, 1] is refused by name."""
    base = ["cluster=h100-sxm", "model=qwen3-30b-a3b", "training.precision=bf16", "training.seq_len=4096"]
    base += ["cluster.nodes=2", "cluster.devices_per_node=8", "parallel.dp_shard=16", "parallel.ep=16"]
    base += ["training.global_batch_size=32"]
    exposed, quarter, hidden = (
        estimate_step(planned_config([*base, f"cluster.overlap_ep={share}"])).breakdown for share in (0, 0.25, 1)
    )
    assert exposed["comm_ep"] > 0
    assert quarter["comm_ep"] == pytest.approx(0.75 * exposed["comm_ep"], rel=1e-12)
    assert "comm_ep" not in hidden or hidden["comm_ep"] == 0
    for key in ("compute", "recompute", "comm_fsdp", "optimizer"):
        assert quarter.get(key) == exposed.get(key) == hidden.get(key), key
    with pytest.raises(ConfigError, match="cluster.overlap_ep"):
        load_config(["cluster.overlap_ep=1.5"])
