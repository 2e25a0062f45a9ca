#include "lamina/io/checkpoint.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "lamina/core/bounded_wait.hpp"
#include "lamina/core/limits.hpp"
#include "lamina/core/text_file.hpp"
#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/io/hdf5_file.hpp"
#include "lamina/io/output_file.hpp"

namespace lamina {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "lamina-checkpoint-1";

int rank_of(MPI_Comm comm) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}

// A barrier within parallel.timeout.
void barrier(MPI_Comm comm, const char* what) {
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_Ibarrier(comm, &r);
  bounded_wait(
      [&] {
        int done = 0;
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        return done != 0;
      },
      [&] { return std::string("the other ranks ") + what; });
}

// Where a write into `path` goes, for a message about a write refused: the file system's
// mount point and type, its free bytes, and this process's file-size limit if it has one.
std::string file_system_of(const std::string& path) {
  std::error_code ec;
  const std::string dir = fs::weakly_canonical(fs::path(path).parent_path(), ec).string();
  std::string mount = "/", type = "?";
  std::ifstream mounts("/proc/self/mounts");
  for (std::string device, point, kind, rest; mounts >> device >> point >> kind && std::getline(mounts, rest);) {
    const bool inside = dir == point || point == "/" ||
                        (dir.compare(0, point.size(), point) == 0 && dir.size() > point.size() && dir[point.size()] == '/');
    if (inside && point.size() >= mount.size()) {
      mount = point;
      type = kind;
    }
  }
  std::string what = "on " + mount + " (" + type + ")";
  struct statvfs v{};
  if (::statvfs(dir.c_str(), &v) == 0) {
    what += strprintf(", %s free of %s", human_bytes(static_cast<double>(v.f_bavail) * v.f_frsize).c_str(),
                      human_bytes(static_cast<double>(v.f_blocks) * v.f_frsize).c_str());
  }
  rlimit fsize{};
  if (::getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY) {
    what += strprintf(", under a file-size limit of %s (ulimit -f)", human_bytes(static_cast<double>(fsize.rlim_cur)).c_str());
  }
  return what;
}

// Every rank learns of a write that failed on any of them, at once: a rank that stopped at
// its own failure would leave the others waiting in the next collective call until
// parallel.timeout. Throws on every rank when one failed (`failure`: this rank's message,
// empty if its share was written).
void agree_on_write(MPI_Comm comm, const std::string& failure, const std::string& path, std::int64_t written) {
  int failed = failure.empty() ? INT_MAX : rank_of(comm);
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MIN, comm);
  if (failed == INT_MAX) return;
  const std::string where =
      written > 0 ? strprintf(" (%s written by this rank; %s)", human_bytes(static_cast<double>(written)).c_str(),
                              file_system_of(path).c_str())
                  : "; " + file_system_of(path);
  if (!failure.empty()) throw JobWideError(failure + where);
  throw JobWideError(strprintf("cannot write %s: rank %d's write failed; the checkpoint is abandoned", path.c_str(),
                               failed) +
                     where);
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

std::string block_signature(const ModelConfig& m) {
  const BlockParts& p = m.parts;
  std::string s = strprintf("kv_heads=%lld ffn_hidden=%lld norm=%s norm_eps=%g position=%s",
                            static_cast<long long>(m.key_value_heads()), static_cast<long long>(m.mlp_hidden()),
                            p.norm == NormKind::rmsnorm ? "rmsnorm" : "layernorm", p.norm_eps,
                            p.position == PositionKind::rotary ? "rotary" : "learned");
  if (p.position == PositionKind::rotary) {
    s += strprintf(" rope_theta=%g", p.rope_theta);
    const RotaryScaling& r = p.rope_scaling;
    if (r.factor > 0.0) {
      s += strprintf(" rope_scaling=%g rope_low_freq_factor=%g rope_high_freq_factor=%g rope_original_context=%g",
                     r.factor, r.low_freq_factor, r.high_freq_factor, r.original_context);
    }
  }
  s += p.mlp == MlpKind::swiglu ? " mlp=swiglu" : " mlp=gelu";
  return s + (m.tie_embeddings ? "" : " tie_embeddings=false");
}

