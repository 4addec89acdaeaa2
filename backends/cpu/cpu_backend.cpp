// The cpu backend's executor. Every op runs on the process's one OpenMP pool (the one oneDNN uses),
// so nothing oversubscribes the cores. Loops are written plainly and compiled twice — generic and
// AVX2/FMA (GCC vectorizes them there; `omp simd` lets it reorder the sums) — and the path is the
// one detect_isa() chose. Tested op by op against the reference backend (tests/backends/).
#include "cpu_backend.hpp"

#include "attention_cpu.hpp"
#include "loom/sdk/error.hpp"
#include "loom/sdk/op_profile.hpp"
#include "loom/sdk/reference.hpp"
#include "loom/sdk/rope.hpp"
#include "matmul_primitives.hpp"
#include "ops_cpu.hpp"
#include "simd_cpu.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <sys/mman.h>
#include <tuple>
#include <unistd.h>
#include <vector>

namespace loom::cpu {

namespace {

// Whether [p, p + n) lies in a read-only private file mapping (a model file mapped by the GGUF
// loader): its pages are clean page-cache pages, so dropping them loses nothing — a later read
// simply faults them back in. Anything else (heap, writable mappings) must not be dropped.
bool in_readonly_file_mapping(const void* p, size_t n) {
  const auto lo = reinterpret_cast<uintptr_t>(p), hi = lo + n;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long a = 0, b = 0, inode = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %7s %*s %*s %lu", &a, &b, perms, &inode) != 4) continue;
    if (a <= lo && hi <= b) return inode != 0 && std::string(perms) == "r--p";
  }
  return false;
}

// Drops this process's pages lying wholly inside [p, p + n) (from such a mapping).
void drop_pages(const void* p, size_t n) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto lo = reinterpret_cast<uintptr_t>(p);
  const uintptr_t a = (lo + page - 1) / page * page, b = (lo + n) / page * page;
  if (a < b) madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
}

struct FreeDeleter {
  void operator()(uint8_t* p) const noexcept { std::free(p); }
};

// Repacked copies of matrices in read-only file mappings, shared by every cpu backend of the process
// that runs them the same way: pipelines of one model file (the host maps a file once, so their weights
// have the same addresses) hold one copy, not one each — `loom serve` with two strategies of one model.
// An entry lives while a backend holds it; a backend's pipeline keeps the mapping (its addresses) alive.
struct SharedRepacks {
  using Key = std::tuple<const void*, int64_t, int64_t, int, int>; // data, K, N, layout, ISA
  std::mutex mu;
  std::map<Key, std::weak_ptr<uint8_t>> copies;
};
SharedRepacks& shared_repacks() {
  static SharedRepacks s;
  return s;
}

// ---- the executor ----

class CpuBackend final : public Backend {
public:
  explicit CpuBackend(const CpuOptions& o)
      : opt_(o), threads_(o.threads > 0 ? o.threads : omp_get_num_procs()), avx2_(at_least(o.isa, Isa::avx2)),
        description_(std::string("isa ") + isa_name(o.isa) + " (CPU: " + isa_name(cpu_isa()) + "), " +
                     std::to_string(threads_) + " threads") {
    if (o.profile) profile_ = std::make_unique<sdk::OpProfile>("cpu");
    if (o.bf16_gemm && at_least(o.isa, Isa::avx512_bf16)) { // oneDNN's own choice of kernel, if native
      try {
        const std::string impl = bf16_matmul(16, 64, 64, 64).impl_info_str();
        if (impl.rfind("ref", 0) != 0) {
          bf16_impl_ = impl;
          description_ += ", bf16 GEMM " + impl;
        }
      } catch (const dnnl::error&) {
        // no bf16 matmul in this oneDNN: the f32 route
      }
    }
    if (o.repack && at_least(o.isa, Isa::avx512_bf16) && (o.bf16_gemv || o.f16_as_bf16))
      description_ += std::string(", bf16x64 GEMV for ") + (o.bf16_gemv ? "BF16" : "") +
                      (o.bf16_gemv && o.f16_as_bf16 ? "/" : "") + (o.f16_as_bf16 ? "F16 (rounded)" : "");
    if (o.repack && at_least(o.isa, Isa::avx512) && o.f16_gemv &&
        !(o.f16_as_bf16 && at_least(o.isa, Isa::avx512_bf16)))
      description_ += ", f16x64 GEMV for F16 (exact)";
    // Which route each block type takes (loom run's backend line).
    if (o.exact_matmul)
      description_ +=
          at_least(o.isa, Isa::avx2)
              ? "; exact f32 products for every block type (exact_matmul): weights unpacked in registers"
              : "; every block type: rows dequantized to f32, then dotted (exact_matmul)";
    else
      description_ += block_routes(o);
    const std::string head = !o.exact_logits ? ""
                             : o.logits_rescore == 0
                                 ? " and the output head"
                                 : "; the output head's " + std::to_string(o.logits_rescore) +
                                       " highest logits a row recomputed exactly";
    description_ += head;
  }

  std::string_view name() const noexcept override { return "cpu"; }
  std::string_view describe() const noexcept override { return description_; }
  bool supports_kv_dtype(DType t) const noexcept override { return kv_dtype_valid(t); }
  // Every variant; flash (tiled online softmax, the default) or naive (the reference kernel); both read
  // only each query's span (attn_span_only).
  bool supports_attention(AttnKernel, uint32_t) const noexcept override { return true; }

  bool supports(const Graph& g, const Node& n) const noexcept override { return weights_dequantizable(g, n); }

  void compute(const Graph& g, const BatchView& batch, const KVRows& kv, std::span<float> logits) override {
    check_batch(g, batch);
    omp_set_num_threads(threads_); // this thread's team size, for our loops and oneDNN's
    const size_t total = place_activations(g);
    logits_ = logits_matmul_dst(g);
    if (arena_.size() < total) arena_.resize(total);
    rope_tables_.clear();
    ++compute_serial_; // (a tensor id names the same activations only within one graph's compute)
    const auto start = sdk::OpProfile::Clock::now();
    for (size_t i = 0; i < g.nodes.size();) {
      const auto t0 = profile_ ? sdk::OpProfile::Clock::now() : start;
      size_t fused = fused_gemv(g, i);
      if (fused == 0) fused = fused_gemv_id(g, i);
      if (fused == 0) run(g, g.nodes[i], batch, kv);
      if (profile_) // (the output head apart: on large vocabularies it is the largest matrix)
        profile_->add(sdk::OpProfile::kind(g.nodes[i].op, g.n_tokens) + (fused > 1 ? " fused" : "") +
                          (g.nodes[i].dst == logits_ ? " output head" : ""),
                      sdk::OpProfile::ms_between(t0, sdk::OpProfile::Clock::now()));
      i += std::max<size_t>(fused, 1);
    }
    if (redrop_) { // reads of other tensors map whole page-cache folios, repacked neighbours included
      for (const auto& [p, n] : dropped_)
        drop_pages(p, n);
      redrop_ = false;
    }
    const TensorDesc& out = g.tensors[static_cast<size_t>(g.out_logits)];
    const auto n_out = static_cast<size_t>(out.n_elements());
    LOOM_ASSERT(logits.size() >= n_out, "logits buffer too small");
    if (n_out > 0) std::memcpy(logits.data(), f32(g.out_logits), n_out * sizeof(float));
    workspace_ = workspace_now();
    if (profile_) profile_->add_compute(start, sdk::OpProfile::Clock::now());
  }

  // The model's weights, once: the matrices that run repacked are repacked here (the file's pages
  // dropped behind, as a first matmul would), vector operands copied; the rest is read in place.
  void load(std::span<const WeightDesc> weights) override {
    omp_set_num_threads(threads_);
    for (const WeightDesc& w : weights) {
      const TensorDesc& t = w.tensor;
      if (t.data == nullptr) continue;
      if (w.uses & weight_use_vector) (void)vec_of(t);
      if ((w.uses & weight_use_matmul) && t.ne[2] > 1) { // stacked experts: each a matrix of its own
        const int in_file = in_readonly_file_mapping(t.data, w.bytes) ? 1 : 0;
        for (int64_t e = 0; e < t.ne[2]; ++e)
          prepare_matmul(expert_view(t, e), opt_.exact_matmul, in_file);
      } else if (w.uses & weight_use_matmul) {
        prepare_matmul(t, opt_.exact_matmul);
      }
      if (w.uses & weight_use_logits)
        prepare_matmul(t, opt_.exact_matmul || (opt_.exact_logits && !rescored_head(t)));
    }
    if (redrop_) {
      for (const auto& [p, n] : dropped_)
        drop_pages(p, n);
      redrop_ = false;
    }
    workspace_ = workspace_now();
  }
  size_t workspace_now() const noexcept {
    return (arena_.size() + panel_.size()) * sizeof(float) + tiles_.bytes() + copies_extra_;
  }

