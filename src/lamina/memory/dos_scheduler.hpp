#pragma once
// Deep Optimizer States (Maurya et al., Middleware'24):
// the optimizer state lives in host memory, cut into subgroups, and every step some
// subgroups are moved to the device, updated there and moved back, while the host
// updates the rest. This file decides which, from a performance model; it knows
// nothing about Kokkos, so it can be tested on hand-computed cases.
//
// Per subgroup of S parameters (fp32 master, m, v: 12 bytes each):
//   on the host:   S / U_h of host update (its gradient crossed during backward)
//   on the device: 12 S / B_h2d in, S / U_d of update, 12 S / B_d2h out
// Device subgroups are pipelined with the host updates: while the host updates k - 1
// subgroups the next device subgroup must arrive, be updated and the previous one
// leave, so every k-th subgroup goes to the device with
//   k* = 1 + ceil(U_h (12 / (gamma B) + 1 / U_d)),  B = min(B_h2d, B_d2h),  k* >= 2,
// DeepSpeed's stride rule (subgroup x on the device when (x + 1) mod k = 0). A device
// subgroup needs its state staged in device memory (double-buffered: 2 x 12 S_max
// bytes); when that does not fit in the memory free at update time, all go to the host.
#include <cstdint>
#include <string>
#include <vector>

#include "lamina/optim/placement.hpp"

namespace lamina {

struct DosModel {
  double host_rate = 0.0;    // U_h, host AdamW, parameters per second
  double device_rate = 0.0;  // U_d, device AdamW, parameters per second
  double h2d = 0.0;          // bytes per second
  double d2h = 0.0;
  double contention = 1.0;   // gamma <= 1: link slowdown while the host update loads memory
  // Whether device work runs beside the host's (a GPU); on a host-only build the "device"
  // is the same cores, so the two sides add up and the model keeps every subgroup home.
  bool concurrent = true;
};

// Which subgroups a dynamic layer updates on the device: as the model says, or forced
// (tests and experiments).
enum class DosSplit { model, all_host, all_device, alternate };

struct DosPlan {
  std::vector<UpdateSite> site;  // per subgroup
  int stride = 0;                // k; 0 when no subgroup goes to the device
  bool memory_limited = false;   // the model wanted device subgroups that do not fit
  double predicted_seconds = 0.0;
  double all_host_seconds = 0.0;
  std::int64_t device_bytes = 0;  // staging the plan needs on the device
  std::int64_t host_params = 0;   // parameters the host updates
  std::string describe() const;
};

// The stride the model asks for (>= 2).
int dos_stride(const DosModel& m);

// Predicted update-phase time of a placement: host updates run beside the device chain
// (transfers in, update, transfers out), so the phase takes the longer of the two (their
// sum when nothing runs concurrently).
double dos_predicted_seconds(const std::vector<std::int64_t>& sizes, const std::vector<UpdateSite>& site,
                             const DosModel& m);

// sizes: parameters per subgroup, in the order they are updated; device_free: bytes of
// device memory free for staging at update time (negative: unknown, treated as enough).
DosPlan plan_dos(const std::vector<std::int64_t>& sizes, const DosModel& m, std::int64_t device_free, DosSplit split);

}  // namespace lamina
