#include "lamina/train/step_trace.hpp"

#include "lamina/core/format.hpp"
#include "lamina/core/json.hpp"

namespace lamina {

namespace {

// One complete event ("ph": "X") of `name` on track `tid`, [from, to] seconds.
std::string span(const std::string& name, const std::string& category, int rank, const std::string& tid, double from,
                 double to, const std::string& args) {
  return strprintf("{\"name\": %s, \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": \"%s\", \"ts\": %.3f, "
                   "\"dur\": %.3f, \"args\": %s}",
                   json_escape(name).c_str(), category.c_str(), rank, tid.c_str(), from * 1e6,
                   std::max(0.0, to - from) * 1e6, args.c_str());
}

}  // namespace

std::string step_trace_json(const std::vector<Instruction>& program, const std::vector<InstructionEvent>& events,
                            int final_layer, int rank, const std::vector<RingPass>& ring) {
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  auto put = [&](const std::string& e) {
    out += (first ? "" : ",\n") + e;
    first = false;
  };
  for (std::size_t k = 0; k < events.size() && k < program.size(); ++k) {
    const Instruction& i = program[k];
    const InstructionEvent& e = events[k];
    const std::string name = describe({i}, final_layer);
    std::string after;
    for (const int j : i.after) after += (after.empty() ? "" : ", ") + std::to_string(j);
    const std::string args = strprintf("{\"index\": %d, \"after\": [%s]}", e.index, after.c_str());
    if (!i.after.empty()) put(span("wait", "wait", rank, "host", e.reached, e.issued, args));
    put(span(name, "host", rank, "host", e.issued, e.returned, args));
    if (!holds_host(i, Executor::compute_queued) && e.completed > e.returned) {
      const char* stream = stream_index_name(stream_index(i));
      put(span(name, stream, rank, stream, e.issued, e.completed, args));
    }
  }
  for (const RingPass& p : ring) {
    const bool keys = p.tag == kRingKeys;
    const std::string args = strprintf("{\"index\": %d}", p.index);
    put(span(keys ? "keys and values to the next rank" : "key/value gradients to the next rank", "cp", rank, "cp ring",
             p.begun, p.done, args));
    if (keys) put(span("ring attention beside the pass", "cp", rank, "cp attention", p.begun, p.waited, args));
  }
  return out + "\n]}\n";
}

}  // namespace lamina
