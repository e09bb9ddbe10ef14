// A 2:4 sparse Linear for sm90 GPUs (H100, H200) on CUTLASS's SM90 sparse GEMM, with the bias and an optional
// exact GELU fused into its epilogue, reading and writing activations row-major (tokens x features), as a BERT
// layer does.
//
// Why: cuSPARSELt 0.8-0.10 has no bf16 GELU epilogue and, with row-major activations in and out, its 2:4 matmul
// is at best even with dense on BERT's shapes; this kernel is faster than dense there (bench/cutlass_layers.py,
// docs/performance.md).
//
// The product is y = act(x W^T + b) with W (out x in) 2:4 along `in`. CUTLASS's SM90 sparse GEMM takes only the
// A operand sparse, so it computes D = W x^T: A = W (M = out, K-major), B = x (N = tokens, K-major), and D is
// written M-major, which is y stored row-major. The bias is one value per row of D (per output feature).
//
// Exposed through a C ABI for ctypes (sparsebert/export/sparse24_kernel.py): no torch headers, so one build
// serves any torch. Built by `python -m sparsebert.kernels.build`.

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/transform/device/transform_universal_adapter.hpp"
#include "cutlass/transform/kernel/sparse_gemm_compressor.hpp"
#include "cutlass/util/packed_stride.hpp"

using namespace cute;

namespace {

using Element = cutlass::bfloat16_t;
using Accumulator = float;
using ProblemShape = Shape<int, int, int, int>;  // M, N, K, L
constexpr int kAlignment = 128 / cutlass::sizeof_bits<Element>::value;  // 16-byte accesses

char g_error[512] = "";

int fail(const char* what, const char* detail) {
  std::snprintf(g_error, sizeof(g_error), "%s: %s", what, detail);
  return 1;
}

template <template <class> class Activation, class Tile, class Cluster, class MainloopSchedule, class EpilogueSchedule>
struct SparseLinear {
  using Fusion = cutlass::epilogue::fusion::LinCombPerRowBiasEltAct<Activation, Element, Accumulator, Element>;

  // ElementC void: there is no source matrix, only the bias.
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassSparseTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, Accumulator, Accumulator,
      void, cutlass::layout::ColumnMajor, kAlignment,
      Element, cutlass::layout::ColumnMajor, kAlignment,
      EpilogueSchedule, Fusion>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassSparseTensorOp,
      Element, cutlass::layout::RowMajor, kAlignment,
      Element, cutlass::layout::ColumnMajor, kAlignment,
      Accumulator, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using SparseConfig = typename CollectiveMainloop::SparseConfig;

  static typename Gemm::Arguments arguments(const void* a_compressed, const void* metadata, const void* x,
                                            const void* bias, void* y, int m, int n, int k) {
    ProblemShape problem{m, n, k, 1};
    auto stride_b = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(n, k, 1));
    auto stride_d = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, make_shape(m, n, 1));
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        problem,
        {static_cast<const Element*>(a_compressed), SparseConfig::fill_layoutA(problem),
         static_cast<const Element*>(x), stride_b,
         static_cast<const typename CollectiveMainloop::ElementE*>(metadata), SparseConfig::fill_layoutE(problem)},
        {{}, nullptr, stride_d, static_cast<Element*>(y), stride_d}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.thread.bias_ptr = static_cast<const Element*>(bias);
    return args;
  }

  static int64_t workspace_size(int m, int n, int k) {
    return static_cast<int64_t>(Gemm::get_workspace_size(arguments(nullptr, nullptr, nullptr, nullptr, nullptr,
                                                                   m, n, k)));
  }

  static int run(const void* a_compressed, const void* metadata, const void* x, const void* bias, void* y,
                 int m, int n, int k, void* workspace, cudaStream_t stream) {
    auto args = arguments(a_compressed, metadata, x, bias, y, m, n, k);
    Gemm gemm;
    cutlass::Status status = gemm.can_implement(args);
    if (status != cutlass::Status::kSuccess) return fail("can_implement", cutlassGetStatusString(status));
    status = gemm.run(args, workspace, stream);
    if (status != cutlass::Status::kSuccess) return fail("run", cutlassGetStatusString(status));
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return fail("launch", cudaGetErrorString(err));
    return 0;
  }
};

