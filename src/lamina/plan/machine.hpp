#pragma once
// A machine the planner plans for: one kind of device, several per node, nodes joined by a
// network. inputs/machines/*.toml describe published systems (every number with its
// source); `lamina bench machine --write FILE` measures the machine it runs on.
//
//   name = "DGX A100 80GB"
//   [device]   per_node, memory, peak_tflops_fp32, peak_tflops_bf16 (0 or absent: no bf16
//              products; bf16 runs keep fp32 ones), memory_bandwidth,
//              adamw_params_per_s (optional: measured; else the bandwidth at [efficiency] adamw),
//              is_host and cores (a host-only machine: the "device" is the host's cores)
//   [host]     memory (per node), memory_bandwidth (per node), adamw_params_per_s (per node)
//   [links]    h2d, d2h (per device)
//   [network]  intra_node_bandwidth, intra_node_latency, inter_node_bandwidth, inter_node_latency
//   [efficiency] gemm, attention, elementwise, adamw (fractions of peak or bandwidth reached)
//
// Bytes are integers or strings such as "80GiB"; bandwidths are bytes per second ("25GB"
// = 25e9 B/s, "200Gb" = 25e9 B/s); latencies in seconds.
#include <cstdint>
#include <string>

namespace lamina {

struct MachineSpec {
  std::string name;
  std::string source;  // the file it came from, or "measured"
  // device
  int devices_per_node = 1;
  double device_memory = 0.0;      // bytes
  double peak_flops_fp32 = 0.0;    // dense FLOP/s
  double peak_flops_bf16 = 0.0;    // 0: no bf16 products (bf16 runs keep fp32 ones)
  double memory_bandwidth = 0.0;   // bytes/s
  // host, per node
  double host_memory = 0.0;
  double host_bandwidth = 0.0;
  double host_adamw_rate = 0.0;    // parameters per second, all cores of a node
  double device_adamw_rate = 0.0;  // parameters per second on one device; 0: from the bandwidth
  // host <-> device, per device
  double h2d = 0.0, d2h = 0.0;
  // network, per device
  double intra_bandwidth = 0.0, intra_latency = 0.0;
  double inter_bandwidth = 0.0, inter_latency = 0.0;
  // fractions of the peaks the kernels reach
  double gemm_efficiency = 0.7;
  double attention_efficiency = 0.5;
  double elementwise_efficiency = 0.7;
  double adamw_efficiency = 0.7;   // of the device memory bandwidth (28 bytes per parameter)
  // Whether the device computes beside the host (a GPU): on a host-only machine copies,
  // collectives and host work take the same cores as the compute.
  bool device_is_host = false;
  // host-only machines: cores each rank's device has (0: not given); at most one, the cost
  // model prices the passes a lone host thread joins (kernels/norm_backward.hpp)
  int cores_per_device = 0;

  bool bf16_products() const { return peak_flops_bf16 > 0; }
  double peak_flops(bool bf16) const { return bf16 && bf16_products() ? peak_flops_bf16 : peak_flops_fp32; }
};

// Throws InputError naming file:line:col for unknown keys, wrong types and missing values.
MachineSpec load_machine(const std::string& path);
MachineSpec parse_machine(const std::string& text, const std::string& source);
// The description as TOML that load_machine reads back.
std::string machine_toml(const MachineSpec& m);

}  // namespace lamina
