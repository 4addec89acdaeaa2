// loom/sdk/executor.hpp — the C++ side of a backend (header-only): an executor runs a whole
// loom::Graph for one batch over the KV cache's rows. The host's built-in backends implement it, and
// a backend plugin exposes one through loom/sdk/executor_plugin.hpp (ExecutorTable), so the same
// executor code runs built in or behind the ABI.
#pragma once

#include "loom/sdk/dtype.hpp"
#include "loom/sdk/error.hpp"
#include "loom/sdk/graph.hpp"
#include "loom/sdk/types.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <sys/mman.h>
#include <vector>

namespace loom {

// The KV pool: K and V of every layer in blocks of block_size positions, in one buffer the backend
// allocated (Backend::alloc, BufferUsage::kv). Byte layout, the same on every backend (the C ABI's
// loom_kv_layout):
//   [n_layer][2: K, V][n_blocks][block_size][n_head_kv · head_dim values of dtype]
// (dtype f32, f16, bf16, or q8_0 with its blocks of 32 along the row). The host's KVCacheStore keeps the
// accounting (which blocks each sequence holds); a contiguous store is the same shape with one block of
// n_ctx positions per sequence.
//
// Layer groups (vLLM's hybrid KV cache; set_groups): a block holds the rows of n_slots() layers, the pool is
// [n_slots][2][n_blocks][block_size][row], and layer l's rows lie in slot layer_slot()[l] of the blocks of
// group layer_group()[l]. Each group has its own block tables (KVRows) over the one pool: a hybrid model's
// sliding-window layers are groups whose blocks the host releases past the window, so that a long sequence
// holds its full-attention layers' rows and only a window of the others'. A backend gets such a pool only
// if it declared attn_kv_groups. Without groups every layer is in group 0, in slot = its index.
class KVLayout {
public:
  DType dtype = DType::f32;
  int32_t n_layer = 0, n_head_kv = 0, head_dim = 0;
  int32_t block_size = 0;
  int64_t n_blocks = 0;

  int64_t row_elems() const noexcept { return static_cast<int64_t>(n_head_kv) * head_dim; }
  size_t row_bytes() const noexcept { return loom::row_bytes(dtype, row_elems()); }
  // Bytes of one layer's K (or V) in one block.
  size_t block_bytes() const noexcept { return static_cast<size_t>(block_size) * row_bytes(); }
  size_t bytes() const noexcept {
    return 2 * static_cast<size_t>(n_slots()) * static_cast<size_t>(n_blocks) * block_bytes();
  }

