"""Config composition and validation: every rejection names the field and says the fix, before any work."""

import pytest

from core.config import ConfigError, TrainConfig, from_container, load_config, to_dict


def test_defaults_compose_into_dataclasses():
    cfg = load_config([])
    assert isinstance(cfg, TrainConfig)
    assert (cfg.model.name, cfg.optim.name, cfg.parallel.world_size, cfg.grad_accum_steps) == ("tiny", "adamw", 1, 1)


def test_groups_and_overrides():
    cfg = load_config(
        ["model=small", "optim=muon", "optim.lr=0.01", "training.micro_batch_size=2", "parallel.dp_replicate=2"]
    )
    assert cfg.model.d_model == 256 and cfg.model.vocab_size == 4096
    assert cfg.optim.name == "muon" and cfg.optim.lr == 0.01
    assert cfg.parallel.world_size == 2 and cfg.grad_accum_steps == 8 // (2 * 2)


def test_resolved_config_round_trips():
    cfg = load_config(["model=medium", "memory.limit_gb=4"])
    assert from_container(to_dict(cfg)) == cfg


SWAP = ["memory.swap=true", "training.mode=pynative"]


def test_swap_settings_compose():
    cfg = load_config([*SWAP, "memory.swap_layers=2", "memory.swap_ops=[attention,mlp]", "memory.swap_prefetch=2"])
    m = cfg.memory
    assert (m.swap_layers, list(m.swap_ops), m.swap_prefetch) == (2, ["attention", "mlp"], 2)
    assert from_container(to_dict(cfg)) == cfg


