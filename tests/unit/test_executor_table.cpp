// The SDK's ExecutorTable — the one loom_backend_i of every backend plugin (reference, cpu, cuda, a third
// party's) — hands its executor what the host sent: token-tree rows in the batch view, buffers the executor
// made itself (device memory where it says), the device's memory. Tested here on the CPU with a recording
// executor, so that what the cuda plugin's kernels receive is checked on machines without a GPU.
#include "loom/sdk/executor_plugin.hpp"

#include <cstring>
#include <gtest/gtest.h>
#include <vector>

namespace {

constexpr char k_name[] = "recording";

// Memory that is not the host's as far as the table knows: every call is counted.
struct Counts {
  int allocs = 0, frees = 0, reads = 0, writes = 0, copies = 0;
  std::vector<loom::BufferUsage> usages;
};

class RecordingBuffer final : public loom::Buffer {
public:
  RecordingBuffer(size_t bytes, Counts& c) : bytes_(bytes, 0), c_(c) {}
  ~RecordingBuffer() override { ++c_.frees; }
  void* data() noexcept override { return bytes_.data(); }
  void copy(const loom::KVLayout&, std::span<const loom::KVBlockCopy> copies) override {
    c_.copies += static_cast<int>(copies.size());
  }
  void read(size_t offset, void* dst, size_t n) const override {
    ++c_.reads;
    std::memcpy(dst, bytes_.data() + offset, n);
  }
  void write(size_t offset, const void* src, size_t n) override {
    ++c_.writes;
    std::memcpy(bytes_.data() + offset, src, n);
  }

private:
  std::vector<uint8_t> bytes_;
  Counts& c_;
};

class Recording final : public loom::Backend {
public:
  explicit Recording(Counts& c) : c_(c) {}
  std::string_view name() const noexcept override { return k_name; }
  bool supports(const loom::Graph&, const loom::Node&) const noexcept override { return true; }
  void compute(const loom::Graph&, const loom::BatchView& b, const loom::KVRows& kv,
               std::span<float> logits) override {
    // Where each layer's row 0 goes and where sequence 0's position of it lies, as pool offsets.
    k_new_at.clear();
    k_at.clear();
    for (int32_t l = 0; l < kv.layout().n_layer && !b.tokens.empty(); ++l) {
      k_new_at.push_back(static_cast<size_t>(kv.k_new(l, 0) - kv.pool()));
      k_at.push_back(static_cast<size_t>(kv.v_at(l, 0, b.positions[0]) - kv.pool()));
    }
    rope.assign(b.rope_positions.begin(), b.rope_positions.end());
    base.assign(b.tree_base.begin(), b.tree_base.end());
    mask.assign(b.tree_mask.begin(), b.tree_mask.end());
    logits_at = logits.data();
  }
  std::unique_ptr<loom::Buffer> alloc(size_t bytes, loom::BufferUsage usage) override {
    ++c_.allocs;
    c_.usages.push_back(usage);
    return std::make_unique<RecordingBuffer>(bytes, c_);
  }
  std::optional<loom::MemoryInfo> memory_info() const override { return loom::MemoryInfo{3, 7}; }
  std::vector<loom::Pos> rope, base;
  std::vector<uint64_t> mask;
  std::vector<size_t> k_new_at, k_at;
  const float* logits_at = nullptr;

private:
  Counts& c_;
};

using Table = loom::sdk::ExecutorTable<k_name>;

struct Plugin {
  Counts counts;
  loom::sdk::ExecutorPlugin p;
  Recording* be = nullptr;
  Plugin() {
    auto r = std::make_unique<Recording>(counts);
    be = r.get();
    p.be = std::move(r);
  }
};

loom_graph empty_graph(int32_t n_tokens) {
  loom_graph g{};
  g.struct_size = sizeof(loom_graph);
  g.tensor_size = sizeof(loom_tensor);
  g.node_size = sizeof(loom_node);
  g.n_tokens = n_tokens;
  g.id = 424242;
  return g;
}

TEST(ExecutorTable, TokenTreeRowsReachTheExecutor) {
  Plugin pl;
  const loom_kv_layout layout{sizeof(loom_kv_layout), LOOM_DTYPE_F32, 1, 1, 4, 16, 2, 0, 0, nullptr, nullptr};
  void* kv = nullptr;
  void* logits = nullptr;
  ASSERT_EQ(Table::table.buffer_alloc(&pl.p, 1024, LOOM_BUFFER_KV, &kv), nullptr);
  ASSERT_EQ(Table::table.buffer_alloc(&pl.p, 64, LOOM_BUFFER_LOGITS, &logits), nullptr);
  const int32_t tokens[3] = {1, 2, 3}, positions[3] = {5, 6, 7}, seqs[3] = {0, 0, 0}, out[1] = {2};
  const int32_t rope[3] = {5, 6, 6}, base[3] = {5, 5, 5}, row_seq[3] = {0, 0, 0}, tables[2] = {0, 1};
  const int64_t slots[3] = {5, 6, 7};
  const uint64_t mask[3] = {0b1, 0b11, 0b101};
  const loom_batch b{sizeof(loom_batch),
                     3,
                     tokens,
                     positions,
                     seqs,
                     1,
                     out,
                     &layout,
                     kv,
                     slots,
                     row_seq,
                     1,
                     tables,
                     2,
                     rope,
                     base,
                     mask,
                     nullptr};
  const loom_graph g = empty_graph(3);
  ASSERT_EQ(Table::table.graph_compute(&pl.p, &g, &b, logits, 4), nullptr);
  EXPECT_EQ(pl.be->rope, (std::vector<loom::Pos>{5, 6, 6}));
  EXPECT_EQ(pl.be->base, (std::vector<loom::Pos>{5, 5, 5}));
  EXPECT_EQ(pl.be->mask, (std::vector<uint64_t>{1, 3, 5}));
  EXPECT_EQ(pl.be->logits_at, logits) << "the logits go to the executor's own buffer";

  loom_batch plain = b; // no tree: the view says so
  plain.rope_positions = nullptr;
  plain.tree_base = nullptr;
  plain.tree_mask = nullptr;
  ASSERT_EQ(Table::table.graph_compute(&pl.p, &g, &plain, logits, 4), nullptr);
  EXPECT_TRUE(pl.be->base.empty());
  EXPECT_TRUE(pl.be->rope.empty());
  Table::table.buffer_free(&pl.p, kv);
  Table::table.buffer_free(&pl.p, logits);
}

// A pool of layer groups (a hybrid model's window layers apart, ABI 3.1): the executor's KVRows finds each
// layer's rows through its group's slots and tables, in its slot of the blocks; a layout whose slots are not
// its groups' layers in order, or a batch without the groups' tables, is refused.
TEST(ExecutorTable, ALayerGroupsPoolReachesTheExecutor) {
  Plugin pl;
  // Three layers: 1 in group 0; 0 and 2 in group 1 (slots 0, 1). Blocks of 2 rows of 4 floats (32 bytes).
  const int32_t layer_group[3] = {1, 0, 1}, layer_slot[3] = {0, 0, 1};
  const loom_kv_layout layout{
      sizeof(loom_kv_layout), LOOM_DTYPE_F32, 3, 1, 4, 2, 4, 2, 2, layer_group, layer_slot};
  void* kv = nullptr;
  void* logits = nullptr;
  ASSERT_EQ(Table::table.buffer_alloc(&pl.p, 2 * 2 * 4 * 32, LOOM_BUFFER_KV, &kv), nullptr);
  ASSERT_EQ(Table::table.buffer_alloc(&pl.p, 16, LOOM_BUFFER_LOGITS, &logits), nullptr);
  const int32_t tokens[1] = {7}, positions[1] = {1}, seqs[1] = {0}, out[1] = {0}, row_seq[1] = {0};
  const int64_t slots0[1] = {3 * 2 + 1}, slots1[1] = {0 * 2 + 1}; // group 0: block 3; group 1: block 0
  const int32_t tables0[1] = {3}, tables1[1] = {0};
  const loom_kv_group_rows groups[2] = {{slots0, tables0, 1, 0}, {slots1, tables1, 1, 0}};
  loom_batch b{sizeof(loom_batch),
               1,
               tokens,
               positions,
               seqs,
               1,
               out,
               &layout,
               kv,
               slots0,
               row_seq,
               1,
               tables0,
               1,
               nullptr,
               nullptr,
               nullptr,
               groups};
  const loom_graph g = empty_graph(1);
  ASSERT_EQ(Table::table.graph_compute(&pl.p, &g, &b, logits, 4), nullptr);
  // offset = ((slot · 2 + kv) · n_blocks + block) · 32 + row · 16
  EXPECT_EQ(pl.be->k_new_at,
            (std::vector<size_t>{(0 * 4 + 0) * 32 + 16, (0 * 4 + 3) * 32 + 16, (2 * 4 + 0) * 32 + 16}));
  EXPECT_EQ(pl.be->k_at,
            (std::vector<size_t>{(1 * 4 + 0) * 32 + 16, (1 * 4 + 3) * 32 + 16, (3 * 4 + 0) * 32 + 16}))
      << "V rows of position 1 through each group's table";
  loom_batch no_groups = b;
  no_groups.kv_groups = nullptr;
  loom_status* st = Table::table.graph_compute(&pl.p, &g, &no_groups, logits, 4);
  EXPECT_NE(st, nullptr) << "a grouped pool without its groups' tables";
  if (st) loom::sdk::core_api().status_free(st);
  const int32_t wrong_slot[3] = {1, 0, 0};
  loom_kv_layout bad = layout;
  bad.layer_slot = wrong_slot;
  b.kv_layout = &bad;
  st = Table::table.graph_compute(&pl.p, &g, &b, logits, 4);
  EXPECT_NE(st, nullptr) << "slots that are not the groups' layers in order";
  if (st) loom::sdk::core_api().status_free(st);
  Table::table.buffer_free(&pl.p, kv);
  Table::table.buffer_free(&pl.p, logits);
}

TEST(ExecutorTable, BuffersAndMemoryAreTheExecutorsOwn) {
  Plugin pl;
  void* buf = nullptr;
  ASSERT_EQ(Table::table.buffer_alloc(&pl.p, 256, LOOM_BUFFER_KV, &buf), nullptr);
  EXPECT_EQ(pl.counts.allocs, 1);
  EXPECT_EQ(pl.counts.usages, std::vector<loom::BufferUsage>{loom::BufferUsage::kv});
  const float in[4] = {1, 2, 3, 4};
  float back[4] = {};
  ASSERT_EQ(Table::table.buffer_upload(&pl.p, buf, 16, in, sizeof in), nullptr);
  ASSERT_EQ(Table::table.buffer_download(&pl.p, buf, 16, back, sizeof back), nullptr);
  EXPECT_EQ(std::memcmp(in, back, sizeof in), 0);
  EXPECT_EQ(pl.counts.writes, 1);
  EXPECT_EQ(pl.counts.reads, 1);
  const loom_kv_layout layout{sizeof(loom_kv_layout), LOOM_DTYPE_F32, 1, 1, 4, 4, 4, 0, 0, nullptr, nullptr};
  const loom_block_copy copies[2] = {{0, 1, 4, 0}, {1, 2, 2, 0}};
  ASSERT_EQ(Table::table.kv_copy(&pl.p, buf, &layout, copies, 2), nullptr);
  EXPECT_EQ(pl.counts.copies, 2);
  loom_memory_info m{};
  Table::table.memory_info(&pl.p, &m);
  EXPECT_EQ(m.free_bytes, 3u);
  EXPECT_EQ(m.total_bytes, 7u);
  Table::table.buffer_free(&pl.p, buf);
  EXPECT_EQ(pl.counts.frees, 1);
}

TEST(ExecutorTable, AHostMemoryExecutorSaysNothingOfItsMemory) {
  // The default Backend: host buffers, no memory_info (the table reports 0 / 0: nothing to say).
  class Host final : public loom::Backend {
  public:
    std::string_view name() const noexcept override { return k_name; }
    bool supports(const loom::Graph&, const loom::Node&) const noexcept override { return true; }
    void compute(const loom::Graph&, const loom::BatchView&, const loom::KVRows&, std::span<float>) override {
    }
  };
  loom::sdk::ExecutorPlugin p;
  p.be = std::make_unique<Host>();
  void* buf = nullptr;
  ASSERT_EQ(Table::table.buffer_alloc(&p, 4096, LOOM_BUFFER_LOGITS, &buf), nullptr);
  float zero = 1;
  ASSERT_EQ(Table::table.buffer_download(&p, buf, 0, &zero, sizeof zero), nullptr);
  EXPECT_EQ(zero, 0.0f) << "a fresh buffer reads as zeros";
  loom_memory_info m{1, 1};
  Table::table.memory_info(&p, &m);
  EXPECT_EQ(m.total_bytes, 0u);
  Table::table.buffer_free(&p, buf);
}

} // namespace