  // Puts layer l in group layer_group[l] (n_layer entries, groups numbered from 0), in the next free slot of
  // that group's blocks (layers in order); a block has as many slots as the largest group has layers.
  // An empty span: one group.
  void set_groups(std::span<const int32_t> layer_group) {
    group_.clear();
    slot_.clear();
    n_groups_ = 1;
    n_slots_ = 0;
    if (layer_group.empty()) return;
    if (layer_group.size() != static_cast<size_t>(n_layer))
      throw Error(Errc::invalid_argument, "backend", "a KV layout's layer groups do not match its layers");
    std::vector<int32_t> used;
    for (const int32_t g : layer_group) {
      if (g < 0 || g >= n_layer)
        throw Error(Errc::invalid_argument, "backend", "a KV layout's layer group is out of range");
      if (static_cast<size_t>(g) >= used.size()) used.resize(static_cast<size_t>(g) + 1, 0);
      slot_.push_back(used[static_cast<size_t>(g)]++);
      n_slots_ = std::max(n_slots_, used[static_cast<size_t>(g)]);
    }
    group_.assign(layer_group.begin(), layer_group.end());
    n_groups_ = static_cast<int32_t>(used.size());
  }
  int32_t n_groups() const noexcept { return n_groups_; }
  int32_t n_slots() const noexcept { return group_.empty() ? n_layer : n_slots_; } // layers a block holds
  std::span<const int32_t> layer_group() const noexcept { return group_; }         // empty: one group
  std::span<const int32_t> layer_slot() const noexcept { return slot_; }           // empty: slot = layer
  int32_t group_of(int32_t layer) const noexcept {
    return group_.empty() ? 0 : group_[static_cast<size_t>(layer)];
  }
  int32_t slot_of(int32_t layer) const noexcept {
    return slot_.empty() ? layer : slot_[static_cast<size_t>(layer)];
  }
  // Byte offset of the row at `off` in `block` of layer `layer`'s K (kv 0) or V (kv 1).
  size_t offset(int32_t layer, int kv, int64_t block, int32_t off) const noexcept {
    return ((static_cast<size_t>(slot_of(layer)) * 2 + static_cast<size_t>(kv)) *
                static_cast<size_t>(n_blocks) +
            static_cast<size_t>(block)) *
               block_bytes() +
           static_cast<size_t>(off) * row_bytes();
  }

private:
  std::vector<int32_t> group_, slot_;
  int32_t n_groups_ = 1, n_slots_ = 0;
};

// Positions [0, n_positions) of block src copied to block dst, K and V of every layer (every slot:
// copy-on-write of a shared block, a fork's copy). A step's copies run in order, before its forward.
struct KVBlockCopy {
  int64_t src = 0, dst = 0;
  int32_t n_positions = 0;
};

// What a buffer of a backend's memory is for (the ABI's LOOM_BUFFER_* values): a backend may place them
// differently (a KV pool committed lazily, logits where the host reads them fastest).
enum class BufferUsage : int32_t { weights = 0, kv = 1, scratch = 2, logits = 3 };

// Memory of a backend's device (Backend::alloc), freed with this object: a KV pool (KVLayout::bytes()), the
// logits compute() writes, anything else. A fresh buffer reads as zeros.
class Buffer {
public:
  virtual ~Buffer() = default;
  // The memory as compute() sees it (an address of the backend's memory; host memory for a CPU backend).
  virtual void* data() noexcept = 0;
  // The backend whose memory this is (nullptr: host memory, which every host-memory backend reads).
  virtual const void* owner() const noexcept { return nullptr; }
  // Block copies on a KV pool of this layout, in order (copy-on-write, a fork's copies).
  virtual void copy(const KVLayout& l, std::span<const KVBlockCopy> copies) = 0;
  // Bytes [offset, offset + n) into host memory, and back (the logits, tests, tools).
  virtual void read(size_t offset, void* dst, size_t n) const = 0;
  virtual void write(size_t offset, const void* src, size_t n) = 0;
};

// Host memory: an anonymous mapping reserved without commitment, so that only the pages a forward writes
// (or a copy reaches) become resident — a KV pool sized for 64 full sequences costs what the live
// positions use.
class HostBuffer final : public Buffer {
public:
  explicit HostBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_ == 0) return;
    void* p =
        mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      throw Error(Errc::out_of_memory, "backend",
                  "cannot reserve " + std::to_string(bytes_ >> 20) +
                      " MiB of address space (a KV pool: lower [kv_cache] max_tokens or [model] n_ctx)");
    data_ = static_cast<uint8_t*>(p);
  }
  ~HostBuffer() override {
    if (data_) munmap(data_, bytes_);
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() noexcept override { return data_; }
  void copy(const KVLayout& l, std::span<const KVBlockCopy> copies) override {
    copy_blocks(data_, l, copies);
  }
  void read(size_t offset, void* dst, size_t n) const override {
    LOOM_ASSERT(offset <= bytes_ && n <= bytes_ - offset, "read outside the buffer");
    std::memcpy(dst, data_ + offset, n);
  }
  void write(size_t offset, const void* src, size_t n) override {
    LOOM_ASSERT(offset <= bytes_ && n <= bytes_ - offset, "write outside the buffer");
    std::memcpy(data_ + offset, src, n);
  }
  // The copies on a pool in host memory (what a host-memory backend's kv_copy does).
  static void copy_blocks(uint8_t* pool, const KVLayout& l, std::span<const KVBlockCopy> copies) noexcept {
    const auto at = [&](int32_t slot, int kv, int64_t block) {
      return ((static_cast<size_t>(slot) * 2 + static_cast<size_t>(kv)) * static_cast<size_t>(l.n_blocks) +
              static_cast<size_t>(block)) *
             l.block_bytes();
    };
    for (const KVBlockCopy& c : copies)
      for (int32_t slot = 0; slot < l.n_slots(); ++slot)
        for (int kv = 0; kv < 2; ++kv)
          std::memmove(pool + at(slot, kv, c.dst), pool + at(slot, kv, c.src),
                       static_cast<size_t>(c.n_positions) * l.row_bytes());
  }

private:
  size_t bytes_;
  uint8_t* data_ = nullptr;
};