@pytest.mark.parametrize(
    "overrides, field, fix",
    [
        (["model.not_a_key=1"], "model.not_a_key", "spelling"),
        (["+extra=1"], "extra", "not in"),
        (["model=huge"], "model", "tiny"),
        (["optim.lr=abc"], "optim.lr", "Float"),
        (["optim.lr=-1"], "optim.lr", "> 0"),
        (["optim.name=sgd"], "optim.name", "adamw or muon"),
        (["model.n_heads=3"], "model.d_model", "divisible"),
        (["model.n_kv_heads=3"], "model.n_kv_heads", "divide"),
        (["training.micro_batch_size=3"], "training.global_batch_size", "multiple"),
        (["parallel.dp_replicate=3"], "training.global_batch_size", "data-parallel degree 3"),
        (["training.micro_batch_size=0"], "training.micro_batch_size", "> 0 or null"),
        (["training.seq_len=1024"], "training.seq_len", "max_seq_len"),
        (["memory.limit_gb=0"], "memory.limit_gb", "> 0"),
        (["trial.max_steps=null"], "trial.max_steps", "budget"),
        (["memory.recompute=some"], "memory.recompute", "none, selective, selective_op, full"),
        (["memory.recompute=selective"], "memory.recompute", "training.mode=pynative"),
        (["memory.swap=true"], "memory.swap", "training.mode=pynative"),
        (
            ["memory.swap=true", "training.mode=pynative", "memory.recompute=full"],
            "memory.swap",
            "memory.recompute=none",
        ),
        (["memory.recompute_layers=0"], "memory.recompute_layers", "must be >= 1"),
        ([*SWAP, "memory.swap_layers=0"], "memory.swap_layers", "must be >= 1"),
        ([*SWAP, "memory.swap_layers=4", "model=tiny"], "memory.swap_layers", "exceeds model.n_layers=3"),
        ([*SWAP, "memory.swap_ops=[attention,softmax]"], "memory.swap_ops", "among attention, mlp, norm"),
        ([*SWAP, "memory.swap_ops=[]"], "memory.swap_ops", "at least one of attention, mlp, norm"),
        ([*SWAP, "memory.swap_prefetch=-1"], "memory.swap_prefetch", "must be >= 0"),
        (["memory.swap_layers=2"], "memory.swap_layers", "set memory.swap=true"),
        (["memory.swap_ops=[mlp]"], "memory.swap_ops", "set memory.swap=true"),
        (["memory.swap_prefetch=1"], "memory.swap_prefetch", "set memory.swap=true"),
        (["memory.recompute_layers=7", "model=tiny"], "memory.recompute_layers", "exceeds model.n_layers"),
        (["memory.recompute_stage_layers=[-1]"], "memory.recompute_stage_layers", "must count blocks (>= 0)"),
        (
            ["memory.recompute_stage_layers=[1]", "memory.recompute_layers=1"],
            "memory.recompute_stage_layers",
            "set one of them to null",
        ),
        (
            ["model=small", "parallel.pp=2", "memory.recompute_stage_layers=[1]"],
            "memory.recompute_stage_layers",
            "(pp * pp_virtual = 2)",
        ),
        (
            ["model=small", "parallel.pp=2", "parallel.pp_layers=[3,1]", "memory.recompute_stage_layers=[1,2]"],
            "memory.recompute_stage_layers",
            "exceeds the blocks of a stage [3, 1]",
        ),
        (["training.mode=graph"], "training.mode", "jit or pynative"),
        (["execution.jit_level=O2"], "execution.jit_level", "O0 or O1"),
        (["execution.capture_mode=trace"], "execution.capture_mode", "ast or bytecode"),
        (["execution.kernel_threads=0"], "execution.kernel_threads", ">= 1, or null"),
        (["execution.dispatch_threads=0"], "execution.dispatch_threads", ">= 1, or null"),
        (["execution.eval_mode=graph"], "execution.eval_mode", "auto, jit or pynative"),
        (["execution.cpu_kernels=true", "device=Ascend"], "execution.cpu_kernels", "null or false"),
        (["checkpoint.interval=50", "trial.max_steps=10"], "checkpoint.interval", "longer"),
        (["checkpoint.load_weights=/ckpt/step_10"], "checkpoint.load_weights", "hf:<dir>"),
        (["model.head_dim=7"], "model.head_dim", "even and > 0"),
        (["model.head_dim=0"], "model.head_dim", "even and > 0"),
        (["training.health_interval=-1"], "training.health_interval", ">= 0"),
        (["model.attention=mha"], "model.attention", "gqa or mla"),
        (["model.attention=mla"], "model.n_kv_heads", "must equal model.n_heads=4"),
        (["model=deepseek-tiny", "model.qk_rope_head_dim=15"], "model.qk_rope_head_dim", "even"),
        (["model=deepseek-tiny", "model.qk_norm=true"], "model.attention", "no q/k/v biases or QK-norm"),
        (["model=deepseek-tiny", "model.moe_groups=3"], "model.moe_groups", "divide model.n_experts=8"),
        (["model=deepseek-tiny", "model.moe_topk_groups=5"], "model.moe_topk_groups", "between 1 and"),
        (["model=deepseek-tiny", "model.moe_score_bias=false"], "model.moe_bias_update_rate", "moe_score_bias=true"),
        (["model.mtp_layers=-1"], "model.mtp_layers", ">= 0"),
        (["model.mtp_loss_weight=-0.1"], "model.mtp_loss_weight", ">= 0"),
        (["model=deepseek-tiny", "model.q_lora_rank=0"], "model.q_lora_rank", "> 0 or null"),
        (["model=deepseek-tiny", "model.kv_lora_rank=0"], "model.kv_lora_rank", "> 0"),
        (["model=deepseek-tiny", "model.moe_routed_scale=0"], "model.moe_routed_scale", "> 0"),
        (["training.max_attention_logit=0"], "training.max_attention_logit", "> 0, or null"),
    ],
)
def test_rejections_name_the_field_and_the_fix(overrides, field, fix):
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    assert info.value.field == field
    assert fix in str(info.value)


