#include "lamina/io/reference_file.hpp"

#include <mpi.h>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/io/hdf5_file.hpp"

namespace lamina {

namespace {

std::int64_t numel(const std::vector<std::int64_t>& s) {
  std::int64_t n = 1;
  for (const auto d : s) n *= d;
  return n;
}

void expect_shape(const ReferenceFile& ref, hid_t f, const std::string& name, const std::vector<std::int64_t>& want) {
  const auto got = h5::shape(f, ref.path, name);
  if (got != want) {
    throw InputError(ref.path + ": dataset '" + name + "' has shape " + shape_string(got) + ", expected " +
                     shape_string(want));
  }
}

}  // namespace

ReferenceFile read_reference_header(const std::string& path) {
  h5::Id f = h5::open_read(path, MPI_COMM_SELF);
  ReferenceFile r;
  r.path = path;
  auto positive = [&](const char* name) {
    const std::int64_t v = h5::attr_int(f, path, name);
    if (v < 1) throw InputError(path + ": attribute '" + std::string(name) + "' must be positive");
    return v;
  };
  r.model.layers = positive("layers");
  r.model.d_model = positive("d_model");
  r.model.heads = positive("heads");
  r.model.seq_len = positive("seq");
  r.model.vocab_size = positive("vocab");
  if (r.model.d_model % r.model.heads != 0) throw InputError(path + ": d_model is not divisible by heads");
  r.batch = positive("batch");
  r.lr = h5::attr_double(f, path, "lr");
  r.beta1 = h5::attr_double(f, path, "beta1");
  r.beta2 = h5::attr_double(f, path, "beta2");
  r.eps = h5::attr_double(f, path, "eps");
  r.weight_decay = h5::attr_double(f, path, "weight_decay");
  r.adam_step = h5::has_attr(f, "adam_step") ? h5::attr_int(f, path, "adam_step") : 1;
  const std::vector<std::int64_t> bt = {r.batch, r.model.seq_len};
  expect_shape(r, f, "x", bt);
  expect_shape(r, f, "y", bt);
  r.x.resize(static_cast<std::size_t>(numel(bt)));
  r.y.resize(r.x.size());
  h5::read(f, path, "x", r.x.data());
  h5::read(f, path, "y", r.y.data());
  for (std::size_t i = 0; i < r.x.size(); ++i) {
    if (r.x[i] < 0 || r.x[i] >= r.model.vocab_size || r.y[i] < 0 || r.y[i] >= r.model.vocab_size) {
      throw InputError(path + ": token " + std::to_string(i) + " of x or y is outside the vocabulary");
    }
  }
  expect_shape(r, f, "loss", {});
  h5::read(f, path, "loss", &r.loss);
  return r;
}

void read_reference_tensors(ReferenceFile& ref,
                            const std::vector<std::pair<std::string, std::vector<std::int64_t>>>& expected) {
  h5::Id f = h5::open_read(ref.path, MPI_COMM_SELF);
  for (const auto& [name, shape] : expected) {
    ReferenceTensor t;
    t.shape = shape;
    const auto n = static_cast<std::size_t>(numel(shape));
    t.weight.resize(n);
    t.grad.resize(n);
    t.updated.resize(n);
    expect_shape(ref, f, name, shape);
    expect_shape(ref, f, "grad/" + name, shape);
    expect_shape(ref, f, "updated/" + name, shape);
    h5::read(f, ref.path, name, t.weight.data());
    h5::read(f, ref.path, "grad/" + name, t.grad.data());
    h5::read(f, ref.path, "updated/" + name, t.updated.data());
    ref.tensors[name] = std::move(t);
  }
}

}  // namespace lamina