// The configurations tried. K is 128 logical (64 stored) in all of them, so they share one compressed layout.
using Tile128x128 = Shape<_128, _128, _128>;
using Tile128x256 = Shape<_128, _256, _128>;
using Tile256x128 = Shape<_256, _128, _128>;
using Tile64x128 = Shape<_64, _128, _128>;
using Cluster1x1 = Shape<_1, _1, _1>;
using Cluster1x2 = Shape<_1, _2, _1>;
using Cluster2x1 = Shape<_2, _1, _1>;
// A kernel schedule and the epilogue schedule that goes with it.
struct Cooperative {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
struct Pingpong {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
};

template <template <class> class Act, class Tile, class Cluster, class Schedule>
using Linear = SparseLinear<Act, Tile, Cluster, typename Schedule::Mainloop, typename Schedule::Epilogue>;

// One compressed layout serves every configuration (config() checks each against this one); the compressor
// writes it.
using Reference = Linear<cutlass::epilogue::thread::Identity, Tile128x128, Cluster1x2, Cooperative>;

using WorkspaceFn = int64_t (*)(int, int, int);
using RunFn = int (*)(const void*, const void*, const void*, const void*, void*, int, int, int, void*, cudaStream_t);

struct Config {
  const char* name;
  WorkspaceFn workspace[2];  // [identity, gelu]
  RunFn run[2];
};

template <class Tile, class Cluster, class Schedule>
constexpr Config config(const char* name) {
  using Identity = Linear<cutlass::epilogue::thread::Identity, Tile, Cluster, Schedule>;
  using Gelu = Linear<cutlass::epilogue::thread::GELU, Tile, Cluster, Schedule>;
  static_assert(std::is_same_v<typename Identity::SparseConfig, typename Reference::SparseConfig> &&
                    std::is_same_v<typename Gelu::SparseConfig, typename Reference::SparseConfig>,
                "every configuration must read the one compressed layout");
  return {name, {&Identity::workspace_size, &Gelu::workspace_size}, {&Identity::run, &Gelu::run}};
}

const Config kConfigs[] = {
    config<Tile128x128, Cluster1x2, Cooperative>("coop_128x128_c1x2"),
    config<Tile128x256, Cluster1x1, Cooperative>("coop_128x256_c1x1"),
    config<Tile256x128, Cluster1x1, Cooperative>("coop_256x128_c1x1"),
    config<Tile128x256, Cluster2x1, Cooperative>("coop_128x256_c2x1"),
    config<Tile128x256, Cluster1x2, Cooperative>("coop_128x256_c1x2"),
    config<Tile256x128, Cluster2x1, Cooperative>("coop_256x128_c2x1"),
    config<Tile256x128, Cluster1x2, Cooperative>("coop_256x128_c1x2"),
    config<Tile128x128, Cluster1x1, Pingpong>("pingpong_128x128_c1x1"),
    config<Tile128x128, Cluster2x1, Pingpong>("pingpong_128x128_c2x1"),
    config<Tile128x128, Cluster1x2, Pingpong>("pingpong_128x128_c1x2"),
    config<Tile64x128, Cluster1x2, Pingpong>("pingpong_64x128_c1x2"),
};
constexpr int kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);

using Compressor = cutlass::transform::device::TransformUniversalAdapter<
    cutlass::transform::kernel::StructuredSparseCompressor<ProblemShape, Element, cutlass::layout::RowMajor,
                                                           Reference::SparseConfig, cutlass::arch::Sm90>>;
