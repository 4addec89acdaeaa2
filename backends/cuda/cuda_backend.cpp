// The cuda executor: weights uploaded once at load (through pinned staging), the graph's activations in
// one device arena per graph shape, each node a kernel or a cuBLAS call on one stream; the host waits
// only when the logits are read. What it computes is the reference's (loom/sdk/reference.hpp), op by op.
#include "cuda_backend.hpp"

#include "kernels.cuh"
#include "loom/sdk/dtype.hpp"
#include "loom/sdk/error.hpp"
#include "loom/sdk/op_profile.hpp"
#include "loom/sdk/rope.hpp"
#include "quant_device.hpp"

#include <algorithm>
#include <cstring>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace loom::cuda {

namespace {

void check(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  const Errc code = e == cudaErrorMemoryAllocation ? Errc::out_of_memory : Errc::device_error;
  fail(code, "cuda", what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
void check(cublasStatus_t e, const std::string& what) {
  if (e == CUBLAS_STATUS_SUCCESS) return;
  fail(Errc::device_error, "cuda", what + ": cuBLAS status " + std::to_string(static_cast<int>(e)));
}

// A device allocation freed with its owner.
struct DeviceMem {
  void* p = nullptr;
  size_t bytes = 0;
  DeviceMem() = default;
  explicit DeviceMem(size_t n) : bytes(n) {
    if (n) check(cudaMalloc(&p, n), "cudaMalloc of " + std::to_string(n >> 20) + " MiB");
  }
  DeviceMem(DeviceMem&& o) noexcept : p(o.p), bytes(o.bytes) {
    o.p = nullptr;
    o.bytes = 0;
  }
  DeviceMem& operator=(DeviceMem&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  ~DeviceMem() {
    if (p) cudaFree(p);
  }
  // At least n bytes (contents not kept).
  void reserve(size_t n) {
    if (n <= bytes) return;
    *this = DeviceMem(n);
  }
  template <class T> T* as() const noexcept { return static_cast<T*>(p); }
};

// A weight on the device: its bytes as stored, and (element-wise operands) an f32 copy.
struct DeviceWeight {
  uint32_t type = 0;
  uint32_t uses = 0; // weight_use_* bits it was loaded with
  std::array<int64_t, 4> ne{1, 1, 1, 1};
  int64_t row_bytes = 0;
  DeviceMem raw;
  DeviceMem f32;               // element-wise operands: norm weights, biases, RoPE divisors
  std::vector<float> host_f32; // RoPE divisors: the host computes the angle tables
};

constexpr size_t k_align = 256;
size_t align_up(size_t n) {
  return (n + k_align - 1) / k_align * k_align;
}

// Rows of a weight per dequantized tile for the GEMMs (bounds the scratch to ≈ 256 MiB of f32).
int64_t tile_rows(int64_t K) {
  return std::max<int64_t>(64, (int64_t{64} << 20) / std::max<int64_t>(K, 1));
}

class CudaBackendImpl final : public Backend {
public:
  explicit CudaBackendImpl(const CudaOptions& o) : o_(o) {
    check(cudaSetDevice(o.device), "cudaSetDevice(" + std::to_string(o.device) + ")");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cublasCreate(&blas_), "cublasCreate");
    check(cublasSetStream(blas_, stream_), "cublasSetStream");
    // Exact mode: no TF32 (CUBLAS_PEDANTIC_MATH keeps f32 products in f32).
    check(cublasSetMathMode(blas_, o.exact_matmul ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH),
          "cublasSetMathMode");
    describe_ =
        describe_device(o.device) + (o.exact_matmul ? ", exact f32 GEMMs" : ", f16/bf16 tensor-core GEMMs");
    if (o.profile) profile_ = std::make_unique<sdk::OpProfile>("cuda");
  }
  ~CudaBackendImpl() override {
    cudaSetDevice(o_.device); // (no throw here)
    if (stream_) cudaStreamSynchronize(stream_);
    profile_.reset(); // (its table)
    for (cudaEvent_t e : events_)
      cudaEventDestroy(e);
    clear_graphs();
    weights_.clear();
    lazy_.clear();
    if (staging_) cudaFreeHost(staging_);
    if (blas_) cublasDestroy(blas_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::string_view name() const noexcept override { return "cuda"; }
  std::string_view describe() const noexcept override { return describe_; }

  bool supports(const Graph& g, const Node& n) const noexcept override {
    for (int32_t s : n.src) {
      if (s < 0) continue;
      const TensorDesc& t = g.tensors[static_cast<size_t>(s)];
      if (t.kind == TensorKind::weight && !readable(static_cast<uint32_t>(t.dtype))) return false;
    }
    // (the model's graphs multiply by weights and take RoPE divisors from weights; nothing else runs here)
    if (n.op == OpKind::matmul && g.tensors[static_cast<size_t>(n.src[0])].kind != TensorKind::weight)
      return false;
    if (n.op == OpKind::rope && n.src[2] >= 0 &&
        g.tensors[static_cast<size_t>(n.src[2])].kind != TensorKind::weight)
      return false;
    if (n.op == OpKind::moe_route || n.op == OpKind::matmul_id || n.op == OpKind::moe_combine ||
        n.op == OpKind::add_id || n.op == OpKind::swiglu_oai)
      return false; // (a mixture of experts runs on the reference and cpu backends)
    if (n.op == OpKind::attention)
      return n.attn.sink_logits < 0 && n.attn.head_dim > 0 && n.attn.head_dim <= 256 &&
             n.attn.n_head_kv > 0 && n.attn.n_head % n.attn.n_head_kv == 0;
    return true;
  }
  bool supports_kv_dtype(DType t) const noexcept override {
    return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::q8_0;
  }
  // An online-softmax kernel over each query's span (flash-decoding's shape): never materialized scores.
  // Token-tree rows too (attn_tree; first passed on an H200, 2026-12-04), unless [backend] tree_attention
  // = false: then speculative decoding drafts chains on this backend. Not (yet) a pool of layer groups
  // (attn_kv_groups): its kernels read one block table, so a hybrid model keeps full KV here.
  bool supports_attention(AttnKernel k, uint32_t features) const noexcept override {
    return k != AttnKernel::naive && (features & attn_kv_groups) == 0 &&
           ((features & attn_tree) == 0 || o_.tree_attention);
  }

  size_t workspace_bytes() const noexcept override { return arena_used_ + scratch_used_; }
  size_t activation_bytes() const noexcept override { return arena_used_; }

  // ---- memory ----
  // Device memory (cleared: a fresh buffer reads as zeros, as host memory's).
  std::unique_ptr<Buffer> alloc(size_t bytes, BufferUsage) override {
    bind();
    return std::make_unique<DeviceBuffer>(*this, bytes);
  }
  std::optional<MemoryInfo> memory_info() const override {
    bind();
    size_t free_bytes = 0, total_bytes = 0;
    check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    return MemoryInfo{free_bytes, total_bytes};
  }

  // ---- load ----
  void load(std::span<const WeightDesc> weights) override {
    bind();
    size_t total = 0;
    for (const WeightDesc& w : weights)
      total += w.bytes;
    if (!staging_) check(cudaMallocHost(&staging_, o_.staging_bytes), "cudaMallocHost (upload staging)");
    size_t done = 0, next_report = size_t{1} << 30;
    for (const WeightDesc& w : weights) {
      if (w.tensor.weight < 0) continue;
      weights_[w.tensor.weight] = make_weight(w.tensor, w.bytes, w.uses);
      done += w.bytes;
      if (total >= (size_t{2} << 30) && done >= next_report) { // a line per GiB of large models
        std::fprintf(stderr, "cuda: uploaded %zu of %zu MiB\n", done >> 20, total >> 20);
        next_report += size_t{1} << 30;
      }
    }
    check(cudaStreamSynchronize(stream_), "weight upload");
  }

  // ---- compute ----
  // `logits`: a buffer of this backend (what the plugin table hands over), or host memory, which gets the
  // logits through a device buffer of this backend's own.
  void compute(const Graph& g, const BatchView& b, const KVRows& kv, std::span<float> logits) override {
    if (!profile_) return compute_once(g, b, kv, logits);
    const auto start = sdk::OpProfile::Clock::now();
    compute_once(g, b, kv, logits);
    check(cudaStreamSynchronize(stream_), "profile");
    profile_->add_compute(start, sdk::OpProfile::Clock::now());
  }
  // One compute (compute() times it under [backend] profile).
  void compute_once(const Graph& g, const BatchView& b, const KVRows& kv, std::span<float> logits) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, logits.data()) == cudaSuccess && a.type == cudaMemoryTypeDevice) {
      run(g, b, kv, logits.data(), logits.size());
      return;
    }
    cudaGetLastError(); // (clears the error of a host pointer on old runtimes)
    dev_logits_.reserve(logits.size_bytes());
    run(g, b, kv, dev_logits_.as<float>(), logits.size());
    download(logits.data(), dev_logits_.p, logits.size_bytes());
  }

  // One compute: the batch uploaded, the activations placed in the arena, the RoPE tables made, then the
  // nodes' launches (replayed as a CUDA graph where the shape recurs) and the logits copied out.
  void run(const Graph& g, const BatchView& b, const KVRows& kv, float* logits, size_t n_logits) {
    bind();
    const auto T = static_cast<int64_t>(b.tokens.size());
    LOOM_ASSERT(g.n_tokens == T, "graph and batch differ in tokens");
    const bool tree = b.has_tree(); // token-tree rows: their rope positions, tree bases and masks too
    const DeviceBatch in = upload_batch(b, kv, tree);
    // RoPE at each row's rope position (a tree node's depth), positions elsewhere
    const std::span<const Pos> rope_pos = tree ? b.rope_positions : b.positions;
    const std::vector<size_t> off = place_activations(g);
    const KvPool pool = kv.pool() ? pool_of(kv.pool(), kv.layout()) : KvPool{};
    int32_t max_keys = 1; // the longest span any row attends (at most: its position + 1)
    for (const Pos p : b.positions)
      max_keys = std::max<int32_t>(max_keys, p + 1);
    rope_used_ = 0; // (the tables' device memory is kept between computes)
    const LaunchArgs w{g, kv, in, off, pool, rope_pos, T, max_keys, tree};

    // Every node's launches; the host work they need (weights, RoPE tables, buffers) is done by an eager
    // run of the same shape first, so that a replayed CUDA graph of them finds it all in place.
    const auto walk = [&] {
      for (const Node& n : g.nodes) {
        launch(w, n);
        check(cudaGetLastError(), std::string("launching ") + op_name(n.op));
      }
    };
    // RoPE tables before any launch (their upload is host work; the walk then finds them).
    for (const Node& n : g.nodes)
      if (n.op == OpKind::rope) rope_tables(g, n, rope_pos);
    // Decode steps of a recurring shape replay a CUDA graph of the walk (captured the second time the
    // shape comes with the same buffers: the first run is eager and makes every buffer the walk uses).
    const bool graphable = o_.cuda_graphs && T <= 8 && g.id != 0 && !tree && !profile_; // (tree: not keyed)
    if (profile_)
      timed_walk(w);
    else if (!graphable || !replay_or_capture(graph_key(w, b), walk))
      walk();
    const TensorDesc& out = g.tensors[static_cast<size_t>(g.out_logits)];
    const auto n_out = static_cast<size_t>(out.n_elements());
    LOOM_ASSERT(n_logits >= n_out, "logits buffer too small");
    check(cudaMemcpyAsync(logits, act(w, g.out_logits), n_out * sizeof(float), cudaMemcpyDeviceToDevice,
                          stream_),
          "logits");
    // A fault inside a kernel shows here at the latest (the download that follows synchronizes).
    check(cudaGetLastError(), "compute");
  }

private:
  struct GraphKey {
    std::vector<uint64_t> v;
    bool operator<(const GraphKey& o) const { return v < o.v; }
  };
  struct GraphState {
    int runs = 0;
    bool failed = false;
    cudaGraphExec_t exec = nullptr;
  };
  // The batch's inputs on the device.
  struct DeviceBatch {
    const int32_t* tok;
    const int32_t* pos;
    const int32_t* out;
    const int64_t* slot;
    const int32_t* rseq;
    const int32_t* tab;
    const int32_t* trope; // token trees only (else nullptr): rope positions, tree bases, masks
    const int32_t* tbase;
    const uint64_t* tmask;
  };

  // The batch's ids and positions, the KV slots and block tables (and a tree's rows), in one upload.
  DeviceBatch upload_batch(const BatchView& b, const KVRows& kv, bool tree) {
    std::vector<uint8_t> in;
    const auto put = [&](const void* p, size_t n) {
      const size_t at = align_up(in.size());
      in.resize(at + n);
      if (n) std::memcpy(in.data() + at, p, n);
      return at;
    };
    const size_t o_tok = put(b.tokens.data(), b.tokens.size() * 4);
    const size_t o_pos = put(b.positions.data(), b.positions.size() * 4);
    const size_t o_out = put(b.output_rows.data(), b.output_rows.size() * 4);
    const size_t o_slot = put(kv.slots().data(), kv.slots().size() * 8);
    const size_t o_rseq = put(kv.row_seqs().data(), kv.row_seqs().size() * 4);
    const size_t o_tab = put(kv.tables().data(), kv.tables().size() * 4);
    const size_t o_trope = tree ? put(b.rope_positions.data(), b.rope_positions.size() * 4) : 0;
    const size_t o_tbase = tree ? put(b.tree_base.data(), b.tree_base.size() * 4) : 0;
    const size_t o_tmask = tree ? put(b.tree_mask.data(), b.tree_mask.size() * 8) : 0;
    inputs_.reserve(std::max<size_t>(in.size(), 1));
    check(cudaMemcpyAsync(inputs_.p, in.data(), in.size(), cudaMemcpyHostToDevice, stream_), "batch upload");
    const auto dev_in = [&](size_t at) { return inputs_.as<uint8_t>() + at; };
    DeviceBatch d;
    d.tok = reinterpret_cast<const int32_t*>(dev_in(o_tok));
    d.pos = reinterpret_cast<const int32_t*>(dev_in(o_pos));
    d.out = reinterpret_cast<const int32_t*>(dev_in(o_out));
    d.slot = reinterpret_cast<const int64_t*>(dev_in(o_slot));
    d.rseq = reinterpret_cast<const int32_t*>(dev_in(o_rseq));
    d.tab = reinterpret_cast<const int32_t*>(dev_in(o_tab));
    d.trope = tree ? reinterpret_cast<const int32_t*>(dev_in(o_trope)) : nullptr;
    d.tbase = tree ? reinterpret_cast<const int32_t*>(dev_in(o_tbase)) : nullptr;
    d.tmask = tree ? reinterpret_cast<const uint64_t*>(dev_in(o_tmask)) : nullptr;
    return d;
  }

  // Activations: one arena (reserved here), each tensor at its offset.
  std::vector<size_t> place_activations(const Graph& g) {
    std::vector<size_t> off(g.tensors.size(), 0);
    size_t arena = 0;
    for (size_t i = 0; i < g.tensors.size(); ++i)
      if (g.tensors[i].kind == TensorKind::activation) {
        off[i] = arena;
        arena += align_up(static_cast<size_t>(g.tensors[i].n_elements()) * sizeof(float));
      }
    arena_.reserve(std::max<size_t>(arena, 1));
    arena_used_ = arena;
    return off;
  }

  // What the launches of one compute read.
  struct LaunchArgs {
    const Graph& g;
    const KVRows& kv;
    const DeviceBatch& in;
    const std::vector<size_t>& off; // each activation's offset in the arena
    const KvPool& pool;
    std::span<const Pos> rope_pos;
    int64_t T;
    int32_t max_keys;
    bool tree;
  };

  float* act(const LaunchArgs& w, int32_t id) const {
    return reinterpret_cast<float*>(arena_.as<uint8_t>() + w.off[static_cast<size_t>(id)]);
  }
  static const int32_t* ints(const LaunchArgs& w, int32_t id) {
    if (id == w.g.in_tokens) return w.in.tok;
    if (id == w.g.in_positions) return w.tree ? w.in.trope : w.in.pos;
    if (id == w.g.in_out_ids) return w.in.out;
    fail(Errc::unsupported, "cuda", "an integer tensor that is not a graph input");
  }
  // An element-wise operand as f32 on the device (a weight's f32 copy, or an activation).
  const float* vec(const LaunchArgs& w, int32_t id) {
    const TensorDesc& t = w.g.tensors[static_cast<size_t>(id)];
    if (t.kind == TensorKind::weight) return weight(t, weight_use_vector).f32.as<float>();
    return act(w, id);
  }

  // A node's launches (one case per op).
  void launch(const LaunchArgs& w, const Node& n) {
    const Graph& g = w.g;
    const TensorDesc& d = g.tensors[static_cast<size_t>(n.dst)];
    float* dst = act(w, n.dst);
    const auto src_t = [&](int k) -> const TensorDesc& { return g.tensors[static_cast<size_t>(n.src[k])]; };
    switch (n.op) {
    case OpKind::get_rows:
      launch_get_rows(w, n, dst);
      break;
    case OpKind::rms_norm: {
      const TensorDesc& s = src_t(0);
      rms_norm(act(w, n.src[0]), n.src[1] >= 0 ? vec(w, n.src[1]) : nullptr, dst, s.n_rows(), s.ne[0], n.eps,
               stream_);
      break;
    }
    case OpKind::matmul:
      matmul(g, n, act(w, n.src[1]), dst);
      break;
    case OpKind::rope: {
      const TensorDesc& s = src_t(0);
      const auto [cs, sn] = rope_tables(g, n, w.rope_pos);
      rope(act(w, n.src[0]), dst, cs, sn, s.ne[0], s.ne[1], s.ne[2], n.rope.n_dims, n.rope.neox, stream_);
      break;
    }
    case OpKind::attention:
      launch_attention(w, n, dst);
      break;
    case OpKind::swiglu:
      binary(Binary::swiglu, act(w, n.src[0]), act(w, n.src[1]), dst, d.n_elements(), d.n_elements(),
             stream_);
      break;
    case OpKind::geglu:
      binary(Binary::geglu, act(w, n.src[0]), act(w, n.src[1]), dst, d.n_elements(), d.n_elements(), stream_);
      break;
    case OpKind::add:
      binary(Binary::add, act(w, n.src[0]), vec(w, n.src[1]), dst, d.n_elements(), src_t(1).n_elements(),
             stream_);
      break;
    case OpKind::mul:
      binary(Binary::mul, act(w, n.src[0]), vec(w, n.src[1]), dst, d.n_elements(),
             src_t(1).n_rows() == 1 ? d.ne[0] : src_t(1).n_elements(), stream_);
      break;
    case OpKind::scale:
      unary(Unary::scale, act(w, n.src[0]), dst, d.n_elements(), n.scale, stream_);
      break;
    case OpKind::softcap:
      unary(Unary::softcap, act(w, n.src[0]), dst, d.n_elements(), n.scale, stream_);
      break;
    case OpKind::softmax:
      softmax(act(w, n.src[0]), dst, d.n_rows(), d.ne[0], stream_);
      break;
    case OpKind::copy:
      launch_copy(w, n, dst);
      break;
    default:
      fail(Errc::unsupported, "cuda", std::string("op ") + op_name(n.op) + " is not implemented");
    }
  }

  void launch_get_rows(const LaunchArgs& w, const Node& n, float* dst) {
    const TensorDesc& s = w.g.tensors[static_cast<size_t>(n.src[0])];
    const int32_t* idx = ints(w, n.src[1]);
    const auto k = static_cast<int64_t>(w.g.tensors[static_cast<size_t>(n.src[1])].ne[0]);
    if (s.kind == TensorKind::weight) {
      const DeviceWeight& dw = weight(s, weight_use_rows);
      get_rows(dw.type, dw.raw.as<uint8_t>(), dw.row_bytes, s.ne[0], idx, k, dst, stream_);
    } else {
      get_rows(qt_f32, reinterpret_cast<const uint8_t*>(act(w, n.src[0])), s.ne[0] * 4, s.ne[0], idx, k, dst,
               stream_);
    }
  }

  // This batch's K/V rows into the pool, then attention over each row's span.
  void launch_attention(const LaunchArgs& w, const Node& n, float* dst) {
    LOOM_ASSERT(w.pool.data != nullptr, "attention without a KV pool");
    const AttentionParams& p = n.attn;
    kv_write(w.pool, p.layer, act(w, n.src[1]), act(w, n.src[2]), w.in.slot, w.T, stream_);
    AttnArgs a;
    a.layer = p.layer;
    a.n_head = p.n_head;
    a.n_head_kv = p.n_head_kv;
    a.head_dim = p.head_dim;
    a.scale = p.scale;
    a.window = p.window;
    a.softcap = p.softcap;
    a.sinks = p.sinks;
    const size_t sb = attention_scratch_bytes(w.T, p.n_head, p.head_dim, w.max_keys);
    attn_scratch_.reserve(std::max<size_t>(sb, 1));
    attention(w.pool, a, act(w, n.src[0]), w.in.pos, w.in.rseq, w.in.tab, w.kv.table_stride(), w.T,
              w.max_keys, sb ? attn_scratch_.as<float>() : nullptr, dst, stream_, w.in.trope, w.in.tbase,
              w.in.tmask);
  }

  void launch_copy(const LaunchArgs& w, const Node& n, float* dst) {
    const TensorDesc& d = w.g.tensors[static_cast<size_t>(n.dst)];
    const TensorDesc& s = w.g.tensors[static_cast<size_t>(n.src[0])];
    if (s.kind == TensorKind::weight) {
      const DeviceWeight& dw = weight(s, weight_use_rows);
      get_rows(dw.type, dw.raw.as<uint8_t>(), dw.row_bytes, d.ne[0], nullptr, d.n_rows(), dst, stream_);
    } else {
      check(cudaMemcpyAsync(dst, act(w, n.src[0]), static_cast<size_t>(d.n_elements()) * 4,
                            cudaMemcpyDeviceToDevice, stream_),
            "copy");
    }
  }

  // The key of a replayed CUDA graph: anything that changes a launch's arguments.
  GraphKey graph_key(const LaunchArgs& w, const BatchView& b) const {
    GraphKey key;
    key.v = {w.g.id,
             static_cast<uint64_t>(w.T),
             static_cast<uint64_t>(b.output_rows.size()),
             static_cast<uint64_t>(w.kv.table_stride()),
             static_cast<uint64_t>(w.kv.n_seqs()),
             static_cast<uint64_t>(attention_scratch_bytes(w.T, 1, 1, w.max_keys)),
             reinterpret_cast<uint64_t>(w.pool.data),
             static_cast<uint64_t>(w.pool.dtype),
             static_cast<uint64_t>(w.pool.n_blocks),
             static_cast<uint64_t>(w.pool.block_size),
             reinterpret_cast<uint64_t>(arena_.p),
             reinterpret_cast<uint64_t>(scratch_.p),
             reinterpret_cast<uint64_t>(attn_scratch_.p),
             reinterpret_cast<uint64_t>(inputs_.p)};
    for (size_t r = 0; r < rope_used_; ++r)
      key.v.push_back(reinterpret_cast<uint64_t>(rope_cache_[r].mem.p));
    for (int32_t h : {1, 2, 4, 8, 16, 32, 64}) // the attention launches' split counts
      key.v.push_back(static_cast<uint64_t>(attention_scratch_bytes(w.T, h, 1, w.max_keys)));
    return key;
  }

  // The walk with each node between two CUDA events ([backend] profile), summed by op kind and batch size.
  void timed_walk(const LaunchArgs& w) {
    const size_t n = w.g.nodes.size();
    while (events_.size() < 2 * n) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreate(&e), "cudaEventCreate");
      events_.push_back(e);
    }
    for (size_t i = 0; i < n; ++i) {
      check(cudaEventRecord(events_[2 * i], stream_), "cudaEventRecord");
      launch(w, w.g.nodes[i]);
      check(cudaGetLastError(), std::string("launching ") + op_name(w.g.nodes[i].op));
      check(cudaEventRecord(events_[2 * i + 1], stream_), "cudaEventRecord");
    }
    check(cudaStreamSynchronize(stream_), "profile");
    for (size_t i = 0; i < n; ++i) {
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, events_[2 * i], events_[2 * i + 1]), "cudaEventElapsedTime");
      profile_->add(sdk::OpProfile::kind(w.g.nodes[i].op, w.T), static_cast<double>(ms));
    }
  }

  // Replays the graph of `key`, or captures it (second sighting) and replays it; false: run eagerly.
  template <class Walk> bool replay_or_capture(const GraphKey& key, const Walk& walk) {
    if (graphs_.size() >= 64 && !graphs_.count(key)) clear_graphs(); // bounded
    GraphState& st = graphs_[key];
    if (st.exec) {
      check(cudaGraphLaunch(st.exec, stream_), "cudaGraphLaunch");
      return true;
    }
    if (st.failed || ++st.runs < 2) return false;
    cudaGraph_t graph = nullptr;
    if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      cudaGetLastError();
      st.failed = true;
      return false;
    }
    try {
      walk();
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      st.failed = true;
      return false; // (nothing ran: the eager walk follows)
    }
    const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    if (e != cudaSuccess || !graph || cudaGraphInstantiate(&st.exec, graph, 0) != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      st.exec = nullptr;
      st.failed = true;
      return false;
    }
    cudaGraphDestroy(graph);
    check(cudaGraphLaunch(st.exec, stream_), "cudaGraphLaunch");
    return true;
  }
  void clear_graphs() noexcept {
    for (auto& [k, st] : graphs_)
      if (st.exec) cudaGraphExecDestroy(st.exec);
    graphs_.clear();
  }

  // The device is per-thread state of the CUDA runtime: every entry point binds ours (the engine may step
  // on another thread than the one that made the backend).
  void bind() const { check(cudaSetDevice(o_.device), "cudaSetDevice(" + std::to_string(o_.device) + ")"); }

  // A KV pool as the kernels see it.
  static KvPool pool_of(void* p, const KVLayout& l) {
    if (l.dtype == DType::q8_0 && (static_cast<int64_t>(l.n_head_kv) * l.head_dim) % 32 != 0)
      fail(Errc::unsupported, "cuda",
           "a q8_0 KV cache needs rows of a multiple of 32 values (n_head_kv x head_dim), found " +
               std::to_string(static_cast<int64_t>(l.n_head_kv) * l.head_dim) + "; use kv_cache.dtype = f16");
    KvPool k;
    k.data = static_cast<uint8_t*>(p);
    k.dtype = static_cast<uint32_t>(l.dtype);
    k.n_layer = l.n_layer;
    k.n_head_kv = l.n_head_kv;
    k.head_dim = l.head_dim;
    k.block_size = l.block_size;
    k.n_blocks = l.n_blocks;
    k.row_bytes = static_cast<int64_t>(l.row_bytes());
    return k;
  }

  // A buffer of device memory (Backend::alloc): a KV pool, the logits, anything else; cleared when made.
  // Its copies, reads and writes run on the backend's stream (reads and writes wait for it).
  class DeviceBuffer final : public Buffer {
  public:
    DeviceBuffer(CudaBackendImpl& be, size_t bytes) : be_(be), mem_(std::max<size_t>(bytes, 1)) {
      check(cudaMemsetAsync(mem_.p, 0, mem_.bytes, be.stream_), "clearing a buffer");
    }
    ~DeviceBuffer() override {
      cudaSetDevice(be_.o_.device); // (no throw here; work on the buffer ends first)
      cudaStreamSynchronize(be_.stream_);
    }
    void* data() noexcept override { return mem_.p; }
    const void* owner() const noexcept override { return be_.instance_tag(); }
    void copy(const KVLayout& l, std::span<const KVBlockCopy> copies) override {
      be_.bind();
      const KvPool kv = pool_of(mem_.p, l);
      for (const KVBlockCopy& c : copies)
        cuda::kv_copy(kv, c.src, c.dst, c.n_positions, be_.stream_);
      check(cudaGetLastError(), "kv_copy");
    }
    void read(size_t offset, void* dst, size_t n) const override {
      LOOM_ASSERT(offset <= mem_.bytes && n <= mem_.bytes - offset, "read outside the buffer");
      be_.download(dst, mem_.as<uint8_t>() + offset, n);
    }
    void write(size_t offset, const void* src, size_t n) override {
      LOOM_ASSERT(offset <= mem_.bytes && n <= mem_.bytes - offset, "write outside the buffer");
      be_.bind();
      check(cudaMemcpyAsync(mem_.as<uint8_t>() + offset, src, n, cudaMemcpyHostToDevice, be_.stream_),
            "upload");
      check(cudaStreamSynchronize(be_.stream_), "upload");
    }

  private:
    CudaBackendImpl& be_;
    DeviceMem mem_;
  };

  void download(void* dst, const void* src, size_t bytes) const {
    bind();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "download");
    check(cudaStreamSynchronize(stream_), "download");
  }

  // Host bytes to the device through the pinned staging buffer (chunks; the stream orders them).
  void stage(void* dst, const void* src, size_t bytes) {
    const auto* s = static_cast<const uint8_t*>(src);
    auto* d = static_cast<uint8_t*>(dst);
    for (size_t at = 0; at < bytes; at += o_.staging_bytes) {
      const size_t n = std::min(o_.staging_bytes, bytes - at);
      check(cudaStreamSynchronize(stream_), "weight upload"); // the staging buffer is free again
      std::memcpy(staging_, s + at, n);
      check(cudaMemcpyAsync(d + at, staging_, n, cudaMemcpyHostToDevice, stream_), "weight upload");
    }
  }

  DeviceWeight make_weight(const TensorDesc& t, size_t bytes, uint32_t uses) {
    const auto type = static_cast<uint32_t>(t.dtype);
    if (!readable(type))
      fail(Errc::unsupported, "cuda",
           "weight " + t.name + " is stored as " + std::string(dtype_name(t.dtype)) +
               ", which the cuda backend cannot read");
    DeviceWeight w;
    w.type = type;
    w.uses = uses;
    w.ne = t.ne;
    w.row_bytes = cuda::row_bytes(type, t.ne[0]);
    if (!staging_) check(cudaMallocHost(&staging_, o_.staging_bytes), "cudaMallocHost (upload staging)");
    if (uses & (weight_use_matmul | weight_use_logits | weight_use_rows)) {
      w.raw = DeviceMem(bytes);
      stage(w.raw.p, t.data, bytes);
    }
    if (uses & weight_use_vector) { // small: dequantized on the host, exactly
      w.host_f32.resize(static_cast<size_t>(t.n_elements()));
      const size_t rb = loom::row_bytes(t.dtype, t.ne[0]);
      for (int64_t r = 0; r < t.n_rows(); ++r)
        dequantize_row(t.dtype, static_cast<const uint8_t*>(t.data) + static_cast<size_t>(r) * rb,
                       w.host_f32.data() + r * t.ne[0], t.ne[0]);
      w.f32 = DeviceMem(w.host_f32.size() * sizeof(float));
      stage(w.f32.p, w.host_f32.data(), w.host_f32.size() * sizeof(float));
    }
    return w;
  }

  // The device copy of a graph weight: loaded (by id), or uploaded on first use (a graph built without a
  // load step, as tests do), keyed by its host bytes.
  const DeviceWeight& weight(const TensorDesc& t, uint32_t use) {
    if (t.weight >= 0) {
      auto it = weights_.find(t.weight);
      if (it != weights_.end()) {
        const bool has =
            (use == weight_use_vector) ? it->second.f32.p != nullptr : it->second.raw.p != nullptr;
        if (has) return it->second;
      }
    }
    const LazyKey key{t.data, static_cast<uint32_t>(t.dtype), t.ne, use};
    auto it = lazy_.find(key);
    if (it == lazy_.end()) {
      const size_t bytes = loom::row_bytes(t.dtype, t.ne[0]) * static_cast<size_t>(t.n_rows());
      it = lazy_.emplace(key, make_weight(t, bytes, use)).first;
    }
    return it->second;
  }

  // cos/sin tables [T][n_dims / 2] of a rope node on the device, computed by the host's rope_table (the
  // very angles of the reference) once per compute and distinct parameters.
  std::pair<const float*, const float*> rope_tables(const Graph& g, const Node& n, std::span<const Pos> pos) {
    const float* ff = nullptr;
    if (n.src[2] >= 0)
      ff = weight(g.tensors[static_cast<size_t>(n.src[2])], weight_use_vector).host_f32.data();
    const RopeParams& r = n.rope;
    for (size_t i = 0; i < rope_used_; ++i) {
      const RopeCache& c = rope_cache_[i];
      if (c.ff == ff && c.p.n_dims == r.n_dims && c.p.theta == r.theta && c.p.neox == r.neox &&
          c.p.freq_scale == r.freq_scale && c.p.ext_factor == r.ext_factor &&
          c.p.attn_factor == r.attn_factor && c.p.orig_ctx == r.orig_ctx && c.p.beta_fast == r.beta_fast &&
          c.p.beta_slow == r.beta_slow)
        return {c.mem.as<float>(), c.mem.as<float>() + c.half * static_cast<int64_t>(pos.size())};
    }
    const int64_t half = r.n_dims / 2, T = static_cast<int64_t>(pos.size());
    std::vector<float> host(static_cast<size_t>(2 * half * T));
    for (int64_t t = 0; t < T; ++t)
      rope_table(r, pos[static_cast<size_t>(t)], host.data() + t * half, host.data() + (T + t) * half, ff);
    if (rope_used_ == rope_cache_.size()) rope_cache_.emplace_back();
    RopeCache& c = rope_cache_[rope_used_++];
    c.p = r;
    c.ff = ff;
    c.half = half;
    c.mem.reserve(std::max<size_t>(host.size() * sizeof(float), 1));
    check(cudaMemcpyAsync(c.mem.p, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, stream_),
          "rope tables");
    // (from pageable memory: the call returns once the bytes are staged, so `host` may go)
    const float* base = c.mem.as<float>();
    return {base, base + half * T};
  }

  // dst [T][N] = x [T][K] · Wᵀ: small batches on the GEMV kernel (any type), larger ones on cuBLAS.
  void matmul(const Graph& g, const Node& n, const float* x, float* dst) {
    const TensorDesc& wt = g.tensors[static_cast<size_t>(n.src[0])];
    const TensorDesc& xt = g.tensors[static_cast<size_t>(n.src[1])];
    const int64_t K = wt.ne[0], N = wt.ne[1], T = xt.n_rows();
    LOOM_ASSERT(xt.ne[0] == K, "matmul inner dimensions differ");
    uint32_t type = qt_f32;
    const uint8_t* w = nullptr;
    int64_t rb = K * 4;
    bool logits = false; // the output head: exact products unless exact_logits = false
    if (wt.kind == TensorKind::weight) {
      const DeviceWeight& dw = weight(wt, weight_use_matmul);
      type = dw.type;
      w = dw.raw.as<uint8_t>();
      rb = dw.row_bytes;
      logits = (dw.uses & weight_use_logits) != 0 || n.dst == g.out_logits;
    } else {
      fail(Errc::unsupported, "cuda", "a matmul whose matrix is an activation");
    }
    // GEMV kernels for ≤ 8 rows; for block types' int8 products up to 32 rows too (⌈T/8⌉ passes over the
    // packed weights move fewer bytes than dequantizing them all to f16 for one GEMM).
    // The head under exact_logits on a block type: int8, then the logits_rescore highest of each row exact.
    const bool rescore = logits && o_.exact_logits && o_.logits_rescore > 0;
    const bool int8 = !o_.exact_matmul && (!(logits && o_.exact_logits) || rescore) && block_values(type) > 1;
    if (T <= 8 || (int8 && T <= 32)) {
      if (int8) { // int8 products
        const size_t qbytes = align_up(static_cast<size_t>(T * (K / 32)) * q8_block_bytes());
        const auto c = static_cast<int32_t>(std::min<int64_t>(o_.logits_rescore, N));
        const size_t ibytes = rescore ? static_cast<size_t>(T * c) * sizeof(int32_t) : 0;
        scratch_.reserve(qbytes + ibytes);
        scratch_used_ = std::max(scratch_used_, qbytes + ibytes);
        quantize_acts(x, scratch_.p, T * (K / 32), stream_);
        gemv_int8(type, w, rb, scratch_.p, dst, K, N, static_cast<int32_t>(T), stream_);
        if (rescore) {
          auto* idx = reinterpret_cast<int32_t*>(scratch_.as<uint8_t>() + qbytes);
          top_rows(dst, N, static_cast<int32_t>(T), c, idx, stream_);
          rows_exact(type, w, rb, x, K, idx, static_cast<int32_t>(T), c, dst, N, stream_);
        }
      } else {
        gemv(type, w, rb, x, dst, K, N, static_cast<int32_t>(T), stream_);
      }
      return;
    }
    const float one = 1.0f, zero = 0.0f;
    if (o_.exact_matmul || K % 8 != 0 || type == qt_f32) { // f32 tiles (f32 weights as they are), SGEMM
      if (type == qt_f32) {
        check(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(T),
                          static_cast<int>(K), &one, reinterpret_cast<const float*>(w), static_cast<int>(K),
                          x, static_cast<int>(K), &zero, dst, static_cast<int>(N)),
              "cublasSgemm");
        return;
      }
      const int64_t tr = std::min(N, tile_rows(K));
      scratch_.reserve(static_cast<size_t>(tr * K) * sizeof(float));
      scratch_used_ = std::max(scratch_used_, static_cast<size_t>(tr * K) * sizeof(float));
      for (int64_t j0 = 0; j0 < N; j0 += tr) {
        const int64_t r = std::min(tr, N - j0);
        dequant_rows(type, w + j0 * rb, rb, K, r, scratch_.p, qt_f32, stream_);
        check(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(r), static_cast<int>(T),
                          static_cast<int>(K), &one, scratch_.as<float>(), static_cast<int>(K), x,
                          static_cast<int>(K), &zero, dst + j0, static_cast<int>(N)),
              "cublasSgemm");
      }
      return;
    }
    // Tensor cores: the activations rounded to bf16 for bf16 weights, else f16; the weights as stored
    // (f16 / bf16) or dequantized a tile at a time into that type.
    const bool bf16 = type == qt_bf16;
    const cudaDataType_t ht = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    const size_t xbytes = static_cast<size_t>(T * K) * 2;
    const int64_t tr = (type == qt_f16 || type == qt_bf16) ? N : std::min(N, tile_rows(K) * 2);
    const size_t wbytes = (type == qt_f16 || type == qt_bf16) ? 0 : static_cast<size_t>(tr * K) * 2;
    scratch_.reserve(align_up(xbytes) + wbytes);
    scratch_used_ = std::max(scratch_used_, align_up(xbytes) + wbytes);
    void* xh = scratch_.p;
    void* wh = scratch_.as<uint8_t>() + align_up(xbytes);
    to_half(x, xh, T * K, bf16, stream_);
    for (int64_t j0 = 0; j0 < N; j0 += tr) {
      const int64_t r = std::min(tr, N - j0);
      const void* a = w + j0 * rb;
      if (type != qt_f16 && type != qt_bf16) {
        dequant_rows(type, w + j0 * rb, rb, K, r, wh, qt_f16, stream_);
        a = wh;
      }
      check(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(r), static_cast<int>(T),
                         static_cast<int>(K), &one, a, ht, static_cast<int>(K), xh, ht, static_cast<int>(K),
                         &zero, dst + j0, CUDA_R_32F, static_cast<int>(N), CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
    }
  }

  struct RopeCache {
    RopeParams p;
    const float* ff = nullptr;
    int64_t half = 0;
    DeviceMem mem;
  };

  CudaOptions o_;
  std::unique_ptr<sdk::OpProfile> profile_; // [backend] profile
  std::vector<cudaEvent_t> events_;         // its per-node events
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::string describe_;
  void* staging_ = nullptr;
  std::unordered_map<int64_t, DeviceWeight> weights_;
  // by host bytes, type, shape and use (a view of a fused tensor starts where its parent does)
  using LazyKey = std::tuple<const void*, uint32_t, std::array<int64_t, 4>, uint32_t>;
  std::map<LazyKey, DeviceWeight> lazy_;
  DeviceMem inputs_, arena_, scratch_, dev_logits_, attn_scratch_;
  size_t arena_used_ = 0, scratch_used_ = 0;
  std::map<GraphKey, GraphState> graphs_;
  std::vector<RopeCache> rope_cache_; // [0, rope_used_): this compute's tables
  size_t rope_used_ = 0;
};

} // namespace

std::string unavailable_reason() {
  int n = 0; // (left unwritten on failure)
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess)
    return std::string("no usable CUDA device: cudaGetDeviceCount: ") + cudaGetErrorName(e) + " (" +
           cudaGetErrorString(e) + ")";
  if (n <= 0) return "no CUDA device";
  return {};
}

std::string describe_device(int d) {
  if (std::string why = unavailable_reason(); !why.empty()) return why;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, d) != cudaSuccess)
    return "CUDA device " + std::to_string(d) + ": no properties";
  char mem[32];
  std::snprintf(mem, sizeof mem, "%.1f GiB", static_cast<double>(p.totalGlobalMem) / (1 << 30));
  return std::string(p.name) + ", sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " + mem;
}

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& o) {
  if (std::string why = unavailable_reason(); !why.empty())
    fail(Errc::device_error, "cuda", why + "; use [backend] name = \"cpu\" on this machine");
  return std::make_unique<CudaBackendImpl>(o);
}

} // namespace loom::cuda