# One test per layout rule (tiny: 4 heads, 2 KV heads, vocab 256, FFN 512, 3 layers; seq 64, global batch 8).
@pytest.mark.parametrize(
    "overrides, field, fix",
    [
        (["parallel.tp=3"], "parallel.tp", "model.n_heads=4"),
        (["parallel.tp=4"], "parallel.tp", "model.n_kv_heads=2"),
        (["parallel.tp=2", "model.vocab_size=255"], "parallel.tp", "model.vocab_size=255"),
        (["parallel.tp=2", "model.ffn_hidden=511"], "parallel.tp", "model.ffn_hidden=511"),
        (["parallel.cp=2", "training.seq_len=62"], "parallel.cp", "2*cp = 4 equal chunks"),
        (["parallel.cp=3"], "parallel.cp", "2*cp = 6 equal chunks"),
        (["parallel.sp=true"], "parallel.sp", "needs parallel.tp > 1"),
        (["parallel.tp=2", "parallel.sp=true", "training.seq_len=63"], "parallel.sp", "split into tp=2"),
        (["parallel.dp_shard=3"], "training.global_batch_size", "data-parallel degree 3"),
        (
            ["parallel.dp_shard=2", "parallel.dp_replicate=2", "training.micro_batch_size=4"],
            "training.global_batch_size",
            "4 * 4 = 16",
        ),
        (["parallel.pp=2"], "parallel.pp", "do not divide model.n_layers=3"),
        (["parallel.pp=2", "parallel.pp_layers=[1,1]"], "parallel.pp_layers", "model.n_layers=3 in all"),
        (["parallel.pp=3", "parallel.pp_layers=[2,0,1]"], "parallel.pp_layers", "at least one layer"),
        (["parallel.pp=2", "parallel.pp_layers=[4,-1]"], "parallel.pp_layers", "at least one layer"),
        (["parallel.pp=2", "parallel.pp_layers=[1,1,1]"], "parallel.pp_layers", "pp * pp_virtual = 2 stages"),
        (["parallel.pp=2", "model.n_layers=4", "parallel.pp_offset=2"], "parallel.pp_offset", "split [4, 0]"),
        (["parallel.pp=2", "parallel.pp_layers=[1,2]", "parallel.pp_offset=1"], "parallel.pp_offset", "pp_layers"),
        (["parallel.pp_offset=1"], "parallel.pp_offset", "needs a pipeline"),
        (["parallel.pp=2", "model.n_layers=4", "parallel.pp_virtual=2"], "parallel.pp_virtual", "interleaved"),
        (
            [
                "parallel.pp=2",
                "model.n_layers=4",
                "parallel.pp_virtual=2",
                "parallel.pp_schedule=interleaved",
                "training.global_batch_size=6",
                "training.micro_batch_size=2",
            ],
            "parallel.pp_schedule",
            "multiple of pp=2",
        ),
        (["parallel.pp_schedule=zb"], "parallel.pp_schedule", "gpipe, 1f1b, interleaved or mpipe"),
        (["parallel.pp_schedule=mpipe"], "parallel.pp_schedule", "needs parallel.pp > 1"),
        (["model.freeze_embedding=true"], "model.freeze_embedding", "model.tie_embeddings=false"),
        (["model.freeze_layers=3"], "model.freeze_layers", "below model.n_layers=3"),
        (
            ["parallel.pp=2", "model.n_layers=4", "model.freeze_layers=2"],
            "model.freeze_layers",
            "nothing to train",
        ),
        (["parallel.pp=2", "parallel.pp_transpose_layers=1"], "parallel.pp_transpose_layers", "pp_schedule=mpipe"),
        (
            ["parallel.pp=2", "model.n_layers=4", "parallel.pp_schedule=mpipe", "parallel.pp_transpose_layers=2"],
            "parallel.pp_transpose_layers",
            "lower it below 2",
        ),
        (
            ["parallel.pp=2", "parallel.pp_schedule=mpipe", "parallel.pp_transpose_overflow=all"],
            "parallel.pp_transpose_overflow",
            "full or min",
        ),
        (
            ["parallel.pp_schedule=mpipe", "parallel.pp=2", "parallel.pp_transpose_layers=-1"],
            "parallel.pp_transpose_layers",
            ">= 0",
        ),
        (
            ["parallel.pp=2", "model.n_layers=4", "memory.recompute_stages=[full]"],
            "memory.recompute_stages",
            "one setting per pipeline stage",
        ),
        (["memory.recompute_stages=[all]"], "memory.recompute_stages", "none, selective, selective_op, full"),
        (["model=moe-tiny", "parallel.ep=2"], "parallel.ep", "dp_shard * cp * tp = 1"),
        (["parallel.ep=2", "parallel.dp_shard=2"], "parallel.ep", "MoE model's experts"),
    ],
)
def test_every_layout_rule_names_the_field_and_the_fix(overrides, field, fix):
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    assert info.value.field == field
    assert fix in str(info.value)


def test_valid_layouts_compose():
    for overrides in (
        ["parallel.dp_shard=2"],
        ["parallel.tp=2", "parallel.sp=true"],
        ["parallel.cp=2"],
        ["parallel.dp_replicate=2", "parallel.dp_shard=2"],
        ["parallel.cp=2", "parallel.tp=2"],
        ["parallel.pp=3"],
        ["parallel.pp=2", "parallel.pp_layers=[2,1]", "parallel.tp=2"],
        ["parallel.pp=2", "model.n_layers=4", "parallel.pp_offset=-1", "memory.recompute_stages=[full,none]"],
        [
            "parallel.pp=2",
            "model.n_layers=4",
            "parallel.pp_virtual=2",
            "parallel.pp_schedule=interleaved",
            "training.micro_batch_size=4",
        ],
        ["parallel.pp=2", "model.n_layers=4", "parallel.pp_schedule=mpipe", "parallel.pp_transpose_layers=1"],
        [
            "parallel.pp=2",
            "model.n_layers=4",
            "parallel.pp_schedule=mpipe",
            "parallel.pp_virtual=2",
            "training.micro_batch_size=4",
        ],
    ):
        load_config(overrides)
    assert load_config(["parallel.pp=2", "model.n_layers=4", "parallel.pp_offset=-1"]).parallel.stage_split(4) == [1, 3]
    # the embedding alone on the first stage and the head alone on the last (Megatron's split accounting)
    edges = ["parallel.pp=2", "parallel.pp_schedule=interleaved", "parallel.pp_virtual=2", "model.n_layers=4"]
    edges.append("training.micro_batch_size=4")  # 2 micro-batches of the 8: a multiple of pp
    assert load_config([*edges, "parallel.pp_layers=[0,2,2,0]"]).parallel.stage_split(4) == [0, 2, 2, 0]