// One layer group's part of the KV pool as a forward sees it: where each batch row writes, and the block
// table of each of the batch's sequences (table_stride block ids each).
struct KVGroupRows {
  std::span<const int64_t> slots;
  std::span<const int32_t> tables;
  int32_t table_stride = 0;
};

// The KV pool as one forward sees it (vLLM's shape): batch row t writes its new K / V at slot(t) = block ·
// block_size + offset, and reads the positions of its sequence through that sequence's block table —
// tables[seq_of(t) · table_stride + pos / block_size] (−1: a block the host released, never read: it lies
// outside every query's key_span). With layer groups (KVLayout::set_groups) each group has its own slots
// and tables, and a layer's rows are found through its group's. Rows are raw bytes of layout().dtype: read
// and write them with kv_load / kv_store (dtype.hpp), or type-specific kernels.
class KVRows {
public:
  KVRows() = default;
  KVRows(const KVLayout& l, void* pool, std::span<const int64_t> slots, std::span<const int32_t> row_seq,
         std::span<const int32_t> tables, int32_t table_stride)
      : KVRows(l, pool, row_seq, {KVGroupRows{slots, tables, table_stride}}) {}
  // One entry of `groups` per group of the layout.
  KVRows(const KVLayout& l, void* pool, std::span<const int32_t> row_seq, std::vector<KVGroupRows> groups)
      : l_(l), pool_(static_cast<uint8_t*>(pool)), row_seq_(row_seq), groups_(std::move(groups)) {
    if (groups_.size() != static_cast<size_t>(l_.n_groups()))
      throw Error(Errc::invalid_argument, "backend",
                  "a batch's KV rows do not cover the layout's layer groups");
  }
  const KVLayout& layout() const noexcept { return l_; }
  DType kv_dtype() const noexcept { return l_.dtype; }
  uint8_t* pool() const noexcept { return pool_; }
  // The index of batch row t's sequence among the batch's block tables.
  int32_t seq_of(size_t t) const noexcept { return row_seq_[t]; }
  // Where batch row t's new K (kv 0) / V (kv 1) of `layer` go.
  uint8_t* slot_row(int32_t layer, int kv, size_t t) const noexcept {
    const int64_t s = group(l_.group_of(layer)).slots[t];
    return pool_ + l_.offset(layer, kv, s / l_.block_size, static_cast<int32_t>(s % l_.block_size));
  }
  uint8_t* k_new(int32_t layer, size_t t) const noexcept { return slot_row(layer, 0, t); }
  uint8_t* v_new(int32_t layer, size_t t) const noexcept { return slot_row(layer, 1, t); }
  // K / V of position pos of the batch's sequence `seq` (seq_of(t) of a row t).
  uint8_t* row(int32_t layer, int kv, int32_t seq, Pos pos) const noexcept {
    const KVGroupRows& g = group(l_.group_of(layer));
    const int32_t b = g.tables[static_cast<size_t>(seq) * static_cast<size_t>(g.table_stride) +
                               static_cast<size_t>(pos / l_.block_size)];
    LOOM_ASSERT(b >= 0, "KV row of a released position (outside the sliding window)");
    return pool_ + l_.offset(layer, kv, b, pos % l_.block_size);
  }
  uint8_t* k_at(int32_t layer, int32_t seq, Pos pos) const noexcept { return row(layer, 0, seq, pos); }
  uint8_t* v_at(int32_t layer, int32_t seq, Pos pos) const noexcept { return row(layer, 1, seq, pos); }
  // The arrays themselves (what goes over the ABI): group 0's, and each group's.
  std::span<const int64_t> slots() const noexcept { return group(0).slots; }
  std::span<const int32_t> row_seqs() const noexcept { return row_seq_; }
  std::span<const int32_t> tables() const noexcept { return group(0).tables; }
  int32_t table_stride() const noexcept { return group(0).table_stride; }
  const KVGroupRows& group(int32_t g) const noexcept { return groups_[static_cast<size_t>(g)]; }
  std::span<const KVGroupRows> groups() const noexcept { return groups_; }
  size_t n_seqs() const noexcept {
    const int32_t stride = groups_.empty() ? 0 : groups_[0].table_stride;
    return stride > 0 ? groups_[0].tables.size() / static_cast<size_t>(stride) : 0;
  }

private:
  KVLayout l_;
  uint8_t* pool_ = nullptr;
  std::span<const int32_t> row_seq_;
  std::vector<KVGroupRows> groups_ = std::vector<KVGroupRows>(1);
};

