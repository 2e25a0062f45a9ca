#include "lamina/io/hdf5_file.hpp"

#include <unistd.h>

#include <algorithm>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"

// Checkpoints are checksummed (filtered) datasets written collectively from many ranks.
#if !H5_VERSION_GE(1, 10, 2)
#error "lamina needs HDF5 1.10.2 or newer, the first to write filtered datasets in parallel"
#endif

namespace lamina::h5 {

namespace {

bool close_failed = false;

// MPI-IO does not say why a write failed (errno is not kept), only that it did.
constexpr const char* kWriteFailed = "the file system refused the write (disk full or quota exceeded?)";

// Whether the error HDF5 has just reported is a checksum that does not match.
bool checksum_failed() {
  bool found = false;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* client) -> herr_t {
        if (e->desc != nullptr && std::string(e->desc).find("checksum") != std::string::npos) {
          *static_cast<bool*>(client) = true;
        }
        return 0;
      },
      &found);
  return found;
}

// After a failed read of `what` ("dataset 'x'"): a checksum mismatch is named as such.
[[noreturn]] void unreadable(const std::string& path, const std::string& what) {
  if (checksum_failed()) {
    throw InputError(path + ": " + what + " does not match its checksum: the file was damaged after it was written "
                     "(a disk or transfer error)");
  }
  throw InputError(path + ": cannot read " + what + " (truncated or corrupt file?)");
}

Id open_dataset(hid_t file, const std::string& path, const std::string& name) {
  Id ds(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) {
    if (checksum_failed()) unreadable(path, "dataset '" + name + "'");
    throw InputError(path + ": dataset '" + name + "' is missing");
  }
  return ds;
}

// HDF5 prints its error stack by default; lamina reports errors itself, with context.
void quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

Id file_access(MPI_Comm comm) {
  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
  // Metadata operations collective, as the HDF Group recommends for parallel files.
  H5Pset_all_coll_metadata_ops(fapl, true);
  H5Pset_coll_metadata_write(fapl, true);
  return fapl;
}

template <class T>
void read_impl(hid_t file, const std::string& path, const std::string& name, hid_t memtype, T* out,
               const std::vector<std::int64_t>& offset, const std::vector<std::int64_t>& count) {
  Id ds = open_dataset(file, path, name);
  Id space(H5Dget_space(ds), H5Sclose);
  Id mem;
  if (!offset.empty()) {
    std::vector<hsize_t> off(offset.begin(), offset.end()), cnt(count.begin(), count.end());
    H5Sselect_hyperslab(space, H5S_SELECT_SET, off.data(), nullptr, cnt.data(), nullptr);
    mem = Id(H5Screate_simple(static_cast<int>(cnt.size()), cnt.data(), nullptr), H5Sclose);
  } else {
    mem = Id(H5Scopy(space), H5Sclose);
  }
  Id xfer(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  if (H5Dread(ds, memtype, mem, space, xfer, out) < 0) unreadable(path, "dataset '" + name + "'");
}

Id open_attr(hid_t file, const std::string& path, const std::string& name) {
  if (H5Aexists(file, name.c_str()) <= 0) throw InputError(path + ": attribute '" + name + "' is missing");
  return Id(H5Aopen(file, name.c_str(), H5P_DEFAULT), H5Aclose);
}

}  // namespace

Id& Id::operator=(Id&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    close_ = o.close_;
    o.id_ = -1;
  }
  return *this;
}

void Id::reset() {
  if (id_ >= 0 && close_ != nullptr && close_(id_) < 0 && close_ == &H5Fclose) close_failed = true;
  id_ = -1;
}

bool file_close_failed() { return close_failed; }

void shut_down_with_mpi() { H5dont_atexit(); }

Id open_read(const std::string& path, MPI_Comm comm) {
  quiet();
  if (::access(path.c_str(), R_OK) != 0) throw InputError(path + ": no such file (or not readable)");
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    throw InputError(path + ": not an HDF5 file (truncated, or written by something else)");
  }
  Id fapl = file_access(comm);
  Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), H5Fclose);
  if (!f.valid()) throw InputError(path + ": cannot open as HDF5 (truncated or corrupt file?)");
  return f;
}

Id create(const std::string& path, MPI_Comm comm) {
  quiet();
  Id fapl = file_access(comm);
  // The 1.10 file format checksums the metadata too (superblock, object headers, chunk
  // indexes): a damaged index cannot hand a reader another chunk that passes its own check.
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110);
  Id f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), H5Fclose);
  if (!f.valid()) throw RunError(path + ": cannot create the file (directory missing or not writable?)");
  return f;
}

