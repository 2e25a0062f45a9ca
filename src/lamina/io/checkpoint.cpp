#include "lamina/io/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/io/hdf5_file.hpp"

namespace lamina {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "lamina-checkpoint-1";

int rank_of(MPI_Comm comm) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + ")";
}

}  // namespace

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0 && name.size() > 8 && name.substr(name.size() - 3) == ".h5") {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());  // zero-padded step numbers sort in step order
  return out;
}

std::string write_checkpoint(const std::string& dir, const CheckpointMeta& meta, const std::vector<TensorSlab>& slabs,
                             std::int64_t keep, MPI_Comm comm) {
  const int rank = rank_of(comm);
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw RunError(dir + ": cannot create the checkpoint directory: " + ec.message());
  }
  MPI_Barrier(comm);
  const std::string final_path = dir + "/" + strprintf("step_%08lld.h5", static_cast<long long>(meta.step));
  const std::string tmp_path = final_path + ".tmp";
  {
    h5::Id file = h5::create(tmp_path, comm);
    h5::set_attr(file, "format", std::string(kFormat));
    h5::set_attr(file, "step", meta.step);
    h5::set_attr(file, "samples_consumed", meta.samples_consumed);
    h5::set_attr(file, "optimizer_step", meta.optimizer_step);
    h5::set_attr(file, "seed", static_cast<std::int64_t>(meta.seed));
    h5::set_attr(file, "deck", meta.deck);
    h5::set_attr(file, "layout", meta.layout);
    h5::set_attr(file, "model", meta.model);
    for (const auto& s : slabs) h5::write_floats(file, s.name, s.global_shape, s.data, s.offset, s.count);
    h5::close(file, tmp_path);
  }
  MPI_Barrier(comm);
  if (rank == 0) {
    fsync_path(tmp_path);
    if (std::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
      throw RunError(tmp_path + ": cannot rename to " + final_path);
    }
    const std::string latest = dir + "/latest", latest_tmp = latest + ".tmp";
    {
      std::ofstream out(latest_tmp, std::ios::trunc);
      out << fs::path(final_path).filename().string() << "\n";
      if (!out) throw RunError(latest_tmp + ": cannot write");
    }
    fsync_path(latest_tmp);
    if (std::rename(latest_tmp.c_str(), latest.c_str()) != 0) throw RunError(latest + ": cannot replace");
    fsync_path(dir);
    auto all = list_checkpoints(dir);
    for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < all.size(); ++i) {
      std::error_code ec;
      fs::remove(all[i], ec);
    }
  }
  MPI_Barrier(comm);
  return final_path;
}

std::string resolve_checkpoint(const std::string& resume, const std::string& dir) {
  if (resume != "latest") {
    if (!fs::exists(resume)) throw InputError("checkpoint.resume: " + resume + ": no such file");
    return resume;
  }
  const std::string latest = dir + "/latest";
  std::ifstream in(latest);
  std::string name;
  if (!in || !std::getline(in, name) || name.empty()) {
    throw InputError("checkpoint.resume = \"latest\": " + latest +
                     " is missing or empty (no checkpoint was completed in " + dir + ")");
  }
  const std::string path = dir + "/" + name;
  if (!fs::exists(path)) throw InputError(latest + " names " + name + ", which does not exist");
  return path;
}

CheckpointMeta read_checkpoint_meta(const std::string& path, MPI_Comm comm) {
  h5::Id file = h5::open_read(path, comm);
  if (!h5::has_attr(file, "format") || h5::attr_string(file, path, "format") != kFormat) {
    throw InputError(path + ": not a lamina checkpoint (attribute format != \"" + std::string(kFormat) + "\")");
  }
  CheckpointMeta m;
  m.step = h5::attr_int(file, path, "step");
  m.samples_consumed = h5::attr_int(file, path, "samples_consumed");
  m.optimizer_step = h5::attr_int(file, path, "optimizer_step");
  m.seed = static_cast<std::uint64_t>(h5::attr_int(file, path, "seed"));
  m.deck = h5::attr_string(file, path, "deck");
  m.layout = h5::attr_string(file, path, "layout");
  m.model = h5::attr_string(file, path, "model");
  return m;
}

void read_checkpoint_tensors(const std::string& path, const std::vector<TensorSlab>& slabs, MPI_Comm comm) {
  h5::Id file = h5::open_read(path, comm);
  for (const auto& s : slabs) {
    const auto shape = h5::shape(file, path, s.name);
    if (shape != s.global_shape) {
      throw InputError(path + ": tensor '" + s.name + "' has shape " + shape_str(shape) + ", the model needs " +
                       shape_str(s.global_shape) + " (was it written by a different model configuration?)");
    }
    h5::read(file, path, s.name, s.data, s.offset, s.count);
  }
}

}  // namespace lamina
