"""Shared by the step-time model's tests."""

# A made-up accelerator with round numbers, so that hand-derived times are easy to write down.
CLUSTER = [
    "cluster.name=test",
    "cluster.device=GPU",
    "cluster.peak_tflops_fp32=100",
    "cluster.peak_tflops_bf16=200",
    "cluster.memory_gib=80",
    "cluster.memory_bandwidth_gbps=2000",
    "cluster.intra_node_bandwidth_gbps=100",
    "cluster.intra_node_latency_us=0",
    "cluster.launch_overhead_us=0",
    "cluster.inter_node_bandwidth_gbps=10",
    "cluster.inter_node_latency_us=0",
    "cluster.devices_per_node=8",
    "cluster.matmul_efficiency=1.0",
    "cluster.collective_efficiency_intra=1.0",
    "cluster.collective_efficiency_inter=1.0",
    "cluster.overlap_fsdp=true",
    "cluster.overlap_dp=true",
]