  size_t workspace_bytes() const noexcept override { return workspace_; }
  size_t activation_bytes() const noexcept override { return arena_.size() * sizeof(float); }

private:
  float* f32(int32_t id) { return arena_.data() + offsets_[static_cast<size_t>(id)]; }

  // The output of the matmul that makes the logits (the graph's output, or what Gemma 2's final soft-cap
  // reads); -1 when the last node is something else.
  static int32_t logits_matmul_dst(const Graph& g) noexcept {
    int32_t out = g.out_logits;
    for (auto it = g.nodes.rbegin(); it != g.nodes.rend(); ++it) {
      if (it->dst != out) continue;
      if (it->op == OpKind::matmul) return out;
      if (it->op != OpKind::softcap) return -1;
      out = it->src[0];
    }
    return -1;
  }

  // Places every activation in one arena, reusing the room of tensors no later node reads (first
  // fit over a free list, neighbours merged); returns the arena's size in floats. An element-wise
  // op writes in place over an operand it reads for the last time; any other node's output never
  // overlaps its inputs; the logits are never freed.
  size_t place_activations(const Graph& g) {
    const size_t nt = g.tensors.size();
    std::vector<int64_t> last(nt, -1);
    for (size_t i = 0; i < g.nodes.size(); ++i)
      for (int32_t s : g.nodes[i].src)
        if (s >= 0) last[static_cast<size_t>(s)] = static_cast<int64_t>(i);
    if (g.out_logits >= 0) last[static_cast<size_t>(g.out_logits)] = INT64_MAX;
    offsets_.assign(nt, SIZE_MAX);
    std::vector<std::pair<size_t, size_t>> free_list; // (offset, size), sorted by offset
    size_t top = 0;
    const auto size_of = [&](int32_t id) {
      return (static_cast<size_t>(g.tensors[static_cast<size_t>(id)].n_elements()) + 15) & ~size_t{15};
    };
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      const bool elementwise = n.op == OpKind::add || n.op == OpKind::mul || n.op == OpKind::scale ||
                               n.op == OpKind::swiglu || n.op == OpKind::geglu || n.op == OpKind::softcap;
      if (elementwise && offsets_[static_cast<size_t>(n.dst)] == SIZE_MAX)
        for (int32_t s : {n.src[0], n.src[1]}) { // in place over an operand read for the last time
          if (s < 0 || g.tensors[static_cast<size_t>(s)].kind != TensorKind::activation) continue;
          if (last[static_cast<size_t>(s)] != static_cast<int64_t>(i) || size_of(s) != size_of(n.dst) ||
              offsets_[static_cast<size_t>(s)] == SIZE_MAX)
            continue;
          offsets_[static_cast<size_t>(n.dst)] = offsets_[static_cast<size_t>(s)];
          last[static_cast<size_t>(s)] = -1; // its room is dst's now: not freed below
          break;
        }
      if (offsets_[static_cast<size_t>(n.dst)] == SIZE_MAX) {
        const size_t need = size_of(n.dst);
        auto it =
            std::find_if(free_list.begin(), free_list.end(), [&](const auto& b) { return b.second >= need; });
        if (it != free_list.end()) {
          offsets_[static_cast<size_t>(n.dst)] = it->first;
          it->first += need;
          it->second -= need;
          if (it->second == 0) free_list.erase(it);
        } else {
          offsets_[static_cast<size_t>(n.dst)] = top;
          top += need;
        }
      }
      for (int32_t s : n.src) {
        if (s < 0 || g.tensors[static_cast<size_t>(s)].kind != TensorKind::activation) continue;
        if (last[static_cast<size_t>(s)] != static_cast<int64_t>(i) ||
            offsets_[static_cast<size_t>(s)] == SIZE_MAX)
          continue;
        last[static_cast<size_t>(s)] = -1; // freed once even when a node reads it twice
        const size_t off = offsets_[static_cast<size_t>(s)], sz = size_of(s);
        auto it = std::lower_bound(free_list.begin(), free_list.end(), std::make_pair(off, size_t{0}));
        it = free_list.insert(it, {off, sz});
        if (std::next(it) != free_list.end() && it->first + it->second == std::next(it)->first) {
          it->second += std::next(it)->second;
          free_list.erase(std::next(it));
        }
        if (it != free_list.begin() && std::prev(it)->first + std::prev(it)->second == it->first) {
          std::prev(it)->second += it->second;
          free_list.erase(it);
        }
      }
    }
    for (size_t i = 0; i < nt; ++i) // activations no node writes (none in a well-formed graph)
      if (g.tensors[i].kind == TensorKind::activation && offsets_[i] == SIZE_MAX) {
        offsets_[i] = top;
        top += size_of(static_cast<int32_t>(i));
      }
    return top;
  }

  std::span<const int32_t> ints(const Graph& g, int32_t id, const BatchView& b) const {
    if (id == g.in_tokens) return b.tokens;
    if (id == g.in_positions) return b.rope_positions.empty() ? b.positions : b.rope_positions;
    if (id == g.in_out_ids) return b.output_rows;
    LOOM_ASSERT(false, "integer tensor that is not a graph input");
    return {};
  }

  // An operand as f32 (norm weights, biases): a weight is copied (dequantized) once into memory of
  // the backend and its file pages dropped, so reading it never maps the file again — a page-cache
  // folio can be larger than the norm and would bring back pages of repacked neighbours.
  // Without repacking (nothing to protect) an f32 weight is read in place, as before.
  const float* vec(const Graph& g, int32_t id) {
    const TensorDesc& t = g.tensors[static_cast<size_t>(id)];
    if (t.kind != TensorKind::weight) return f32(id);
    return vec_of(t);
  }
  const float* vec_of(const TensorDesc& t) {
    if (!opt_.repack && t.dtype == DType::f32) return static_cast<const float*>(t.data);
    const auto key = std::pair{t.data, t.n_elements()};
    auto it = vectors_.find(key);
    if (it != vectors_.end()) return it->second.data();
    std::vector<float> v(static_cast<size_t>(t.n_elements()));
    const size_t rb = row_bytes(t.dtype, t.ne[0]);
    for (int64_t r = 0; r < t.n_rows(); ++r)
      dequantize_row(t.dtype, static_cast<const uint8_t*>(t.data) + static_cast<size_t>(r) * rb,
                     v.data() + r * t.ne[0], t.ne[0]);
    const size_t bytes = rb * static_cast<size_t>(t.n_rows());
    if (opt_.repack && in_readonly_file_mapping(t.data, bytes)) {
      dropped_.emplace_back(t.data, bytes);
      redrop_ = true;
    } else {
      copies_extra_ += v.size() * sizeof(float);
    }
    return vectors_.emplace(key, std::move(v)).first->second.data();
  }

  void ew(Ew op, const float* a, const float* b, float s, float* dst, int64_t n, int64_t row = 1) {
    const auto f = at_least(opt_.isa, Isa::avx512) ? elementwise_avx512
                   : avx2_                         ? elementwise_avx2
                                                   : elementwise_generic;
    constexpr int64_t chunk = 4096;
    const int64_t nc = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t c = 0; c < nc; ++c)
      f(op, a, b, s, dst, c * chunk, std::min(n, (c + 1) * chunk), row);
  }

  // One function: a switch over the ops (a dispatch table in all but name), each case one op's kernel calls.
  void run(const Graph& g, const Node& n, const BatchView& b, const KVRows& kv) {
    const TensorDesc& d = g.tensors[static_cast<size_t>(n.dst)];
    float* dst = f32(n.dst);
    switch (n.op) {
    case OpKind::get_rows: {
      const auto idx = ints(g, n.src[1], b);
      const TensorDesc& s = g.tensors[static_cast<size_t>(n.src[0])];
      const int64_t len = s.ne[0];
      for (const int32_t r : idx)
        LOOM_ASSERT(r >= 0 && r < s.n_rows(), "get_rows index out of range");
      const auto nr = static_cast<int64_t>(idx.size());
      if (s.kind == TensorKind::weight) {
        const uint8_t* copy = exact_copy(s);
#pragma omp parallel for schedule(static) if (nr * len > 65536)
        for (int64_t r = 0; r < nr; ++r)
          weight_row(s, copy, idx[static_cast<size_t>(r)], dst + r * len);
      } else {
        const float* src = f32(n.src[0]);
        for (int64_t r = 0; r < nr; ++r)
          std::memcpy(dst + r * len, src + idx[static_cast<size_t>(r)] * len, static_cast<size_t>(len) * 4);
      }
      return;
    }
    case OpKind::rms_norm: {
      const TensorDesc& s = g.tensors[static_cast<size_t>(n.src[0])];
      const float* w = n.src[1] >= 0 ? vec(g, n.src[1]) : nullptr;
      const auto f = avx2_ ? rms_norm_row_avx2 : rms_norm_row_generic;
      const float* x = f32(n.src[0]);
      const int64_t len = s.ne[0];
#pragma omp parallel for schedule(static) if (s.n_rows() * len > 32768)
      for (int64_t r = 0; r < s.n_rows(); ++r)
        f(x + r * len, w, dst + r * len, len, n.eps);
      return;
    }
    case OpKind::matmul: {
      const TensorDesc& w = g.tensors[static_cast<size_t>(n.src[0])];
      const TensorDesc& x = g.tensors[static_cast<size_t>(n.src[1])];
      LOOM_ASSERT(x.ne[0] == w.ne[0], "matmul inner dimensions differ");
      const bool head = opt_.exact_logits && n.dst == logits_;
      if (head && rescored_head(w))
        head_rescored(w, f32(n.src[1]), x.n_rows(), dst);
      else
        matmul(w, f32(n.src[1]), x.n_rows(), dst, opt_.exact_matmul || head,
               (compute_serial_ << 32) + n.src[1]);
      return;
    }
    case OpKind::rope: {
      const TensorDesc& s = g.tensors[static_cast<size_t>(n.src[0])];
      const auto pos = ints(g, n.src[1], b);
      const int64_t D = s.ne[0], H = s.ne[1], T = s.ne[2];
      const float* x = f32(n.src[0]);
      const float* ff = n.src[2] >= 0 ? vec(g, n.src[2]) : nullptr; // frequency divisors (Llama 3.1)
      const RopeTables& tab = rope_tables(n, ff, pos);
      const auto half = static_cast<size_t>(n.rope.n_dims / 2);
#pragma omp parallel for schedule(static) if (T > 1)
      for (int64_t t = 0; t < T; ++t) {
        std::memcpy(dst + t * H * D, x + t * H * D, static_cast<size_t>(H * D) * sizeof(float));
        for (int64_t h = 0; h < H; ++h)
          rope_rotate(n.rope, tab.cs.data() + static_cast<size_t>(t) * half,
                      tab.sn.data() + static_cast<size_t>(t) * half, dst + (t * H + h) * D);
      }
      return;
    }
    case OpKind::attention: {
      const TensorDesc& q = g.tensors[static_cast<size_t>(n.src[0])];
      const AttentionParams& p = n.attn;
      const auto T = static_cast<int32_t>(q.ne[2]);
      const auto row_elems = static_cast<size_t>(p.n_head_kv) * static_cast<size_t>(p.head_dim);
      const float* k = f32(n.src[1]);
      const float* v = f32(n.src[2]);
      for (int32_t t = 0; t < T; ++t) { // this batch's K/V rows at their slots first
        kv_store(kv.kv_dtype(), k + static_cast<size_t>(t) * row_elems,
                 kv.k_new(p.layer, static_cast<size_t>(t)), static_cast<int64_t>(row_elems));
        kv_store(kv.kv_dtype(), v + static_cast<size_t>(t) * row_elems,
                 kv.v_new(p.layer, static_cast<size_t>(t)), static_cast<int64_t>(row_elems));
      }
      const Pos* rope = b.has_tree() ? b.rope_positions.data() : nullptr;
      const Pos* tbase = b.has_tree() ? b.tree_base.data() : nullptr;
      const uint64_t* tmask = b.has_tree() ? b.tree_mask.data() : nullptr;
      const float* sink_logits = p.sink_logits >= 0 ? vec(g, p.sink_logits) : nullptr;
      if (p.kernel == AttnKernel::naive) // asked for: the materialized-scores reference kernel
        attention::reference_attention(p, f32(n.src[0]), T, b.positions.data(), kv, dst, rope, tbase, tmask,
                                       sink_logits);
      else
        flash_attention(p, f32(n.src[0]), T, b.positions.data(), kv, dst, opt_.isa, rope, tbase, tmask,
                        sink_logits);
      return;
    }
    case OpKind::swiglu:
      ew(Ew::swiglu, f32(n.src[0]), f32(n.src[1]), 0.0f, dst, d.n_elements());
      return;
    case OpKind::add: {
      const TensorDesc& c = g.tensors[static_cast<size_t>(n.src[1])];
      if (c.n_elements() < d.n_elements()) // a bias: src1 repeats
        ew(Ew::add_row, f32(n.src[0]), vec(g, n.src[1]), 0.0f, dst, d.n_elements(), c.n_elements());
      else
        ew(Ew::add, f32(n.src[0]), c.kind == TensorKind::weight ? vec(g, n.src[1]) : f32(n.src[1]), 0.0f, dst,
           d.n_elements());
      return;
    }
    case OpKind::geglu:
      ew(Ew::geglu, f32(n.src[0]), f32(n.src[1]), 0.0f, dst, d.n_elements());
      return;
    case OpKind::softcap:
      ew(Ew::softcap, f32(n.src[0]), nullptr, n.scale, dst, d.n_elements());
      return;
    case OpKind::mul: {
      const TensorDesc& c = g.tensors[static_cast<size_t>(n.src[1])];
      const float* cv = vec(g, n.src[1]);
      if (c.n_rows() == 1)
        ew(Ew::mul_row, f32(n.src[0]), cv, 0.0f, dst, d.n_elements(), d.ne[0]);
      else
        ew(Ew::mul, f32(n.src[0]), cv, 0.0f, dst, d.n_elements());
      return;
    }
    case OpKind::scale:
      ew(Ew::scale, f32(n.src[0]), nullptr, n.scale, dst, d.n_elements());
      return;
    case OpKind::softmax: {
      const float* a = f32(n.src[0]);
      const int64_t len = d.ne[0];
#pragma omp parallel for schedule(static) if (d.n_elements() > 65536)
      for (int64_t r = 0; r < d.n_rows(); ++r)
        softmax_row(a + r * len, dst + r * len, len);
      return;
    }
    case OpKind::moe_route:
      moe_route(g, n, dst);
      return;
    case OpKind::matmul_id:
      matmul_id(g, n, dst);
      return;
    case OpKind::moe_combine:
      moe_combine(g, n, dst);
      return;
    case OpKind::add_id:
      add_id(g, n, dst);
      return;
    case OpKind::swiglu_oai: {
      const float* a = f32(n.src[0]);
      const float* c = f32(n.src[1]);
      const int64_t len = d.n_elements();
#pragma omp parallel for schedule(static) if (len > 65536)
      for (int64_t i = 0; i < len; ++i)
        dst[i] = swiglu_oai(n.glu, a[i], c[i]);
      return;
    }
    case OpKind::copy: {
      const TensorDesc& s = g.tensors[static_cast<size_t>(n.src[0])];
      if (s.kind == TensorKind::weight) {
        const auto* base = static_cast<const uint8_t*>(s.data);
        const size_t rb = row_bytes(s.dtype, s.ne[0]);
#pragma omp parallel for schedule(static) if (d.n_elements() > 65536)
        for (int64_t r = 0; r < d.n_rows(); ++r)
          dequantize_row(s.dtype, base + static_cast<size_t>(r) * rb, dst + r * d.ne[0], d.ne[0]);
      } else {
        std::memcpy(dst, f32(n.src[0]), static_cast<size_t>(d.n_elements()) * sizeof(float));
      }
      return;
    }
    }
    fail(Errc::unsupported, "cpu", std::string("op ") + op_name(n.op) + " is not implemented");
  }

  // Room for a repacked copy. A large one starts on a 2 MiB boundary and asks for transparent huge pages
  // over its whole 2 MiB blocks (the tail keeps small pages, so no page holds bytes past the copy): a
  // fault per 2 MiB instead of per 4 KiB when the copy is first written, and fewer TLB misses for
  // decode's sequential streams. nullptr when out of memory.
  static uint8_t* alloc_copy(size_t bytes) {
    constexpr size_t huge = size_t{2} << 20;
    void* p = nullptr;
    if (posix_memalign(&p, bytes >= 2 * huge ? huge : 64, std::max<size_t>(bytes, 64)) != 0) return nullptr;
#ifdef MADV_HUGEPAGE
    if (bytes >= 2 * huge) madvise(p, bytes / huge * huge, MADV_HUGEPAGE); // advice only: errors ignored
#endif
    // Faulted in by every thread at once (the kernel zeroes each page on its first touch; a thread
    // repacking into a page another one is faulting would wait for it).
    auto* b = static_cast<uint8_t*>(p);
    if (bytes >= 2 * huge) { // (a small copy: its repack faults it in, one thread per group anyway)
      const int64_t pages = static_cast<int64_t>((bytes + 4095) / 4096);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < pages; ++i)
        b[static_cast<size_t>(i) * 4096] = 0;
    }
    return b;
  }

  // The repacked copy of weight w made so far whose rows are exactly the file's values (not F16 rounded to
  // BF16); nullptr if none.
  const uint8_t* exact_copy(const TensorDesc& w) const {
    const auto it = repacked_.find(std::tuple{w.data, w.ne[0], w.ne[1]});
    if (it == repacked_.end() || (w.dtype == DType::f16 && bf16_route(w))) return nullptr;
    return it->second.get();
  }
  // Row `row` of weight w as f32, exactly the file's values: from its copy (exact_copy(w), or nullptr: from
  // the file). A matrix also read row by row — a tied embedding looked up, the exact head's rescored rows —
  // has a repacked copy that replaced the file's pages: reading the copy keeps the file from mapping back in
  // (whole page-cache folios at a time: Gemma 3's 178 MB Q8_0 embedding and head came back 153 MB resident
  // at depth 4096 next to its copy, and grew `loom serve`'s RSS by 10 % in a minute).
  void weight_row(const TensorDesc& w, const uint8_t* copy, int64_t row, float* y) const {
    const int64_t K = w.ne[0], N = w.ne[1];
    const auto* c16 = reinterpret_cast<const uint16_t*>(copy);
    if (copy == nullptr)
      dequantize(opt_.isa, w.dtype,
                 static_cast<const uint8_t*>(w.data) + static_cast<size_t>(row) * row_bytes(w.dtype, K), y,
                 K);
    else if (bf16_route(w))
      dequantize_bf16x64(c16, K, row, y);
    else if (f16_route(w))
      dequantize_f16x64(opt_.isa, c16, K, row, y);
    else
      dequantize_repacked(opt_.isa, w.dtype, copy, K, N, row, y);
  }

  // This compute's RoPE angles, once per distinct rope (parameters, frequency divisors, positions) for all
  // the layers that share it: rope_table's double-precision pow / cos / sin per pair was ≈ 2 % of a SmolLM2
  // prompt and of a decode step when each of 60 rope nodes computed it again.
  struct RopeTables {
    RopeParams rp;
    const float* ff;
    int32_t pos_id;
    std::vector<float> cs, sn; // [token][n_dims / 2]
  };
  // The angles of rope node n for this batch's positions (pos, tensor n.src[1]), made on first use in this
  // compute and shared by every later node of the same rope: rope_table's values, so the same floats.
  const RopeTables& rope_tables(const Node& n, const float* ff, std::span<const int32_t> pos) {
    const RopeParams& a = n.rope;
    for (const RopeTables& t : rope_tables_) {
      const RopeParams& b = t.rp;
      if (t.ff == ff && t.pos_id == n.src[1] && a.n_dims == b.n_dims && a.theta == b.theta &&
          a.neox == b.neox && a.freq_scale == b.freq_scale && a.ext_factor == b.ext_factor &&
          a.attn_factor == b.attn_factor && a.orig_ctx == b.orig_ctx && a.beta_fast == b.beta_fast &&
          a.beta_slow == b.beta_slow)
        return t;
    }
    RopeTables& t = rope_tables_.emplace_back();
    t.rp = a;
    t.ff = ff;
    t.pos_id = n.src[1];
    const auto half = static_cast<size_t>(a.n_dims / 2), T = pos.size();
    t.cs.resize(T * half);
    t.sn.resize(T * half);
#pragma omp parallel for schedule(static) if (T > 1)
    for (size_t i = 0; i < T; ++i)
      rope_table(a, pos[i], t.cs.data() + i * half, t.sn.data() + i * half, ff);
    return t;
  }

  // Which route each block type takes, as matmul() chooses it (exact_matmul off): int8 products at every
  // batch size (the repacked VNNI GEMM), under gemm_min_rows_quant (repacked) or gemm_min_rows (Q4_1's exact
  // prompts; the GGUF-row kernels), exact f32 products for longer batches (Q4_1's on AMX bf16 tiles where
  // exact_tiles), or rows dequantized (below avx2).
  static std::string block_routes(const CpuOptions& o) {
    std::string every, under_quant, under, dequantized;
    for (DType t : {DType::q8_0, DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1, DType::iq4_nl,
                    DType::q2_k, DType::q3_k, DType::q4_k, DType::q5_k, DType::q6_k, DType::iq4_xs}) {
      std::string n(1, ' ');
      n += dtype_name(t);
      if (o.repack && repackable(o.isa, t, 256, 16))
        (t == DType::q4_1                ? under
         : int8_gemm(o.isa, t)           ? every
         : repacked_loop_light(o.isa, t) ? under_quant
                                         : under) += n;
      else if (has_kernel(t) || i8dq_supports(o.isa, t))
        under += n;
      else
        dequantized += n;
    }
    std::string s = "; int8 products (activations rounded to 8 bits per block):";
    if (!every.empty()) s += " at every batch size" + every + " (repacked);";
    if (!under_quant.empty()) s += " batches under gemm_min_rows_quant" + under_quant + " (repacked);";
    if (!under.empty()) s += " batches under gemm_min_rows" + under + ";";
    if (!under_quant.empty() || !under.empty()) s += " exact f32 products for longer batches of those";
    if (o.repack && exact_tiles(o.isa, DType::q4_1, 16)) s += " (q4_1's on AMX bf16 tiles)";
    if (!dequantized.empty()) s += "; rows dequantized to f32, then dotted:" + dequantized;
    return s;
  }

  // The 8-row repacked copy of a quantized matrix (cpu::repackable; made on first use; the file's pages then
  // dropped).
  // in_file: whether w lies in a read-only file mapping when the caller knows (-1: look it up).
  const uint8_t* repacked(const TensorDesc& w, int in_file = -1) {
    const int64_t K = w.ne[0], N = w.ne[1];
    const auto key = std::tuple{w.data, K, N};
    auto it = repacked_.find(key);
    if (it != repacked_.end()) return it->second.get();
    const bool b16 = bf16_route(w), f16 = f16_route(w);
    const size_t bytes = b16 || f16 ? bf16x64_bytes(K, N) : repacked_bytes(w.dtype, K, N);
    const auto* src = static_cast<const uint8_t*>(w.data);
    const size_t rb = row_bytes(w.dtype, K);
    const bool drop =
        in_file >= 0 ? in_file != 0 : in_readonly_file_mapping(src, rb * static_cast<size_t>(N));
    // Another backend's copy of the same mapped matrix, made the same way: shared.
    SharedRepacks& shared = shared_repacks();
    std::unique_lock<std::mutex> lock(shared.mu, std::defer_lock);
    const SharedRepacks::Key skey{w.data, K, N, b16 ? 1 : f16 ? 2 : 0, static_cast<int>(opt_.isa)};
    if (drop) {
      lock.lock();
      if (auto held = shared.copies[skey].lock()) {
        shared_weights_ += bytes;
        return repacked_.emplace(key, std::move(held)).first->second.get();
      }
    }
    std::shared_ptr<uint8_t> buf(alloc_copy(bytes), FreeDeleter{});
    if (!buf)
      fail(Errc::out_of_memory, "cpu",
           "cannot allocate " + std::to_string(bytes) + " bytes to repack '" + w.name + "'");
    // 512 rows at a time, dropping the file's pages behind us: the peak is the model plus one chunk
    for (int64_t j0 = 0; j0 < N; j0 += 512) {
      const int64_t nr = std::min<int64_t>(512, N - j0);
      if (b16 || f16)
        (b16 ? repack_bf16x64
             : [](DType, const uint8_t* w16, size_t r, int64_t k, int64_t n,
                  uint16_t* o16) { repack_f16x64(w16, r, k, n, o16); })(
            w.dtype, src + static_cast<size_t>(j0) * rb, rb, K, nr,
            reinterpret_cast<uint16_t*>(buf.get()) + static_cast<size_t>(j0) * static_cast<size_t>(K));
      else
        repack(w.dtype, src + static_cast<size_t>(j0) * rb, rb, K, nr,
               buf.get() + repacked_bytes(w.dtype, K, j0));
      if (drop) drop_pages(src, rb * static_cast<size_t>(j0 + nr));
    }
    if (drop) {
      dropped_.emplace_back(src, rb * static_cast<size_t>(N));
      redrop_ = true;
      for (auto e = shared.copies.begin(); e != shared.copies.end();) // forget copies nobody holds now
        e = e->second.expired() ? shared.copies.erase(e) : std::next(e);
      shared.copies[skey] = buf;
    } else {
      copies_extra_ += bytes;
    }
    return repacked_.emplace(key, std::move(buf)).first->second.get();
  }

  // Whether w is a BF16 (or, with f16_as_bf16, F16) matrix that runs repacked 16 rows at a time on
  // vdpbf16ps (bf16_gemv, at avx512_bf16).
  bool bf16_route(const TensorDesc& w) const noexcept {
    return opt_.repack && at_least(opt_.isa, Isa::avx512_bf16) && w.ne[2] == 1 && w.ne[3] == 1 &&
           ((w.dtype == DType::bf16 && opt_.bf16_gemv) || (w.dtype == DType::f16 && opt_.f16_as_bf16)) &&
           bf16x64_repackable(w.dtype, w.ne[0], w.ne[1]);
  }

  // Whether w is an F16 matrix that decode and small batches read exactly from its f16x64 copy (f16_gemv,
  // at avx512, when it does not take the bf16 route).
  bool f16_route(const TensorDesc& w) const noexcept {
    return opt_.repack && opt_.f16_gemv && at_least(opt_.isa, Isa::avx512) && w.dtype == DType::f16 &&
           w.ne[2] == 1 && w.ne[3] == 1 && !bf16_route(w) && bf16x64_repackable(w.dtype, w.ne[0], w.ne[1]);
  }

  // How matmul() multiplies one token by w, when that is one of gemv_multi's routes: the repacked int8
  // or bf16 kernels, or our F32 / F16 / BF16 kernels (oneDNN not asked for at one row). False otherwise.
  bool gemv_route(const TensorDesc& w, Gemv& m) {
    const int64_t K = w.ne[0], N = w.ne[1];
    if (w.ne[2] != 1 || w.ne[3] != 1) return false;
    if (bf16_route(w)) {
      if (opt_.gemm_min_rows == 1) return false;
      m = Gemv{DType::bf16, repacked(w), 0, N, nullptr};
      return true;
    }
    if (f16_route(w)) {
      if (opt_.gemm_min_rows == 1) return false;
      m = Gemv{DType::f16, repacked(w), 0, N, nullptr};
      return true;
    }
    if (opt_.exact_matmul && dtype_traits(w.dtype).block_size > 1) { // every block type exact
      if (opt_.gemm_min_rows == 1 || !dq_route(w, true)) return false;
      m = Gemv{w.dtype, static_cast<const uint8_t*>(w.data), row_bytes(w.dtype, K), N, nullptr};
      return true;
    }
    if (opt_.repack && repackable(opt_.isa, w.dtype, K, N)) {
      if (quant_copy_gemm_rows(w.dtype) == 1) return false;
      m = Gemv{w.dtype, repacked(w), 0, N, nullptr};
      return true;
    }
    if (i8dq_route(w, false)) {
      if (opt_.gemm_min_rows == 1) return false;
      m = Gemv{w.dtype, static_cast<const uint8_t*>(w.data), row_bytes(w.dtype, K), N, nullptr, true};
      return true;
    }
    const bool plain = w.dtype == DType::f32 || w.dtype == DType::f16 || w.dtype == DType::bf16;
    if (opt_.gemm_min_rows == 1 || !(dq_route(w) || (plain && gemv_multi_supports(opt_.isa, w.dtype, false))))
      return false;
    m = Gemv{w.dtype, static_cast<const uint8_t*>(w.data), row_bytes(w.dtype, K), N, nullptr};
    return true;
  }

  // A run of matmuls of one token by the same activation starting at node i (q, k, v; gate, up) in one
  // parallel region, the threads going from one matrix to the next without waiting (gemv_multi): the
  // same kernels as one at a time, so the same floats. Returns the nodes it ran; 0: none (not such a run).
  size_t fused_gemv(const Graph& g, size_t i) {
    if (!opt_.fused_decode || g.nodes[i].op != OpKind::matmul) return 0;
    gemvs_.clear();
    int32_t xid = -1;
    for (size_t j = i; j < g.nodes.size(); ++j) {
      const Node& n = g.nodes[j];
      if (n.op != OpKind::matmul || (j > i && n.src[1] != xid)) break;
      const TensorDesc& w = g.tensors[static_cast<size_t>(n.src[0])];
      const TensorDesc& x = g.tensors[static_cast<size_t>(n.src[1])];
      Gemv m{};
      if (x.n_rows() != 1 || x.ne[0] != w.ne[0] || !gemv_route(w, m)) break;
      m.y = f32(n.dst);
      xid = n.src[1];
      gemvs_.push_back(m);
    }
    if (gemvs_.size() < 2) return 0;
    const TensorDesc& x = g.tensors[static_cast<size_t>(xid)];
    gemv_multi(opt_.isa, gemvs_.data(), static_cast<int>(gemvs_.size()), x.ne[0], f32(xid), threads_);
    return gemvs_.size();
  }

  // Whether w is multiplied exactly from its own rows in place (kernels_dq.cpp): the block types without an
  // int8 kernel of their own where they are not repacked (Q5_1 below avx512_vnni; it and Q2_K, Q3_K, Q5_K,
  // IQ4_NL, IQ4_XS, Q4_1, Q5_0 with repack off or rows not a multiple of 8), and with `exact` (the
  // logits' matmul under exact_logits) every block type.
  bool dq_route(const TensorDesc& w, bool exact = false) const noexcept {
    return dq_supports(opt_.isa, w.dtype) && (exact || (!has_kernel(w.dtype) && !repack_route(w))) &&
           w.ne[2] == 1 && w.ne[3] == 1 && w.ne[0] % dtype_traits(w.dtype).block_size == 0;
  }

  // Whether w is a matrix of a repackable type (cpu::repackable at this level) that its int8 kernels
  // multiply from the repacked copy (when nothing asks for exact products).
  bool repack_route(const TensorDesc& w) const noexcept {
    return opt_.repack && repackable(opt_.isa, w.dtype, w.ne[0], w.ne[1]) && w.ne[2] == 1 && w.ne[3] == 1;
  }

  // Whether w (Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS; Q4_1, Q5_0 — any of them when not repacked) takes the
  // int8 route on its GGUF rows for decode and batches under gemm_min_rows (longer batches: the exact GEMM on
  // dequantized panels); not under exact_matmul, nor for the logits' matmul under exact_logits (`exact`).
  bool i8dq_route(const TensorDesc& w, bool exact) const noexcept {
    return !exact && !opt_.exact_matmul && i8dq_supports(opt_.isa, w.dtype) && w.ne[2] == 1 && w.ne[3] == 1 &&
           w.ne[0] % dtype_traits(w.dtype).block_size == 0 && !repack_route(w);
  }

  // What matmul(w, …, exact) and gemv_route(w) repack, repacked now (load time).
  // in_file: as repacked()'s.
  void prepare_matmul(const TensorDesc& w, bool exact, int in_file = -1) {
    const int64_t K = w.ne[0], N = w.ne[1];
    if (i8dq_route(w, exact) || dq_route(w, exact) || (exact && dtype_traits(w.dtype).block_size > 1)) return;
    if (bf16_route(w) || f16_route(w) ||
        (opt_.repack && repackable(opt_.isa, w.dtype, K, N) && w.ne[2] == 1 && w.ne[3] == 1 &&
         !(opt_.exact_matmul && dtype_traits(w.dtype).block_size > 1)))
      (void)repacked(w, in_file);
  }

  // ---- mixture of experts ----

  // Expert e of stacked weights [K, N, E] as a matrix of its own (a view of its N rows): every route a
  // matrix takes (repacked copies, the int8 and exact kernels, oneDNN) takes it, one copy per expert.
  static TensorDesc expert_view(const TensorDesc& w, int64_t e) {
    TensorDesc v;
    v.name = w.name;
    v.kind = w.kind;
    v.dtype = w.dtype;
    v.ne = {w.ne[0], w.ne[1], 1, 1};
    v.data = static_cast<const uint8_t*>(w.data) +
             static_cast<size_t>(e) * static_cast<size_t>(w.ne[1]) * row_bytes(w.dtype, w.ne[0]);
    return v;
  }

  // moe_route: each token's experts and weights (the SDK's moe_route_token, the reference's own code).
  void moe_route(const Graph& g, const Node& n, float* dst) {
    const TensorDesc& lg = g.tensors[static_cast<size_t>(n.src[0])];
    const TensorDesc& d = g.tensors[static_cast<size_t>(n.dst)];
    const auto E = static_cast<int32_t>(lg.ne[0]);
    const int64_t k = d.ne[0], T = lg.n_rows();
    LOOM_ASSERT(k == n.moe.n_used && k <= E && d.ne[1] == 2, "moe_route: the route's shape");
    const float* bias = n.src[1] >= 0 ? vec(g, n.src[1]) : nullptr;
    const float* logits = f32(n.src[0]);
#pragma omp parallel if (T >= 64)
    {
      MoeScratch scratch;
#pragma omp for schedule(static)
      for (int64_t t = 0; t < T; ++t)
        moe_route_token(n.moe, logits + t * E, bias, E, dst + t * 2 * k, dst + t * 2 * k + k, scratch);
    }
  }

  // matmul_id: the rows that chose each expert gathered and multiplied by its matrix (matmul(): the route
  // a matrix of that many rows takes), the products scattered to their (token, slot); one token: every
  // selected expert's product in one parallel region (fused_gemv_id).
  void matmul_id(const Graph& g, const Node& n, float* dst) {
    const TensorDesc& w = g.tensors[static_cast<size_t>(n.src[0])];
    const TensorDesc& x = g.tensors[static_cast<size_t>(n.src[1])];
    const TensorDesc& d = g.tensors[static_cast<size_t>(n.dst)];
    const int64_t K = w.ne[0], N = w.ne[1], E = w.ne[2], k = d.ne[1], T = d.ne[2], B = x.ne[1];
    LOOM_ASSERT(x.ne[0] == K && (B == 1 || B == k), "matmul_id: operand shapes");
    const float* route = f32(n.src[2]);
    const float* xs = f32(n.src[1]);
    expert_rows_.resize(static_cast<size_t>(E));
    for (auto& r : expert_rows_)
      r.clear();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < k; ++i) {
        const auto e = static_cast<int64_t>(route[t * 2 * k + i]);
        LOOM_ASSERT(e >= 0 && e < E, "matmul_id: an expert id outside the weights");
        expert_rows_[static_cast<size_t>(e)].push_back(t * k + i);
      }
    const auto x_of = [&](int64_t r) { return xs + (B == 1 ? r / k : r) * K; }; // row r = t·k + i
    if (T > 1 && experts_on_int8_gemm(w)) {
      matmul_id_by_expert(w, x_of, dst);
      return;
    }
    for (int64_t e = 0; e < E; ++e) {
      const std::vector<int64_t>& rows = expert_rows_[static_cast<size_t>(e)];
      if (rows.empty()) continue;
      const TensorDesc v = expert_view(w, e);
      if (rows.size() == 1) {
        matmul(v, x_of(rows[0]), 1, dst + rows[0] * N, opt_.exact_matmul);
        continue;
      }
      const auto c = static_cast<int64_t>(rows.size());
      moe_x_.resize(static_cast<size_t>(c * K));
      moe_y_.resize(static_cast<size_t>(c * N));
      for (int64_t r = 0; r < c; ++r)
        std::memcpy(moe_x_.data() + r * K, x_of(rows[static_cast<size_t>(r)]), static_cast<size_t>(K) * 4);
      matmul(v, moe_x_.data(), c, moe_y_.data(), opt_.exact_matmul);
      for (int64_t r = 0; r < c; ++r)
        std::memcpy(dst + rows[static_cast<size_t>(r)] * N, moe_y_.data() + r * N,
                    static_cast<size_t>(N) * 4);
    }
  }

  // Whether stacked experts w take the repacked int8 GEMM at every batch size (int8_gemm: matmul()'s route
  // for them, whatever their rows), so that each expert's product can run on one thread
  // (matmul_id_by_expert).
  bool experts_on_int8_gemm(const TensorDesc& w) const noexcept {
    return !opt_.exact_matmul && opt_.repack && int8_gemm(opt_.isa, w.dtype) &&
           repackable(opt_.isa, w.dtype, w.ne[0], w.ne[1]) && w.dtype != DType::q4_1;
  }

  // A prompt's matmul_id on the repacked int8 GEMM: the threads take whole experts (one parallel region, no
  // barrier per expert; the kernels and their sums as matmul() runs them, on one thread each), each expert's
  // rows gathered into the thread's own buffer. expert_rows_ holds each expert's rows.
  template <class XOf> void matmul_id_by_expert(const TensorDesc& w, XOf x_of, float* dst) {
    const int64_t K = w.ne[0], N = w.ne[1], E = w.ne[2];
    moe_packed_.assign(static_cast<size_t>(E), nullptr);
    for (int64_t e = 0; e < E; ++e) // (the copies made at load: found, never made here in parallel)
      if (!expert_rows_[static_cast<size_t>(e)].empty())
        moe_packed_[static_cast<size_t>(e)] = repacked(expert_view(w, e));
#pragma omp parallel num_threads(threads_)
    {
      std::vector<float> xg, yg;
#pragma omp for schedule(dynamic, 1)
      for (int64_t e = 0; e < E; ++e) {
        const std::vector<int64_t>& rows = expert_rows_[static_cast<size_t>(e)];
        if (rows.empty()) continue;
        const auto c = static_cast<int64_t>(rows.size());
        xg.resize(static_cast<size_t>(c * K));
        yg.resize(static_cast<size_t>(c * N));
        for (int64_t r = 0; r < c; ++r)
          std::memcpy(xg.data() + r * K, x_of(rows[static_cast<size_t>(r)]), static_cast<size_t>(K) * 4);
        matmul_repacked(opt_.isa, w.dtype, moe_packed_[static_cast<size_t>(e)], K, N, xg.data(), c, yg.data(),
                        1);
        for (int64_t r = 0; r < c; ++r)
          std::memcpy(dst + rows[static_cast<size_t>(r)] * N, yg.data() + r * N, static_cast<size_t>(N) * 4);
      }
    }
  }

  // A run of one-token matmul_id nodes of the same activation and route starting at node i (the experts'
  // gate and up; down, whose slots have activations of their own) in one parallel region over every
  // selected expert's matrix (gemv_multi, the kernels matmul() runs for one token). Returns the nodes it ran;
  // 0: none (not such a run).
  size_t fused_gemv_id(const Graph& g, size_t i) {
    if (!opt_.fused_decode || g.nodes[i].op != OpKind::matmul_id) return 0;
    gemvs_.clear();
    const Node& first = g.nodes[i];
    size_t j = i;
    for (; j < g.nodes.size(); ++j) {
      const Node& n = g.nodes[j];
      if (n.op != OpKind::matmul_id || n.src[1] != first.src[1] || n.src[2] != first.src[2]) break;
      const TensorDesc& w = g.tensors[static_cast<size_t>(n.src[0])];
      const TensorDesc& x = g.tensors[static_cast<size_t>(n.src[1])];
      const TensorDesc& d = g.tensors[static_cast<size_t>(n.dst)];
      if (d.ne[2] != 1 || (x.ne[1] != 1 && x.ne[1] != d.ne[1]) || x.ne[0] != w.ne[0]) break;
      const float* route = f32(n.src[2]);
      for (int64_t s = 0; s < d.ne[1]; ++s) {
        const auto e = static_cast<int64_t>(route[s]);
        LOOM_ASSERT(e >= 0 && e < w.ne[2], "matmul_id: an expert id outside the weights");
        Gemv m{};
        if (!gemv_route(expert_view(w, e), m)) return 0;
        m.y = f32(n.dst) + s * w.ne[1];
        if (x.ne[1] > 1) m.x = f32(n.src[1]) + s * x.ne[0]; // this slot's own activation
        gemvs_.push_back(m);
      }
    }
    if (gemvs_.size() < 2) return 0;
    const TensorDesc& x = g.tensors[static_cast<size_t>(first.src[1])];
    gemv_multi(opt_.isa, gemvs_.data(), static_cast<int>(gemvs_.size()), x.ne[0], f32(first.src[1]),
               threads_);
    return j - i;
  }

  // add_id: each slot's row plus its expert's bias row.
  void add_id(const Graph& g, const Node& n, float* dst) {
    const TensorDesc& y = g.tensors[static_cast<size_t>(n.src[0])];
    const TensorDesc& bias = g.tensors[static_cast<size_t>(n.src[1])];
    const int64_t N = y.ne[0], k = y.ne[1], T = y.ne[2];
    LOOM_ASSERT(bias.ne[0] == N, "add_id: the biases' rows");
    const float* route = f32(n.src[2]);
    const float* ys = f32(n.src[0]);
    const float* b = vec(g, n.src[1]);
    for (int64_t r = 0; r < k * T; ++r) {
      const auto e = static_cast<int64_t>(route[(r / k) * 2 * k + r % k]);
      LOOM_ASSERT(e >= 0 && e < bias.n_rows(), "add_id: an expert id outside the biases");
      for (int64_t j = 0; j < N; ++j)
        dst[r * N + j] = ys[r * N + j] + b[e * N + j];
    }
  }

  // moe_combine: each token's expert outputs weighed and summed in slot order (the reference's order).
  void moe_combine(const Graph& g, const Node& n, float* dst) {
    const TensorDesc& y = g.tensors[static_cast<size_t>(n.src[0])];
    const int64_t N = y.ne[0], k = y.ne[1], T = y.ne[2];
    const float* route = f32(n.src[1]);
    const float* ys = f32(n.src[0]);
#pragma omp parallel for schedule(static) if (T * N * k > 65536)
    for (int64_t t = 0; t < T; ++t) {
      float* out = dst + t * N;
      const float* wt = route + t * 2 * k + k;
      for (int64_t j = 0; j < N; ++j)
        out[j] = 0.0f;
      for (int64_t i = 0; i < k; ++i) {
        const float wi = wt[i];
        const float* yi = ys + (t * k + i) * N;
        for (int64_t j = 0; j < N; ++j)
          out[j] += wi * yi[j];
      }
    }
  }

  // matmul() of a BF16 / F16 matrix on its 64-row copy (bf16_route / f16_route).
  void matmul_x64(const TensorDesc& w, const float* x, int64_t T, float* y) {
    const int64_t K = w.ne[0], N = w.ne[1];
    const auto* wp = reinterpret_cast<const uint16_t*>(repacked(w));
    if (f16_route(w)) {
      if (opt_.gemm_min_rows > 0 && opt_.gemm_min_rows_f16 > 0 &&
          T >= std::max(opt_.gemm_min_rows, opt_.gemm_min_rows_f16))
        gemm_panels_of(x, T, N, K, y, 64, [&](int64_t j, int64_t n, float* rows) {
          dequantize_f16x64_rows(opt_.isa, wp, K, j, n, rows);
        });
      else
        matmul_f16x64(opt_.isa, wp, K, N, x, T, y, threads_);
    } else if (opt_.gemm_min_rows > 0 && T >= opt_.gemm_min_rows) {
      if (!bf16_impl_.empty()) { // the copy is oneDNN's blocked layout: read in place
        round_to_bf16(x, T, K);
        gemm_bf16_rounded(reinterpret_cast<const uint8_t*>(wp), T, N, K, y, N, true);
      } else
        gemm_panels(x, T, N, K, y, [&](int64_t j, float* row) { dequantize_bf16x64(wp, K, j, row); });
    } else {
      matmul_bf16x64(opt_.isa, wp, K, N, x, T, y, threads_);
    }
  }

  // The batch size from which a repacked quantized matrix's products are oneDNN's f32 GEMM on dequantized
  // panels (0: never, the int8 GEMM or the one-token kernels at every size; repacked_loop_light).
  int quant_copy_gemm_rows(DType t) const noexcept {
    return int8_gemm(opt_.isa, t)             ? 0
           : repacked_loop_light(opt_.isa, t) ? opt_.gemm_min_rows_quant
                                              : opt_.gemm_min_rows;
  }

  // matmul() of a quantized matrix on its repacked copy. Q4_1 keeps exact products for batches of
  // gemm_min_rows or more: a prompt's logits are then those of exact matmuls (SmolLM2's "What is the capital
  // of France?" turns on a 0.08 tie that rounding the activations to 8 bits flips, as llama.cpp's does) — on
  // AMX bf16 tiles where the CPU has them (exact_tiles), else its rows dequantized into oneDNN's f32 GEMM.
  // gemm_min_rows above the prompt: int8 throughout. x_key: as matmul()'s.
  void matmul_quant_copy(const TensorDesc& w, const float* x, int64_t T, float* y, int64_t x_key) {
    const int64_t K = w.ne[0], N = w.ne[1];
    const uint8_t* wp = repacked(w);
    const bool exact_batch = (w.dtype == DType::q4_1) && opt_.gemm_min_rows > 0 && T >= opt_.gemm_min_rows;
    if (exact_batch && exact_tiles(opt_.isa, w.dtype, N)) {
      matmul_repacked_exact(w.dtype, wp, K, N, x, T, y, threads_, tiles_, x_key >= 0 && x_key == tiles_x_);
      tiles_x_ = x_key;
    } else if (const int rows = quant_copy_gemm_rows(w.dtype); exact_batch || (rows > 0 && T >= rows)) {
      gemm_panels(x, T, N, K, y,
                  [&](int64_t j, float* row) { dequantize_repacked(opt_.isa, w.dtype, wp, K, N, j, row); });
    } else {
      matmul_repacked(opt_.isa, w.dtype, wp, K, N, x, T, y, threads_);
    }
  }

  // y[T][N] = x[T][K] · Wᵀ; exact: the logits' matmul under exact_logits (no activation rounded).
  // x_key: x's tensor in this compute (compute_serial_ · 2^32 + its id; -1: unnamed), which lets consecutive
  // matmuls of the same activations share their split on the exact tiles.
  void matmul(const TensorDesc& w, const float* x, int64_t T, float* y, bool exact = false,
              int64_t x_key = -1) {
    const int64_t K = w.ne[0], N = w.ne[1];
    const auto* base = static_cast<const uint8_t*>(w.data);
    const size_t rb = row_bytes(w.dtype, K);
    if (i8dq_route(w, exact) && !(opt_.gemm_min_rows > 0 && T >= opt_.gemm_min_rows)) {
      matmul_i8dq(opt_.isa, w.dtype, base, rb, K, N, x, T, y, threads_);
      return;
    }
    if (dq_route(w, exact)) { // exact products: a GEMM on dequantized panels, or our FMA kernels
      if (opt_.gemm_min_rows > 0 && T >= opt_.gemm_min_rows)
        gemm_panels(x, T, N, K, y, [&](int64_t j, float* row) {
          dequantize_dq(w.dtype, base + static_cast<size_t>(j) * rb, row, K);
        });
      else
        matmul_dq(w.dtype, base, rb, K, N, x, T, y, threads_);
      return;
    }
    if (exact && dtype_traits(w.dtype).block_size > 1) {
      rows_dequantized(w, x, T, y); // below avx2: the exact head without the dq kernels
      return;
    }
    if (bf16_route(w) || f16_route(w)) {
      matmul_x64(w, x, T, y);
      return;
    }
    if (opt_.repack && repackable(opt_.isa, w.dtype, K, N) && w.ne[2] == 1 && w.ne[3] == 1) {
      matmul_quant_copy(w, x, T, y, x_key);
      return;
    }
    if (opt_.gemm_min_rows > 0 && T >= opt_.gemm_min_rows) {
      if (w.dtype == DType::bf16 && !bf16_impl_.empty() && w.ne[2] == 1 && w.ne[3] == 1) {
        gemm_bf16(x, base, T, N, K, y);
        return;
      }
      if (w.dtype == DType::f32) { // straight from the model file
        gemm(x, reinterpret_cast<const float*>(base), static_cast<int64_t>(rb / sizeof(float)), T, N, K, y,
             N);
        return;
      }
      gemm_panels(x, T, N, K, y, [&](int64_t j, float* row) {
        dequantize(opt_.isa, w.dtype, base + static_cast<size_t>(j) * rb, row, K);
      });
      return;
    }
    if (has_kernel(w.dtype)) {
      cpu::matmul(opt_.isa, w.dtype, base, rb, K, N, x, T, y, threads_);
      return;
    }
    rows_dequantized(w, x, T, y);
  }

  // Whether the output head w takes head_rescored under exact_logits: a block type (whose own kernels round
  // the activations), with logits_rescore > 0 and exact_matmul off.
  bool rescored_head(const TensorDesc& w) const noexcept {
    return opt_.logits_rescore > 0 && !opt_.exact_matmul && dtype_traits(w.dtype).block_size > 1;
  }

  // The output head under exact_logits at the cost of the fast route: the whole vocabulary on the weight
  // type's own kernels (activations rounded to int8), then each row's logits_rescore highest recomputed
  // exactly (the row dequantized, an f32 dot) — greedy, and top-k up to that many, see exact logits; the
  // tail keeps the int8 route's (≈ 1e-2 off). Gemma 3's head (262 144 × 640) is most of its decode step
  // exactly; this way it costs what its int8 kernel does.
  void head_rescored(const TensorDesc& w, const float* x, int64_t T, float* y) {
    matmul(w, x, T, y, false);
    const int64_t K = w.ne[0], N = w.ne[1];
    const auto c = static_cast<size_t>(std::min<int64_t>(opt_.logits_rescore, N));
    const uint8_t* copy = exact_copy(w);
    std::vector<float> row(static_cast<size_t>(K));
    std::vector<std::pair<float, int64_t>> top; // a min-heap of the c highest (NaN never enters)
    top.reserve(c);
    const auto lower = [](const auto& a, const auto& b) { return a.first > b.first; };
    for (int64_t t = 0; t < T; ++t) {
      float* yt = y + t * N;
      top.clear();
      for (int64_t j = 0; j < N; ++j) {
        const float v = yt[j];
        if (top.size() < c) {
          if (v == v) top.emplace_back(v, j);
          if (top.size() == c) std::make_heap(top.begin(), top.end(), lower);
        } else if (v > top.front().first) {
          std::pop_heap(top.begin(), top.end(), lower);
          top.back() = {v, j};
          std::push_heap(top.begin(), top.end(), lower);
        }
      }
      for (const auto& [v, j] : top) {
        weight_row(w, copy, j, row.data());
        yt[j] = vdot(row.data(), x + t * K, static_cast<int32_t>(K));
      }
    }
  }

  // y = x · Wᵀ with each row of W dequantized to f32 (the SDK's values), then dotted: exact, and the route of
  // the block types below avx2 (and of the logits' matmul there under exact_logits).
  void rows_dequantized(const TensorDesc& w, const float* x, int64_t T, float* y) {
    const int64_t K = w.ne[0], N = w.ne[1];
    const uint8_t* copy = exact_copy(w);
#pragma omp parallel if (N * K * T > 32768)
    {
      std::vector<float> row(static_cast<size_t>(K));
#pragma omp for schedule(static)
      for (int64_t j = 0; j < N; ++j) {
        weight_row(w, copy, j, row.data());
        for (int64_t t = 0; t < T; ++t)
          y[t * N + j] = vdot(row.data(), x + t * K, static_cast<int32_t>(K));
      }
    }
  }

  // y[T][N] = x[T][K] · Wᵀ on oneDNN's sgemm, W's rows dequantized by row(j, out) a panel at a time
  // (≈ 8 MiB, cache-sized, a multiple of 8 rows): the conversion costs O(N·K) against the GEMM's
  // O(T·N·K), and no second copy of the weights is kept.
  template <class RowFn>
  void gemm_panels(const float* x, int64_t T, int64_t N, int64_t K, float* y, RowFn row) {
    gemm_panels_of(x, T, N, K, y, 1, [&](int64_t j, int64_t, float* out) { row(j, out); });
  }

  // The same with rows(j, n, out) dequantizing n ≤ unit consecutive rows (K apart) at a time: panels a
  // multiple of `unit` rows (the f16x64 copy converts whole 64-row groups).
  template <class RowsFn>
  void gemm_panels_of(const float* x, int64_t T, int64_t N, int64_t K, float* y, int64_t unit,
                      RowsFn rows_fn) {
    const int64_t m = std::max<int64_t>(8, unit);
    const int64_t rows = std::min<int64_t>(std::max<int64_t>((int64_t{8} << 20) / (K * 4), 2 * m) / m * m, N);
    panel_.resize(static_cast<size_t>(rows * K));
    for (int64_t j0 = 0; j0 < N; j0 += rows) {
      const int64_t nr = std::min(rows, N - j0);
      float* pw = panel_.data();
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < nr; r += unit)
        rows_fn(j0 + r, std::min(unit, nr - r), pw + r * K);
      gemm(x, pw, K, T, nr, K, y + j0, N);
    }
  }

  // oneDNN's matmul of bf16 activations [T][K] by bf16 weights [N][K] (as the K×N matrix in "ba" layout,
  // i.e. the weight rows in place) into f32 [T][N]; one primitive per shape, in prims_.
  dnnl::matmul::primitive_desc bf16_matmul(int64_t T, int64_t N, int64_t K, int64_t ldy,
                                           bool blocked = false) const {
    using md = dnnl::memory::desc;
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    return {dnnl::matmul::desc(md({T, K}, dt::bf16, tag::ab),
                               md({K, N}, dt::bf16, blocked ? tag::BA16a64b2a : tag::ba),
                               md({T, N}, dt::f32, dnnl::memory::dims{ldy, 1})),
            engine_};
  }

  // y[T][N] = bf16(x)[T][K] · Wᵀ for BF16 weights w (N rows of K, in place).
  void gemm_bf16(const float* x, const uint8_t* w, int64_t T, int64_t N, int64_t K, float* y) {
    round_to_bf16(x, T, K);
    gemm_bf16_rounded(w, T, N, K, y, N);
  }

  void round_to_bf16(const float* x, int64_t T, int64_t K) {
    xbf16_.resize(static_cast<size_t>(T * K));
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; ++t)
      to_bf16(opt_.isa, x + t * K, xbf16_.data() + t * K, K);
  }

  // y[T][N] (rows ldy apart) = xbf16_[T][K] · Wᵀ, W: N bf16 rows of K, or (blocked) a bf16x64 copy.
  void gemm_bf16_rounded(const uint8_t* w, int64_t T, int64_t N, int64_t K, float* y, int64_t ldy,
                         bool blocked = false) {
    try {
      dnnl::matmul& prim = prims_.get({dnnl::memory::data_type::bf16, T, N, K, K, ldy, blocked},
                                      [&] { return bf16_matmul(T, N, K, ldy, blocked); });
      using md = dnnl::memory::desc;
      using dt = dnnl::memory::data_type;
      using tag = dnnl::memory::format_tag;
      dnnl::memory src(md({T, K}, dt::bf16, tag::ab), engine_, xbf16_.data());
      dnnl::memory wts(md({K, N}, dt::bf16, blocked ? tag::BA16a64b2a : tag::ba), engine_,
                       const_cast<uint8_t*>(w));
      dnnl::memory dst(md({T, N}, dt::f32, dnnl::memory::dims{ldy, 1}), engine_, y);
      prim.execute(stream_, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wts}, {DNNL_ARG_DST, dst}});
      stream_.wait();
    } catch (const dnnl::error& e) {
      fail(Errc::internal, "cpu", std::string("oneDNN bf16 matmul failed: ") + e.what());
    }
  }

  // C[T][n] (ldc) = A[T][K] · B[n][K]ᵀ (ldb) on oneDNN's f32 matmul primitive (one per shape, in prims_; the
  // weight rows in place as the K×n matrix "ba" with stride ldb): its brgemm kernel measured 470–480
  // GFLOP/s on two Zen 5 cores where dnnl_sgemm gave 360–380 (T = 512, K = 2048, n = 2048 / 5632).
  // dnnl_sgemm when no primitive can be made. A C with rows ldc > n apart (a panel's columns of the
  // output) goes through a contiguous buffer: with a strided destination oneDNN 2.6 leaves brgemm for
  // its gemm:jit kernel (360 GFLOP/s against 465).
  void gemm(const float* a, const float* b, int64_t ldb, int64_t T, int64_t n, int64_t K, float* c,
            int64_t ldc) {
    if (ldc != n) {
      gemm_out_.resize(static_cast<size_t>(T * n));
      gemm(a, b, ldb, T, n, K, gemm_out_.data(), n);
      const float* src = gemm_out_.data();
#pragma omp parallel for schedule(static) if (T * n > 65536)
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(c + t * ldc, src + t * n, static_cast<size_t>(n) * sizeof(float));
      return;
    }
    using md = dnnl::memory::desc;
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    const md src_md({T, K}, dt::f32, dims{K, 1}), wts_md({K, n}, dt::f32, dims{1, ldb}),
        dst_md({T, n}, dt::f32, dims{ldc, 1});
    dnnl::matmul* prim = nullptr;
    try {
      prim = &prims_.get({dt::f32, T, n, K, ldb, ldc, false}, [&] {
        return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_md, wts_md, dst_md), engine_);
      });
    } catch (const dnnl::error&) {
      prim = nullptr; // this oneDNN has no matmul for the shape: its sgemm below
    }
    if (prim != nullptr) {
      try {
        dnnl::memory src(src_md, engine_, const_cast<float*>(a));
        dnnl::memory wts(wts_md, engine_, const_cast<float*>(b));
        dnnl::memory dst(dst_md, engine_, c);
        prim->execute(stream_, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wts}, {DNNL_ARG_DST, dst}});
        stream_.wait();
        return;
      } catch (const dnnl::error& e) {
        fail(Errc::internal, "cpu", std::string("oneDNN f32 matmul failed: ") + e.what());
      }
    }
    const dnnl_status_t st = dnnl_sgemm('N', 'T', T, n, K, 1.0f, a, K, b, ldb, 0.0f, c, ldc);
    if (st != dnnl_success)
      fail(Errc::internal, "cpu",
           "oneDNN sgemm failed (status " + std::to_string(static_cast<int>(st)) + ")");
  }

  CpuOptions opt_;
  std::unique_ptr<sdk::OpProfile> profile_; // [backend] profile
  int threads_;
  bool avx2_;
  std::string description_;
  int32_t logits_ = -1;      // the logits' matmul output in the graph being computed
  std::vector<float> arena_; // every activation of the graph, one slab
  std::vector<size_t> offsets_;
  std::vector<float> panel_; // dequantized weight rows for the GEMM
  ExactTilesWork tiles_;     // the exact tiles' activations and weights (matmul_repacked_exact)
  int64_t tiles_x_ = -1;     // the activations tiles_.a holds: compute_serial_ · 2^32 + their tensor, or -1
  int64_t compute_serial_ = 0; // compute() calls so far
  std::vector<RopeTables> rope_tables_;
  std::vector<Gemv> gemvs_;                       // fused_gemv's run
  std::vector<std::vector<int64_t>> expert_rows_; // matmul_id: each expert's rows (token · k + slot)
  std::vector<float> moe_x_, moe_y_;              // matmul_id: one expert's gathered rows and products
  std::vector<const uint8_t*> moe_packed_;        // matmul_id_by_expert: each expert's repacked copy
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  std::string bf16_impl_;       // oneDNN's bf16 matmul kernel when BF16 weights take that route, else empty
  std::vector<uint16_t> xbf16_; // activations rounded to bf16
  MatmulPrimitives prims_{32};  // ~65 KB each: the decode batch sizes and the last prefill lengths
  std::vector<float> gemm_out_; // a panel's GEMM output before it goes to its columns
  std::map<std::tuple<const void*, int64_t, int64_t>, std::shared_ptr<uint8_t>> repacked_; // by data, K, N
  size_t shared_weights_ = 0; // bytes of repacked matrices another backend had made (held, not copied)
  std::map<std::pair<const void*, int64_t>, std::vector<float>> vectors_; // vector weights, copied once
  std::vector<std::pair<const void*, size_t>> dropped_; // file ranges whose pages were dropped
  bool redrop_ = false; // a compute repacked something: drop those ranges again at its end
  // bytes of weight copies (repacked matrices, vectors) whose originals stay resident (heap weights,
  // writable mappings): a second copy, so counted as workspace
  size_t copies_extra_ = 0;
  size_t workspace_ = 0;
};

} // namespace

size_t shared_repacked_matrices() {
  SharedRepacks& s = shared_repacks();
  std::lock_guard<std::mutex> lock(s.mu);
  return static_cast<size_t>(
      std::count_if(s.copies.begin(), s.copies.end(), [](const auto& e) { return !e.second.expired(); }));
}

std::unique_ptr<Backend> make_cpu_backend(const CpuOptions& opt) {
  return std::make_unique<CpuBackend>(opt);
}

} // namespace loom::cpu
