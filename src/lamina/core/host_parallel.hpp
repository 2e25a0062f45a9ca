#pragma once
// Independent host work spread over this process's cores: the planner's layouts, stages
// and candidates (host code that needs no Kokkos, so plain threads).
#include <cstddef>
#include <functional>

namespace lamina {

// Cores this process may run on (its affinity mask: what Slurm or taskset granted).
int usable_cores();

// Calls f(i) for every i in [0, n), on up to `threads` threads (the calling one among
// them; 0: usable_cores()), each taking the next index until none is left. Returns when
// all calls have returned; if any threw, rethrows the exception of the smallest index.
void for_each_index(std::size_t n, int threads, const std::function<void(std::size_t)>& f);

}  // namespace lamina
