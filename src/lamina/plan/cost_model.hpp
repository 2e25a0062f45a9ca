#pragma once
// What each instruction of a plan's step costs on a machine, in seconds: the prices the
// simulator runs the instruction lists with. Compute comes from a roofline of each op's
// FLOPs and bytes (GEMMs at the device's peak times the measured GEMM efficiency, the
// attention's batched products at theirs, element-wise kernels at the memory bandwidth
// times theirs, tensor-parallel all-reduces inside the block) or, for the machine at
// hand, from measured times of a block, the embedding and the head at the micro-batch size
// (MeasuredCosts). Copies move their bytes at the host-device link's bandwidth (or the
// device's share of the host memory's, if lower);
// collectives follow the ring algorithms (an all-reduce of S bytes over p ranks moves
// 2 (p-1)/p S per rank, plus 2 (p-1) latencies) on the link their group spans (NVLink-like
// inside a node, the network across nodes); AdamW updates 28 bytes per parameter at the
// device's bandwidth, or runs at the host's measured rate.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lamina/core/config.hpp"
#include "lamina/model/param_layout.hpp"
#include "lamina/plan/machine.hpp"
#include "lamina/plan/optimizer_plan.hpp"
#include "lamina/plan/plan.hpp"
#include "lamina/plan/simulator.hpp"

namespace lamina {

// Times of one micro-batch of `micro_batch_size` sequences measured on this machine, at
// tensor-parallel degree `tp` (train/profile.cpp).
struct MeasuredCosts {
  std::int64_t micro_batch_size = 0;
  int tp = 1;                      // measured at this degree, its collectives included
  bool sequence_parallel = false;  // and with sequence parallelism
  int cp = 1;                      // and at this context-parallel degree (its ring included)
  double block_forward = 0.0, block_backward = 0.0;
  double embed_forward = 0.0, embed_backward = 0.0;
  double head_forward = 0.0, head_backward = 0.0;
};

class CostModel {
 public:
  // measured: profiles of this machine; the one at the plan's micro-batch size, tp and
  // sequence parallelism is used for the layers' times where present.
  CostModel(const ModelConfig& model, const Plan& plan, const MachineSpec& machine,
            const std::vector<MeasuredCosts>& measured = {});
  // The same with this tensor-parallel degree's parameter layout at hand (the planner's
  // many layouts share a few).
  CostModel(const ModelConfig& model, const Plan& plan, const MachineSpec& machine,
            const std::vector<MeasuredCosts>& measured, const ParamLayout& layout);

  // The rank whose optimizer program is priced (subgroup sizes and sites).
  void set_rank_optimizers(const RankOptimizers& optimizers);

  const MachineSpec& machine() const { return machine_; }
  // Seconds of one instruction (a Pricer for simulate and simulate_update).
  double price(const Instruction& i) const;
  Pricer pricer() const;
  bool serial() const { return machine_.device_is_host; }
  // Kernels are queued on a device and the host goes on, except where tensor-parallel
  // all-reduces inside a layer make it wait (the executor's rule, Executor::compute_queued).
  bool compute_queued() const { return !machine_.device_is_host && plan_.layout.tp == 1 && plan_.layout.cp == 1; }

  // Where a block's time goes, per micro-batch (the roofline's parts; empty where the times
  // were measured): forward and backward of GEMMs, attention products, element-wise
  // passes, bf16 conversions, tensor-parallel all-reduces and the context-parallel ring's
  // exposed passes.
  struct Parts {
    double gemm = 0.0, attention = 0.0, elementwise = 0.0, conversions = 0.0, tp = 0.0, cp = 0.0;
  };
  const Parts& forward_parts() const { return forward_parts_; }
  const Parts& backward_parts() const { return backward_parts_; }

  // One micro-batch through one block (whatever its activations' policy: a recomputation
  // costs a forward pass), the embedding, the head.
  double block_forward() const { return block_forward_; }
  double block_backward() const { return block_backward_; }
  double embed_forward() const { return embed_forward_; }
  double embed_backward() const { return embed_backward_; }
  double head_forward() const { return head_forward_; }
  double head_backward() const { return head_backward_; }
  // Moving a layer's parameters for one use (all-gather, copy in): gather_params.
  double gather(int layer) const;
  // A block's inner activations one way between the tiers.
  double activation_copy(bool to_host) const;
  // A block's input (its checkpoint, one micro-batch's residual stream as stored) one way.
  double checkpoint_copy(bool to_host) const;
  // Bytes per second of one device's copies to or from the host: its link, or its share of
  // the host memory's bandwidth, which the node's devices copy through together.
  double host_link(bool to_host) const;
  // The data-parallel reduction of a layer's gradients, after adding the copies of its
  // replicated K/V heads over the tensor-parallel group.
  double reduce(int layer) const;
  double replica_sum_bytes(int layer) const;  // per rank, the all-reduce of its replicated K/V heads
  double norm_sum_bytes(int layer) const;     // per rank, sequence parallelism's all-reduce of its norms' gradients
  // The layer's owned gradients to the host.
  double flush(int layer) const;
  // AdamW on n parameters at a site (device subgroups of a host-resident layer include
  // their state's copies in and out; `rounds`: the kernel also writes the new values in
  // bf16, the parameters stored on the device).
  double update(std::int64_t n, UpdateSite site, bool host_resident, bool rounds) const;
  // Updated parameters of a layer from host memory into its stored parameters.
  double publish(int layer) const;
  // ZeRO-1/2 all-gather of a layer's updated shards.
  double share(int layer) const;
  // A pipeline message: the residual stream of one micro-batch (activation), or its gradient.
  double p2p(bool activation) const;
  // The tied embedding's gradient sum between the first and last stage (pp > 1).
  double sync() const;

  // Bytes one rank sends per step and group ("dp", "tp", "pp"; "cp" with context parallelism) running a stage's program
  // and its optimizer program (ring volumes, as the communicators count them).
  std::map<std::string, double> traffic(const std::vector<Instruction>& step, const std::vector<Instruction>& update) const;

  // Time of a ring collective moving `bytes_per_rank` per rank in `steps` latency-bound
  // steps over a group spanning `extent` consecutive ranks (tp innermost).
  double collective(double bytes_per_rank, int steps, int extent) const;

 private:
  double layer_numel(int layer) const;
  // Rows of a micro-batch's stream on a rank (before sequence parallelism's split).
  double stream_rows() const;
  double param_bytes() const { return bf16_ ? 2.0 : 4.0; }  // also of stored activations
  // Of an element of the blocks' tensor-parallel sums (parallel.tp_sums).
  double tp_sum_bytes() const { return bf16_ && plan_.tp_sums == Precision::bf16 ? 2.0 : 4.0; }

  ModelConfig model_;
  Plan plan_;
  MachineSpec machine_;
  bool bf16_;
  std::vector<double> numel_;  // per parameter-layout layer, this rank's tensor-parallel piece
  std::vector<double> replica_sums_;  // per layer, the elements its replicated K/V heads add (replica_sum_elements)
  std::vector<double> norm_sums_;     // per layer, its norms' elements
  std::map<int, std::vector<std::int64_t>> subgroups_;  // per layer: subgroup sizes
  std::map<int, std::int64_t> host_elements_;           // per layer: elements updated on the host
  double inner_ = 0.0;         // floats of a block's inner activations per micro-batch
  double block_forward_ = 0.0, block_backward_ = 0.0;
  Parts forward_parts_, backward_parts_;
  double embed_forward_ = 0.0, embed_backward_ = 0.0, head_forward_ = 0.0, head_backward_ = 0.0;
};

}  // namespace lamina