bool gpt2_block(const ModelConfig& m) {
  ModelConfig gpt2 = m;
  gpt2.parts = BlockParts();
  gpt2.kv_heads = gpt2.ffn_hidden = 0;
  gpt2.tie_embeddings = true;
  return block_signature(m) == block_signature(gpt2);
}

bool llama_block(const ModelConfig& m) {
  const BlockParts& p = m.parts;
  return p.norm == NormKind::rmsnorm && p.position == PositionKind::rotary && p.mlp == MlpKind::swiglu && !p.bias;
}

std::string model_signature(const ModelConfig& m) {
  return strprintf("layers=%lld d_model=%lld heads=%lld seq_len=%lld vocab_size=%lld", static_cast<long long>(m.layers),
                   static_cast<long long>(m.d_model), static_cast<long long>(m.heads),
                   static_cast<long long>(m.seq_len), static_cast<long long>(m.vocab_size)) +
         (gpt2_block(m) ? "" : " " + block_signature(m));
}

bool parse_model_signature(const std::string& text, ModelConfig& out) {
  long long v[5] = {0, 0, 0, 0, 0};
  int used = 0;
  if (std::sscanf(text.c_str(), "layers=%lld d_model=%lld heads=%lld seq_len=%lld vocab_size=%lld%n", &v[0], &v[1],
                  &v[2], &v[3], &v[4], &used) != 5 ||
      std::any_of(v, v + 5, [](long long x) { return x < 1; })) {
    return false;
  }
  ModelConfig m = out;
  m.layers = v[0];
  m.d_model = v[1];
  m.heads = v[2];
  m.seq_len = v[3];
  m.vocab_size = v[4];
  m.parts = BlockParts();
  m.kv_heads = m.ffn_hidden = 0;
  m.tie_embeddings = true;
  // The block's parts, key=value words in any order.
  std::istringstream rest(text.substr(static_cast<std::size_t>(used)));
  for (std::string word; rest >> word;) {
    const auto eq = word.find('=');
    if (eq == std::string::npos) return false;
    const std::string key = word.substr(0, eq), value = word.substr(eq + 1);
    char* end = nullptr;
    const double x = std::strtod(value.c_str(), &end);
    const bool number = !value.empty() && *end == '\0' && std::isfinite(x);
    BlockParts& p = m.parts;
    if (key == "norm" && (value == "rmsnorm" || value == "layernorm")) {
      p.norm = value == "rmsnorm" ? NormKind::rmsnorm : NormKind::layernorm;
    } else if (key == "position" && (value == "rotary" || value == "learned")) {
      p.position = value == "rotary" ? PositionKind::rotary : PositionKind::learned;
    } else if (key == "tie_embeddings" && (value == "true" || value == "false")) {
      m.tie_embeddings = value == "true";
    } else if (key == "mlp" && (value == "swiglu" || value == "gelu")) {
      p.mlp = value == "swiglu" ? MlpKind::swiglu : MlpKind::gelu;
      p.bias = p.mlp == MlpKind::gelu;
    } else if (!number || x <= 0.0) {
      return false;
    } else if (key == "kv_heads" || key == "ffn_hidden") {
      if (x != std::floor(x) || x > 1e12) return false;
      (key == "kv_heads" ? m.kv_heads : m.ffn_hidden) = static_cast<std::int64_t>(x);
    } else if (key == "norm_eps") {
      p.norm_eps = x;
    } else if (key == "rope_theta") {
      p.rope_theta = x;
    } else if (key == "rope_scaling") {
      p.rope_scaling.factor = x;
    } else if (key == "rope_low_freq_factor") {
      p.rope_scaling.low_freq_factor = x;
    } else if (key == "rope_high_freq_factor") {
      p.rope_scaling.high_freq_factor = x;
    } else if (key == "rope_original_context") {
      p.rope_scaling.original_context = x;
    } else {
      return false;
    }
  }
  out = m;
  return true;
}