def test_degrees_must_multiply_to_the_cluster_size():
    from core.parallel.dims import ParallelDims

    cfg = load_config(["parallel.tp=2", "parallel.dp_shard=2"])
    assert ParallelDims.from_config(cfg.parallel, rank=3, world_size=4).world_size == 4
    with pytest.raises(ConfigError) as info:
        ParallelDims.from_config(cfg.parallel, rank=0, world_size=2)
    assert info.value.field == "parallel" and "multiply to 4" in str(info.value) and "has 2" in str(info.value)


def test_micro_batch_defaults_to_no_accumulation():
    assert load_config([]).training.micro_batch_size == 8
    cfg = load_config(["parallel.dp_replicate=2"])
    assert (cfg.training.micro_batch_size, cfg.grad_accum_steps) == (4, 1)


def test_node_ranks_single_host_and_multi_node(monkeypatch):
    from core.runtime.cluster import node_ranks

    monkeypatch.delenv("MSAR_NODE_RANKS", raising=False)
    assert node_ranks(4) == (0, 4)
    monkeypatch.setenv("MSAR_NODE_RANKS", "2:2")  # the second node of a 2 x 2 run
    assert node_ranks(4) == (2, 2)
    monkeypatch.delenv("MSAR_NODE_RANKS")
    monkeypatch.setenv("MSAR_NNODES", "4")  # what the Slurm job sets: node 3 of 4, 8 ranks
    monkeypatch.setenv("MSAR_NODE_RANK", "3")
    assert node_ranks(8) == (6, 2)


def test_a_world_the_nodes_do_not_split_is_refused_before_any_rank_starts():
    from core.config.rules import check_runnable

    check_runnable(load_config(["parallel.dp_replicate=4"]), nodes=2)
    for overrides in (["parallel.dp_replicate=3", "training.global_batch_size=6"], []):  # 3 ranks; 1 rank
        with pytest.raises(ConfigError, match="split evenly over the trial's 2 nodes") as info:
            check_runnable(load_config(overrides), nodes=2)
        assert info.value.field == "parallel"


@pytest.mark.parametrize(
    "mode, eval_mode, interval, max_steps, compiled",
    [
        ("jit", "auto", 0, 20, False),  # one validation, at the end: op by op, no graph to compile
        ("jit", "auto", 20, 20, False),  # the interval's only pass is the end's
        ("jit", "auto", 10, 20, True),  # two passes
        ("jit", "auto", 10, None, True),  # a wall budget: any number of passes
        ("jit", "jit", 0, 20, True),
        ("jit", "pynative", 10, 100, False),
        ("pynative", "jit", 10, 100, False),  # nothing compiles in PyNative
    ],
)
def test_validation_compiles_only_when_it_pays(mode, eval_mode, interval, max_steps, compiled):
    budget = f"trial.max_steps={max_steps}" if max_steps else "trial.max_wall_time_sec=60"
    cfg = load_config(
        [
            f"training.mode={mode}",
            f"execution.eval_mode={eval_mode}",
            f"training.eval_interval={interval}",
            *([budget] if max_steps else ["trial.max_steps=null", budget]),
        ]
    )
    assert cfg.eval_compiled is compiled


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["model=small", "optim=muon", "parallel.tp=2", "parallel.sp=true", "parallel.pp=2", "parallel.pp_layers=[1,3]"],
        ["training.mode=pynative", "memory.swap=true", "memory.swap_ops=[mlp]"],
    ],
)
def test_a_config_handed_to_workers_is_the_same_config(overrides):
    """What the supervisor hands its workers (core.config.to_dict, as JSON) rebuilds the same config, and is
    checked again on the way in."""
    import json

    from core.config import from_dict, to_dict

    cfg = load_config(overrides)
    assert from_dict(json.loads(json.dumps(to_dict(cfg)))) == cfg
    bad = to_dict(cfg)
    bad["training"]["seq_len"] = 10**6
    with pytest.raises(ConfigError, match="training.seq_len"):
        from_dict(bad)
