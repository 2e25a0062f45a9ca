# Spack recipe for lamina, for Spack 1.x and its builtin packages (spack/spack-packages, the
# only home of the Kokkos 5 and CUDA 13 recipes). spack/ is a Package API v1 repository
# (repo.yaml beside packages/), so `from spack.package import *` is the only import: Spack
# puts the build-system classes (CMakePackage, CudaPackage, ROCmPackage) in v1 recipes' scope.

from spack.package import *


class Lamina(CMakePackage, CudaPackage, ROCmPackage):
    """GPT training in C++ on Kokkos: one source for CPUs (OpenMP) and GPUs (CUDA, HIP),
    with MPI, parallel-HDF5 checkpoints and TOML run decks."""

    homepage = "https://github.com/lamina-hpc/lamina"
    git = "https://github.com/lamina-hpc/lamina.git"

    # No release tarballs yet. To build a local clone instead of fetching this branch, run
    # `spack dev-build lamina@main` inside it (or `spack develop lamina@main` in an environment).
    version("main", branch="main")

    variant("openmp", default=True, description="Run host kernels on Kokkos' OpenMP backend")
    variant("nccl", default=False, description="Build the NCCL communicator backend (CUDA only)")
    # Host builds only: device builds' products run on cuBLAS / rocBLAS.
    variant(
        "onednn",
        default=True,
        when="~cuda~rocm",
        description="bf16 runs' products on oneDNN where the CPU has bf16 instructions (AVX512_BF16, AMX)",
    )

    variant(
        "safetensors",
        default=True,
        description="Read and write HuggingFace safetensors weights (lamina convert, model.init)",
    )

    conflicts("+nccl", when="~cuda", msg="NCCL is NVIDIA's library: it needs +cuda")
    conflicts("+cuda", when="+rocm", msg="Kokkos builds one device backend: CUDA or ROCm")
    # CudaPackage allows cuda_arch=none; Kokkos needs exactly one architecture to build for.
    conflicts("cuda_arch=none", when="+cuda", msg="Name the GPU: cuda_arch=<one value>")

    depends_on("c", type="build")  # project(lamina LANGUAGES C CXX)
    depends_on("cxx", type="build")
    depends_on("cmake@3.16:", type="build")

    # Kokkos 4 builds as C++17 and Kokkos 5 as C++20; lamina's sources compile as both.
    depends_on("kokkos@4:5")
    depends_on("kokkos-kernels@4:5")
    # Kokkos Kernels works with the Kokkos of its own minor version; some releases of its
    # recipe do not say so, and the solver then paired kokkos-kernels 4.7 with kokkos 4.2.
    for minor in ("4.0", "4.1", "4.2", "4.3", "4.4", "4.5", "4.6", "4.7", "5.0"):
        depends_on(f"kokkos@{minor}", when=f"^kokkos-kernels@{minor}")
    depends_on("kokkos+openmp", when="+openmp")
    depends_on("kokkos-kernels+execspace_openmp", when="+openmp")
    depends_on("kokkos-kernels+execspace_serial", when="~openmp")

    # GEMMs go through KokkosBlas: on the host through Kokkos Kernels' BLAS TPL (OpenBLAS
    # unless packages.yaml picks another provider). lamina also links that BLAS itself: with
    # OpenBLAS and +openmp it calls sgemm_ in one tile per Kokkos thread, OpenBLAS set to one
    # thread, so that one thread pool owns the cores. Hence the direct edge: one provider for both.
    depends_on("kokkos-kernels+blas")
    depends_on("blas")

    with when("+cuda"):
        # Kokkos' nvcc_wrapper is lamina's C++ compiler in CUDA builds (see cmake_args).
        depends_on("kokkos+cuda+wrapper")
        # Kokkos 5 always has device lambdas and no longer has this variant. A requirement,
        # not a dependency: a depends_on("kokkos...") conditioned on ^kokkos refers to itself
        # (`spack audit packages` rejects it).
        requires("^kokkos+cuda_lambda", when="^kokkos@:4")
        # Kokkos builds with CUDA 13 from 4.7.01 on (its recipe conflicts with it up to 4.7.0).
        depends_on("kokkos@4.7.01:", when="^cuda@13:")
        # cuBLAS for device GEMMs; pre-instantiate Kokkos Kernels for Cuda as its own CMake
        # default would (spack's recipe turns the instantiation off unless asked).
        depends_on("kokkos-kernels+cublas+execspace_cuda+memspace_cudaspace")
        # Kokkos takes a single cuda_arch, so a lamina built for several has no solution.
        for arch in CudaPackage.cuda_arch_values:
            depends_on(f"kokkos cuda_arch={arch}", when=f"cuda_arch={arch}")
            depends_on(f"nccl cuda_arch={arch}", when=f"+nccl cuda_arch={arch}")

    with when("+rocm"):
        depends_on("kokkos+rocm")
        # Left alone, the solver picks Kokkos 4.2 here, only because its recipe adds rocthrust
        # to the build from 4.3 on. 4.6 is the oldest Kokkos lamina's device path has been
        # built and run with (CUDA, on an H100).
        depends_on("kokkos@4.6:")
        depends_on("kokkos-kernels+rocblas")
        # Kokkos takes a single amdgpu_target, like cuda_arch above.
        for target in ROCmPackage.amdgpu_targets:
            depends_on(f"kokkos amdgpu_target={target}", when=f"amdgpu_target={target}")

    depends_on("mpi")
    # Checkpoints are written collectively: CMake stops unless HDF5_IS_PARALLEL. HDF5 2's
    # CMake package reports MPI as HDF5_PROVIDES_PARALLEL instead, so stay on 1.x for now.
    # 1.10.2 is the first to write checksummed (filtered) datasets in parallel.
    depends_on("hdf5@1.10.2:1+mpi")
    depends_on("tomlplusplus@3:")
    depends_on("cli11@2:")
    depends_on("nccl", when="+nccl")
    # lamina compiles against oneDNN 2 and 3 (their matmul APIs differ; both are handled) and
    # runs its products on the calling OpenMP pool: oneDNN's OpenMP runtime, not TBB's.
    depends_on("onednn@2.6: cpu_runtime=omp", when="+onednn")
    # The JSON of safetensors headers, their indexes and config.json; header-only.
    depends_on("nlohmann-json@3.2:", when="+safetensors")
    # Only for `spack install --test=root`, which also turns LAMINA_ENABLE_TESTS on.
    depends_on("googletest@1.12:", type="test")

    sanity_check_is_file = [join_path("bin", "lamina")]
    sanity_check_is_dir = [join_path("share", "lamina", "inputs")]

    def setup_build_environment(self, env: EnvironmentModifications) -> None:
        # lamina's CMake looks for nccl.h and libnccl under $NCCL_HOME.
        if self.spec.satisfies("+nccl"):
            env.set("NCCL_HOME", self.spec["nccl"].prefix)

    def cmake_args(self):
        spec = self.spec
        args = [
            # Spack's compiler wrappers already add the flags for the spec's target;
            # -march=native would tie the binary to the build host instead.
            self.define("LAMINA_NATIVE_ARCH", False),
            self.define_from_variant("LAMINA_ENABLE_NCCL", "nccl"),
            # ON or OFF, never AUTO: a oneDNN outside the spec must not be picked up.
            self.define("LAMINA_ENABLE_ONEDNN", spec.satisfies("+onednn")),
            self.define("LAMINA_ENABLE_JSON", spec.satisfies("+safetensors")),
            self.define("LAMINA_ENABLE_TESTS", self.run_tests),
            # Kokkos' C++ standard: 17 for Kokkos 4 by default, 20 for Kokkos 5.
            self.define("CMAKE_CXX_STANDARD", spec["kokkos"].variants["cxxstd"].value),
        ]

        # Compile with the compiler Kokkos was configured for: nvcc_wrapper for CUDA (plain
        # g++ cannot compile device lambdas), hipcc for HIP unless Kokkos used a clang that
        # targets AMD GPUs itself.
        if spec.satisfies("^kokkos+cuda"):
            args.append(self.define("CMAKE_CXX_COMPILER", self["kokkos"].kokkos_cxx))
        elif spec.satisfies("^kokkos+rocm") and not (
            spec.satisfies("^kokkos %cxx=clang") or spec.satisfies("^kokkos %cxx=rocmcc")
        ):
            args.append(self.define("CMAKE_CXX_COMPILER", spec["hip"].hipcc))

        return args
