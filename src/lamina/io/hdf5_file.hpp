#pragma once
// Thin RAII wrappers over HDF5's C API for what lamina stores: float/double/int32
// datasets in global shapes, read and written as hyperslabs, and scalar attributes.
// Files are opened through the MPI-IO driver on a communicator, so every rank of a job
// reads and writes its own slab of the same file (all metadata calls are collective).
#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lamina::h5 {

class Id {
 public:
  Id() = default;
  Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  Id(Id&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Id& operator=(Id&& o) noexcept;
  ~Id() { reset(); }
  void reset();
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// Opening a file that is missing, truncated or not HDF5 throws InputError naming it.
Id open_read(const std::string& path, MPI_Comm comm);
Id create(const std::string& path, MPI_Comm comm);
void flush(hid_t file, const std::string& path);  // a failure is a RunError
void close(Id& file, const std::string& path);  // flushes; a failure is a RunError

// Whether closing a file has failed (its writes did not reach the disk). HDF5 1.10 then
// keeps the freed file's identifier and crashes closing it again when it shuts down at
// MPI_Finalize: the process must end without that (MPI_Abort) to keep its exit code.
bool file_close_failed();

// Before any other HDF5 call: HDF5 shuts down with MPI (at MPI_Finalize), not again in an
// exit handler, which an MPI that ends the process through exit() (MPICH's MPI_Abort) runs
// after MPI is gone, crashing on the file whose close failed.
void shut_down_with_mpi();

bool exists(hid_t file, const std::string& name);  // also checks intermediate groups
std::vector<std::int64_t> shape(hid_t file, const std::string& path, const std::string& name);

// Hyperslab [offset, offset + count) of a dataset, converted to the memory type.
// Empty offset/count: the whole dataset.
void read(hid_t file, const std::string& path, const std::string& name, float* out,
          const std::vector<std::int64_t>& offset = {}, const std::vector<std::int64_t>& count = {});
void read(hid_t file, const std::string& path, const std::string& name, double* out,
          const std::vector<std::int64_t>& offset = {}, const std::vector<std::int64_t>& count = {});
void read(hid_t file, const std::string& path, const std::string& name, std::int32_t* out,
          const std::vector<std::int64_t>& offset = {}, const std::vector<std::int64_t>& count = {});

// Part of a dataset: a rectangle at `offset` of extent `count`, and where it sits in the
// rank's local array (empty: the pieces, taken in row-major order of the file, fill that
// array exactly).
struct Hyperslab {
  std::vector<std::int64_t> offset, count, local_offset;
};

// Creates a float32 dataset of the global shape (collective: every rank, same order) and
// writes this rank's pieces from `data`, a row-major array of `local_shape`. No pieces: the rank takes
// part without writing. `path` names the file in errors. The dataset is chunked with a
// Fletcher32 checksum per chunk (HDF5 writes filtered datasets collectively since 1.10.2).
void write_slab(hid_t file, const std::string& path, const std::string& name,
                const std::vector<std::int64_t>& global_shape, const std::vector<Hyperslab>& pieces,
                const std::vector<std::int64_t>& local_shape, const float* data);
// The converse read (collective); `path` names the file in errors. HDF5 verifies the
// checksums of the chunks it reads: a mismatch is an InputError saying so.
void read_slab(hid_t file, const std::string& path, const std::string& name, const std::vector<Hyperslab>& pieces,
               const std::vector<std::int64_t>& local_shape, float* data);
// Whether the dataset carries a Fletcher32 checksum (files written before it did not).
bool has_checksum(hid_t file, const std::string& name);

bool has_attr(hid_t file, const std::string& name);
std::int64_t attr_int(hid_t file, const std::string& path, const std::string& name);
double attr_double(hid_t file, const std::string& path, const std::string& name);
std::string attr_string(hid_t file, const std::string& path, const std::string& name);
void set_attr(hid_t file, const std::string& name, std::int64_t value);
void set_attr(hid_t file, const std::string& name, double value);
void set_attr(hid_t file, const std::string& name, const std::string& value);

}  // namespace lamina::h5