std::string checkpoint_name(std::int64_t step) { return strprintf("step_%08lld.h5", static_cast<long long>(step)); }

std::int64_t checkpoint_step(const std::string& name, const std::string& suffix) {
  const std::string prefix = "step_", ext = ".h5" + suffix;
  if (name.size() < prefix.size() + 8 + ext.size() || name.size() > prefix.size() + 13 + ext.size() ||
      name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - ext.size(), ext.size(), ext) != 0) {
    return -1;
  }
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - ext.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return -1;
  const std::int64_t step = std::stoll(digits);
  return checkpoint_name(step) + suffix == name ? step : -1;  // zero-padded exactly as written
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::int64_t step = checkpoint_step(e.path().filename().string());
    if (step >= 0 && e.is_regular_file(ec)) found.emplace_back(step, e.path().string());
  }
  std::sort(found.begin(), found.end());  // by step: past 10^8 steps the names grow a digit
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::vector<std::string> remove_partial_checkpoints(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!(checkpoint_step(name, ".tmp") >= 0 || name == "latest.tmp") || e.is_directory(ec)) continue;
    if (fs::remove(e.path(), ec)) removed.push_back(e.path().string());
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

CheckpointWriter::CheckpointWriter(const std::string& dir, std::int64_t step, MPI_Comm comm) : dir_(dir), comm_(comm) {
  if (rank_of(comm) == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw RunError(dir + ": cannot create the checkpoint directory: " + ec.message());
  }
  barrier(comm, "to start a checkpoint");
  final_path_ = dir + "/" + checkpoint_name(step);
  tmp_path_ = final_path_ + ".tmp";
  file_ = h5::create(tmp_path_, comm);
}

CheckpointWriter::CheckpointWriter(const std::string& path, MPI_Comm comm)
    : final_path_(path), tmp_path_(path + ".tmp"), comm_(comm) {
  file_ = h5::create(tmp_path_, comm);
}

CheckpointWriter::~CheckpointWriter() {
  if (committed_) return;
  file_.reset();
  if (rank_of(comm_) != 0) return;
  if (dir_.empty()) {
    std::remove(tmp_path_.c_str());
  } else {
    remove_partial_checkpoints(dir_);
  }
}

void CheckpointWriter::reserve(std::int64_t data_bytes) {
  // Chunk indexes, checksums and object headers: a few KiB per dataset, measured well under this.
  const std::int64_t need = data_bytes + data_bytes / 32 + (std::int64_t{4} << 20);
  const std::string about = strprintf("cannot write %s (the checkpoint needs about %s): ", tmp_path_.c_str(),
                                      human_bytes(static_cast<double>(need)).c_str());
  std::string failure;
  rlimit fsize{};
  if (::getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY &&
      static_cast<std::uint64_t>(need) > static_cast<std::uint64_t>(fsize.rlim_cur)) {
    failure = about + "more than this process may write into one file";
  }
  if (failure.empty() && rank_of(comm_) == 0) {
    // Blocks reserved beyond the file's end: writes into them cannot run out of space.
    const int fd = ::open(tmp_path_.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
      if (::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, need) != 0 && errno != EOPNOTSUPP && errno != ENOSYS) {
        failure = about + std::strerror(errno);
      }
      ::close(fd);
    }
  }
  agree_on_write(comm_, failure, tmp_path_, 0);
}