void flush(hid_t file, const std::string& path) {
  if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0) throw RunError("cannot write " + path + ": " + kWriteFailed);
}

void close(Id& file, const std::string& path) {
  flush(file, path);
  file.reset();
}

bool exists(hid_t file, const std::string& name) {
  std::size_t pos = 0;
  while (true) {
    pos = name.find('/', pos + 1);
    const std::string prefix = name.substr(0, pos);
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (pos == std::string::npos) return true;
  }
}

std::vector<std::int64_t> shape(hid_t file, const std::string& path, const std::string& name) {
  if (!exists(file, name)) throw InputError(path + ": dataset '" + name + "' is missing");
  Id ds(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) {
    if (checksum_failed()) unreadable(path, "dataset '" + name + "'");
    throw InputError(path + ": '" + name + "' is not a dataset");
  }
  Id space(H5Dget_space(ds), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank > 0 ? rank : 0));
  if (rank > 0) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return std::vector<std::int64_t>(dims.begin(), dims.end());
}

void read(hid_t file, const std::string& path, const std::string& name, float* out,
          const std::vector<std::int64_t>& offset, const std::vector<std::int64_t>& count) {
  read_impl(file, path, name, H5T_NATIVE_FLOAT, out, offset, count);
}
void read(hid_t file, const std::string& path, const std::string& name, double* out,
          const std::vector<std::int64_t>& offset, const std::vector<std::int64_t>& count) {
  read_impl(file, path, name, H5T_NATIVE_DOUBLE, out, offset, count);
}
void read(hid_t file, const std::string& path, const std::string& name, std::int32_t* out,
          const std::vector<std::int64_t>& offset, const std::vector<std::int64_t>& count) {
  read_impl(file, path, name, H5T_NATIVE_INT32, out, offset, count);
}

namespace {

// Chunks of up to 2^20 elements (4 MiB), whole rows first: few chunks to index, and a
// reader of a slice reads little more than the slice. Along each dimension the chunks
// are made equal, since HDF5 stores an edge chunk whole (8192 rows in chunks of 1365
// would store 7 x 1365; in chunks of 1171, 7 x 1171).
std::vector<hsize_t> chunk_dims(const std::vector<hsize_t>& dims) {
  std::vector<hsize_t> chunk(dims.size());
  hsize_t budget = hsize_t(1) << 20;
  for (std::size_t i = dims.size(); i-- > 0;) {
    const hsize_t most = std::max<hsize_t>(1, std::min(dims[i], budget));
    const hsize_t n = (dims[i] + most - 1) / most;
    chunk[i] = std::max<hsize_t>(1, (dims[i] + n - 1) / n);
    budget = std::max<hsize_t>(1, budget / chunk[i]);
  }
  return chunk;
}

// The union of the pieces in the file, and the whole local array in memory.
void select(hid_t file_space, Id& mem_space, const std::vector<Hyperslab>& pieces,
            const std::vector<std::int64_t>& local_shape) {
  std::vector<hsize_t> local(local_shape.begin(), local_shape.end());
  if (local.empty()) local.push_back(1);
  mem_space = Id(H5Screate_simple(static_cast<int>(local.size()), local.data(), nullptr), H5Sclose);
  if (pieces.empty()) {
    H5Sselect_none(file_space);
    H5Sselect_none(mem_space);
    return;
  }
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const H5S_seloper_t op = i == 0 ? H5S_SELECT_SET : H5S_SELECT_OR;
    std::vector<hsize_t> off(pieces[i].offset.begin(), pieces[i].offset.end());
    std::vector<hsize_t> cnt(pieces[i].count.begin(), pieces[i].count.end());
    H5Sselect_hyperslab(file_space, op, off.data(), nullptr, cnt.data(), nullptr);
    if (!pieces[i].local_offset.empty()) {
      std::vector<hsize_t> at(pieces[i].local_offset.begin(), pieces[i].local_offset.end());
      H5Sselect_hyperslab(mem_space, op, at.data(), nullptr, cnt.data(), nullptr);
    }
  }
}

}  // namespace