// How the graphs use a weight (the ABI's LOOM_WEIGHT_USE_* bits): a backend that prepares weights at load
// (repacks, uploads) knows what for.
enum WeightUse : uint32_t {
  weight_use_matmul = 1u, // src0 of a matmul other than the logits'
  weight_use_logits = 2u, // src0 of the matmul that makes the logits (the output head)
  weight_use_rows = 4u,   // src0 of get_rows (an embedding table)
  weight_use_vector = 8u, // an element-wise operand: norm weights, biases, RoPE divisors
};

// One weight as the backend gets it at load: the graphs' TensorDesc (its `weight` the id the graphs will
// carry), the bytes in host memory (valid until the backend is destroyed) and how it is used.
struct WeightDesc {
  TensorDesc tensor;
  size_t bytes = 0;
  uint32_t uses = 0;
};

// A device's memory as its backend reports it (Backend::memory_info).
struct MemoryInfo {
  uint64_t free_bytes = 0, total_bytes = 0;
};

// One device that executes model graphs.
class Backend {
public:
  Backend() noexcept : instance_(next_instance()) {}
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  virtual ~Backend() = default;
  // Unique over the process's life (never reused as an address would be): what a model records as
  // having loaded its weights.
  uint64_t instance() const noexcept { return instance_; }
  // What Buffer::owner() of this backend's device memory returns (this object).
  const void* instance_tag() const noexcept { return this; }
  virtual std::string_view name() const noexcept = 0;
  // Whether the backend can run this node (op + dtypes). The model refuses a graph with a node its backend
  // cannot run, in one line naming the op (asked once per graph shape).
  virtual bool supports(const Graph& g, const Node& n) const noexcept = 0;
  // Runs `g` for one batch: inputs from `batch`; each attention node first writes the batch's K/V
  // rows at their slots of `kv` (the host allocated those positions), then attends causally over the
  // sequence's positions through its block table. Writes logits of batch.output_rows to `logits`,
  // row-major [n_outputs][n_vocab]: host memory, or (a device backend) the memory of a buffer it made with
  // BufferUsage::logits — what the plugin ABI's graph_compute hands over.
  virtual void compute(const Graph& g, const BatchView& batch, const KVRows& kv, std::span<float> logits) = 0;
  // The weights of a model, handed over once before its first compute (the host calls it when it
  // loads the model). The backend uploads, repacks or keeps them; it may read them in place from
  // `WeightDesc::tensor.data` until destroyed. Default: keep (read in place).
  virtual void load(std::span<const WeightDesc> weights) { (void)weights; }
  // A buffer of this backend's memory (reads as zeros). Default: host memory.
  virtual std::unique_ptr<Buffer> alloc(size_t bytes, BufferUsage usage) {
    (void)usage;
    return std::make_unique<HostBuffer>(bytes);
  }
  // Free and total bytes of the device's memory; nullopt for host memory (the default).
  virtual std::optional<MemoryInfo> memory_info() const { return std::nullopt; }
  // Bytes of activations + workspace the last compute used (memory accounting).
  virtual size_t workspace_bytes() const noexcept { return 0; }
  // Of workspace_bytes(), the bytes holding activations (the rest is scratch: GEMM panels, …).
  virtual size_t activation_bytes() const noexcept { return workspace_bytes(); }
  // Whether compute() handles KV rows stored in this type (KVRows' rows of KVLayout::dtype).
  virtual bool supports_kv_dtype(DType t) const noexcept { return t == DType::f32; }
  // Whether attention nodes asking for kernel strategy `k` with these AttnFeature bits (window,
  // softcap, sinks) run as asked. The default: its
  // own kernel (auto) with a window and soft-capping; a backend with sinks or a choice of kernels says so.
  virtual bool supports_attention(AttnKernel k, uint32_t features) const noexcept {
    return k == AttnKernel::auto_ && (features & ~(attn_window | attn_softcap)) == 0;
  }
  // One line on what runs (instruction set, threads, device), for reports; "" = nothing to say.
  virtual std::string_view describe() const noexcept { return {}; }

private:
  static uint64_t next_instance() noexcept {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t instance_;
};

} // namespace loom