void CheckpointWriter::write(const TensorSlab& s) {
  if (s.data != nullptr && nonfinite_.empty()) {
    std::int64_t n = 1;
    for (const auto c : s.local_shape) n *= c;
    if (!std::all_of(s.data, s.data + n, [](float v) { return std::isfinite(v); })) nonfinite_ = s.name;
  }
  std::string failure;
  try {
    h5::write_slab(file_, tmp_path_, s.name, s.global_shape, s.pieces, s.local_shape, s.data);
  } catch (const RunError& e) {
    failure = e.what();
  }
  agree_on_write(comm_, failure, tmp_path_, bytes_);
  for (const auto& p : s.pieces) {
    std::int64_t n = 4;
    for (const auto c : p.count) n *= c;
    bytes_ += n;
  }
}

std::string CheckpointWriter::commit(const CheckpointMeta& meta, std::int64_t keep) {
  h5::set_attr(file_, "format", std::string(kFormat));
  h5::set_attr(file_, "step", meta.step);
  h5::set_attr(file_, "samples_consumed", meta.samples_consumed);
  h5::set_attr(file_, "optimizer_step", meta.optimizer_step);
  h5::set_attr(file_, "seed", static_cast<std::int64_t>(meta.seed));
  h5::set_attr(file_, "deck", meta.deck);
  h5::set_attr(file_, "layout", meta.layout);
  h5::set_attr(file_, "model", meta.model);
  if (meta.data_tokens > 0) h5::set_attr(file_, "data_tokens", meta.data_tokens);
  std::string failure;
  try {
    h5::flush(file_, tmp_path_);
  } catch (const RunError& e) {
    failure = e.what();
  }
  agree_on_write(comm_, failure, tmp_path_, bytes_);
  file_.reset();
  barrier(comm_, "to close the checkpoint");
  if (rank_of(comm_) == 0) {
    // Truncating to its own size gives back the blocks reserve() left beyond the end.
    std::error_code ec;
    const auto size = fs::file_size(tmp_path_, ec);
    if (!ec) fs::resize_file(tmp_path_, size, ec);
    fsync_path(tmp_path_);
    if (std::rename(tmp_path_.c_str(), final_path_.c_str()) != 0) {
      throw RunError(tmp_path_ + ": cannot rename to " + final_path_);
    }
  }
  if (rank_of(comm_) == 0 && !dir_.empty()) {
    point_latest(dir_, fs::path(final_path_).filename().string());
    // The newest `keep` of the steps up to this one, this one among them; later steps (a
    // future the run abandoned, kept at the user's word: checkpoint.newer) are not its own.
    const std::int64_t step = checkpoint_step(fs::path(final_path_).filename().string());
    std::vector<std::string> line;
    for (auto& p : list_checkpoints(dir_)) {
      if (checkpoint_step(fs::path(p).filename().string()) <= step) line.push_back(std::move(p));
    }
    for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < line.size(); ++i) {
      std::error_code ec;
      fs::remove(line[i], ec);
    }
  }
  committed_ = true;
  barrier(comm_, "to finish the checkpoint");
  return final_path_;
}

void point_latest(const std::string& dir, const std::string& name) {
  const std::string latest = dir + "/latest", latest_tmp = latest + ".tmp";
  write_text_file(latest_tmp, name + "\n");
  fsync_path(latest_tmp);
  if (std::rename(latest_tmp.c_str(), latest.c_str()) != 0) throw RunError(latest + ": cannot replace");
  fsync_path(dir);
}