using CompressorUtility = cutlass::transform::kernel::StructuredSparseCompressorUtility<
    ProblemShape, Element, cutlass::layout::RowMajor, Reference::SparseConfig>;
using StrideA = cutlass::gemm::TagToStrideA_t<cutlass::layout::RowMajor>;

Compressor::Arguments compressor_arguments(const void* weight, void* values, void* metadata, int m, int k) {
  cutlass::KernelHardwareInfo hw_info;
  cudaGetDevice(&hw_info.device_id);
  hw_info.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw_info.device_id);
  return {ProblemShape{m, 1, k, 1},
      {static_cast<const Element*>(weight), cutlass::make_cute_packed_stride(StrideA{}, make_shape(m, k, 1)),
       static_cast<Element*>(values), static_cast<uint8_t*>(metadata)},
      {hw_info}};
}

}  // namespace

extern "C" {

// Bumped with every change to these functions' signatures or meaning: the loader refuses a build made from
// another version of this file rather than call it with the wrong arguments.
int sb24_abi_version() { return 2; }

const char* sb24_last_error() { return g_error; }

int sb24_num_configs() { return kNumConfigs; }

const char* sb24_config_name(int config) {
  return (config >= 0 && config < kNumConfigs) ? kConfigs[config].name : nullptr;
}

// Sizes, in elements of bf16 and in bytes, of the compressed weight and its metadata for an m x k weight.
int sb24_compressed_sizes(int m, int k, int64_t* values_elems, int64_t* metadata_bytes) {
  CompressorUtility utility(ProblemShape{m, 1, k, 1},
                            cutlass::make_cute_packed_stride(StrideA{}, make_shape(m, k, 1)));
  *values_elems = int64_t(utility.get_tensorA_m_physical()) * utility.get_tensorA_k_physical();
  *metadata_bytes = int64_t(utility.get_metadata_m_physical()) * utility.get_metadata_k_physical() *
                    int64_t(sizeof(typename Reference::CollectiveMainloop::ElementE));
  return 0;
}

int64_t sb24_compress_workspace_size(int m, int k) {
  return static_cast<int64_t>(
      Compressor::get_workspace_size(compressor_arguments(nullptr, nullptr, nullptr, m, k)));
}

// Compresses a row-major m x k bf16 weight that already has at most two non-zeros in every four along k.
int sb24_compress(const void* weight, void* values, void* metadata, int m, int k, void* workspace, void* stream) {
  auto args = compressor_arguments(weight, values, metadata, m, k);
  Compressor compressor;
  cutlass::Status status = compressor.can_implement(args);
  if (status != cutlass::Status::kSuccess) return fail("compress can_implement", cutlassGetStatusString(status));
  status = compressor.initialize(args, workspace, static_cast<cudaStream_t>(stream));
  if (status != cutlass::Status::kSuccess) return fail("compress initialize", cutlassGetStatusString(status));
  status = compressor.run(static_cast<cudaStream_t>(stream));
  if (status != cutlass::Status::kSuccess) return fail("compress run", cutlassGetStatusString(status));
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : fail("compress launch", cudaGetErrorString(err));
}

int64_t sb24_workspace_size(int config, int gelu, int m, int n, int k) {
  if (config < 0 || config >= kNumConfigs) {
    fail("workspace_size", "no such configuration");
    return -1;
  }
  return kConfigs[config].workspace[gelu ? 1 : 0](m, n, k);
}

// y (n x m, row-major) = act(x (n x k, row-major) W^T + bias), W given compressed; m, n, k as in D = W x^T.
int sb24_linear(int config, int gelu, const void* values, const void* metadata, const void* x, const void* bias,
                void* y, int m, int n, int k, void* workspace, void* stream) {
  if (config < 0 || config >= kNumConfigs) return fail("linear", "no such configuration");
  return kConfigs[config].run[gelu ? 1 : 0](values, metadata, x, bias, y, m, n, k, workspace,
                                             static_cast<cudaStream_t>(stream));
}

}  // extern "C"
