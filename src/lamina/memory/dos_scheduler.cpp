#include "lamina/memory/dos_scheduler.hpp"

#include <algorithm>
#include <cmath>

#include "lamina/core/format.hpp"

namespace lamina {

namespace {
constexpr double kStateBytes = 12.0;  // fp32 master, m, v per parameter
}

int dos_stride(const DosModel& m) {
  const double B = m.contention * std::min(m.h2d, m.d2h);
  const double k = 1.0 + std::ceil(m.host_rate * (kStateBytes / B + 1.0 / m.device_rate));
  return std::isfinite(k) ? std::max(2, static_cast<int>(k)) : 2;
}

double dos_predicted_seconds(const std::vector<std::int64_t>& sizes, const std::vector<UpdateSite>& site,
                             const DosModel& m) {
  double host = 0.0, device = 0.0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const double s = static_cast<double>(sizes[i]);
    if (site[i] == UpdateSite::host) {
      host += s / m.host_rate;
    } else {
      device += kStateBytes * s / (m.contention * m.h2d) + s / m.device_rate + kStateBytes * s / (m.contention * m.d2h);
    }
  }
  return m.concurrent ? std::max(host, device) : host + device;
}

DosPlan plan_dos(const std::vector<std::int64_t>& sizes, const DosModel& m, std::int64_t device_free, DosSplit split) {
  DosPlan p;
  const std::size_t n = sizes.size();
  p.site.assign(n, UpdateSite::host);
  switch (split) {
    case DosSplit::all_host: break;
    case DosSplit::all_device: std::fill(p.site.begin(), p.site.end(), UpdateSite::device); break;
    case DosSplit::alternate:
      for (std::size_t x = 1; x < n; x += 2) p.site[x] = UpdateSite::device;
      break;
    case DosSplit::model:
      if (!m.concurrent) break;  // a device subgroup would only add its transfers
      p.stride = dos_stride(m);
      for (std::size_t x = 0; x < n; ++x)
        if ((x + 1) % static_cast<std::size_t>(p.stride) == 0) p.site[x] = UpdateSite::device;
      break;
  }
  std::int64_t largest = 0;
  for (std::size_t x = 0; x < n; ++x)
    if (p.site[x] == UpdateSite::device) largest = std::max(largest, sizes[x]);
  p.device_bytes = 2 * static_cast<std::int64_t>(kStateBytes) * largest;
  if (largest > 0 && device_free >= 0 && p.device_bytes > device_free) {
    // What the split needs does not fit now: every subgroup on the host.
    std::fill(p.site.begin(), p.site.end(), UpdateSite::host);
    p.memory_limited = true;
    p.device_bytes = 0;
  }
  if (std::none_of(p.site.begin(), p.site.end(), [](UpdateSite s) { return s == UpdateSite::device; })) p.stride = 0;
  for (std::size_t x = 0; x < n; ++x)
    if (p.site[x] == UpdateSite::host) p.host_params += sizes[x];
  p.predicted_seconds = dos_predicted_seconds(sizes, p.site, m);
  p.all_host_seconds = dos_predicted_seconds(sizes, std::vector<UpdateSite>(n, UpdateSite::host), m);
  return p;
}

std::string DosPlan::describe() const {
  std::string sites;
  for (const UpdateSite s : site) sites += s == UpdateSite::device ? 'D' : 'h';
  // A forced split runs without the model's inputs: nothing to predict from.
  const std::string prediction =
      std::isfinite(predicted_seconds)
          ? strprintf(", predicted %.3f ms (all host %.3f ms)", predicted_seconds * 1e3, all_host_seconds * 1e3)
          : "";
  return strprintf("%zu subgroups [%s], stride %d, %s%s%s", site.size(), sites.c_str(), stride,
                   human_bytes(static_cast<double>(device_bytes)).c_str(), prediction.c_str(),
                   memory_limited ? ", device memory too small: all host" : "");
}

}  // namespace lamina