void write_slab(hid_t file, const std::string& path, const std::string& name,
                const std::vector<std::int64_t>& global_shape, const std::vector<Hyperslab>& pieces,
                const std::vector<std::int64_t>& local_shape, const float* data) {
  std::vector<hsize_t> dims(global_shape.begin(), global_shape.end());
  Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl, 1);
  // A Fletcher32 checksum per chunk, which HDF5 verifies on every read.
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  const std::vector<hsize_t> chunk = chunk_dims(dims);
  H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
  H5Pset_fletcher32(dcpl);
  Id ds(H5Dcreate2(file, name.c_str(), H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) throw RunError("cannot write " + path + " (creating dataset '" + name + "'): " + kWriteFailed);
  Id mem;
  select(space, mem, pieces, local_shape);
  Id xfer(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(xfer, H5FD_MPIO_COLLECTIVE);
  if (H5Dwrite(ds, H5T_NATIVE_FLOAT, mem, space, xfer, data) < 0) {
    throw RunError("cannot write " + path + " (dataset '" + name + "'): " + kWriteFailed);
  }
}

void read_slab(hid_t file, const std::string& path, const std::string& name, const std::vector<Hyperslab>& pieces,
               const std::vector<std::int64_t>& local_shape, float* data) {
  Id ds = open_dataset(file, path, name);
  Id space(H5Dget_space(ds), H5Sclose);
  Id mem;
  select(space, mem, pieces, local_shape);
  Id xfer(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(xfer, H5FD_MPIO_COLLECTIVE);
  if (H5Dread(ds, H5T_NATIVE_FLOAT, mem, space, xfer, data) < 0) unreadable(path, "dataset '" + name + "'");
}

bool has_checksum(hid_t file, const std::string& name) {
  Id ds(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) return false;
  Id dcpl(H5Dget_create_plist(ds), H5Pclose);
  const int n = H5Pget_nfilters(dcpl);
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0;
    std::size_t nvalues = 0;
    if (H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &nvalues, nullptr, 0, nullptr, nullptr) ==
        H5Z_FILTER_FLETCHER32) {
      return true;
    }
  }
  return false;
}

bool has_attr(hid_t file, const std::string& name) { return H5Aexists(file, name.c_str()) > 0; }

std::int64_t attr_int(hid_t file, const std::string& path, const std::string& name) {
  Id a = open_attr(file, path, name);
  long long v = 0;
  if (H5Aread(a, H5T_NATIVE_LLONG, &v) < 0) throw InputError(path + ": attribute '" + name + "' is not an integer");
  return v;
}

double attr_double(hid_t file, const std::string& path, const std::string& name) {
  Id a = open_attr(file, path, name);
  double v = 0;
  if (H5Aread(a, H5T_NATIVE_DOUBLE, &v) < 0) throw InputError(path + ": attribute '" + name + "' is not a number");
  return v;
}

std::string attr_string(hid_t file, const std::string& path, const std::string& name) {
  Id a = open_attr(file, path, name);
  Id type(H5Aget_type(a), H5Tclose);
  if (H5Tget_class(type) != H5T_STRING) throw InputError(path + ": attribute '" + name + "' is not a string");
  if (H5Tis_variable_str(type) > 0) {
    Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem, H5T_VARIABLE);
    char* s = nullptr;
    if (H5Aread(a, mem, &s) < 0 || s == nullptr) throw InputError(path + ": cannot read attribute '" + name + "'");
    std::string out(s);
    H5free_memory(s);
    return out;
  }
  const std::size_t n = H5Tget_size(type);
  std::string out(n, '\0');
  Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mem, n);
  if (H5Aread(a, mem, out.data()) < 0) throw InputError(path + ": cannot read attribute '" + name + "'");
  while (!out.empty() && out.back() == '\0') out.pop_back();
  return out;
}

void set_attr(hid_t file, const std::string& name, std::int64_t value) {
  Id space(H5Screate(H5S_SCALAR), H5Sclose);
  Id a(H5Acreate2(file, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  const long long v = value;
  H5Awrite(a, H5T_NATIVE_LLONG, &v);
}

void set_attr(hid_t file, const std::string& name, double value) {
  Id space(H5Screate(H5S_SCALAR), H5Sclose);
  Id a(H5Acreate2(file, name.c_str(), H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  H5Awrite(a, H5T_NATIVE_DOUBLE, &value);
}

void set_attr(hid_t file, const std::string& name, const std::string& value) {
  Id space(H5Screate(H5S_SCALAR), H5Sclose);
  Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, value.size() + 1);
  H5Tset_strpad(type, H5T_STR_NULLTERM);
  Id a(H5Acreate2(file, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  H5Awrite(a, type, value.c_str());
}

}  // namespace lamina::h5
