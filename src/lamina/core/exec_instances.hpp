#pragma once
// Execution-space instances for work that should overlap the compute stream: copies
// between memory tiers. On GPUs that is a stream of its own; host back-ends run such
// copies in order on the default instance (Kokkos 3.4 has no other).
#include <Kokkos_Core.hpp>
#include <type_traits>

#include "lamina/core/kokkos_compat.hpp"

namespace lamina {

template <class Exec>
Exec transfer_instance() {
#if KOKKOS_VERSION >= 40000
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible;
  if constexpr (!host) return Kokkos::Experimental::partition_space(Exec(), 1)[0];
#endif
  return Exec();
}

}  // namespace lamina