std::string resolve_checkpoint(const std::string& resume, const std::string& dir) {
  if (resume != "latest") {
    const std::string tmp = ".tmp";
    if (resume.size() > tmp.size() && resume.compare(resume.size() - tmp.size(), tmp.size(), tmp) == 0) {
      throw InputError("checkpoint.resume: " + resume +
                       " is an unfinished write (a job stopped while writing it), not a checkpoint; resume from "
                       "a completed one (\"latest\", or a step_*.h5 file)");
    }
    if (!fs::exists(resume)) throw InputError("checkpoint.resume: " + resume + ": no such file");
    return resume;
  }
  const std::string latest = dir + "/latest";
  std::error_code ec;
  // It holds one file name; anything longer is not what lamina wrote.
  const std::string text = fs::exists(latest, ec) ? read_text_file(latest, "checkpoint pointer", 4096) : "";
  const std::string name = text.substr(0, text.find('\n'));
  if (name.empty()) {
    throw InputError("checkpoint.resume = \"latest\": " + latest +
                     " is missing or empty (no checkpoint was completed in " + dir + ")");
  }
  const std::string path = dir + "/" + name;
  if (!fs::exists(path)) throw InputError(latest + " names " + name + ", which does not exist");
  return path;
}

CheckpointReader::CheckpointReader(const std::string& path, MPI_Comm comm) : path_(path) {
  file_ = h5::open_read(path, comm);
  if (!h5::has_attr(file_, "format") || h5::attr_string(file_, path, "format") != kFormat) {
    throw InputError(path + ": not a lamina checkpoint (attribute format != \"" + std::string(kFormat) + "\")");
  }
  meta_.step = h5::attr_int(file_, path, "step");
  meta_.samples_consumed = h5::attr_int(file_, path, "samples_consumed");
  meta_.optimizer_step = h5::attr_int(file_, path, "optimizer_step");
  const auto check = [&](const char* name, std::int64_t value, std::int64_t hi, const char* bound) {
    if (value < 0 || value > hi) {
      throw InputError(strprintf("%s: attribute '%s' = %lld is out of range: must be >= 0%s (a damaged or edited "
                                 "file?)",
                                 path.c_str(), name, static_cast<long long>(value), bound));
    }
  };
  check("step", meta_.step, kMaxSteps, " and <= 2^40");
  check("samples_consumed", meta_.samples_consumed, kMaxTokens, " and <= 2^62");
  // Skipped steps (train.skip_nonfinite) advance the step but not the optimizer.
  check("optimizer_step", meta_.optimizer_step, meta_.step, " and <= step");
  meta_.seed = static_cast<std::uint64_t>(h5::attr_int(file_, path, "seed"));
  meta_.deck = h5::attr_string(file_, path, "deck");
  meta_.layout = h5::attr_string(file_, path, "layout");
  meta_.model = h5::attr_string(file_, path, "model");
  // Written since lamina recorded it; 0 in older files.
  if (h5::has_attr(file_, "data_tokens")) meta_.data_tokens = std::max<std::int64_t>(0, h5::attr_int(file_, path, "data_tokens"));
}

std::vector<std::int64_t> CheckpointReader::shape(const std::string& name) const {
  if (!h5::exists(file_, name)) throw InputError(path_ + ": no dataset '" + name + "'");
  return h5::shape(file_, path_, name);
}

void CheckpointReader::read(const TensorSlab& s) {
  const auto shape = h5::shape(file_, path_, s.name);
  if (shape != s.global_shape) {
    throw InputError(path_ + ": tensor '" + s.name + "' has shape " + shape_string(shape) + ", the model needs " +
                     shape_string(s.global_shape) + " (was it written by a different model configuration?)");
  }
  if (!h5::has_checksum(file_, s.name)) ++unchecked_;
  h5::read_slab(file_, path_, s.name, s.pieces, s.local_shape, s.data);
  if (s.pieces.empty()) return;
  // A NaN or an infinity would train on silently until the loss diverges.
  std::int64_t n = 1, bad = 0;
  for (const auto d : s.local_shape) n *= d;
  for (std::int64_t i = 0; i < n; ++i) bad += std::isfinite(s.data[i]) ? 0 : 1;
  if (bad > 0) {
    throw InputError(strprintf("%s: tensor '%s' holds %lld value(s) that are not finite (NaN or infinite); use "
                               "another checkpoint",
                               path_.c_str(), s.name.c_str(), static_cast<long long>(bad)));
  }
}

}  // namespace lamina
