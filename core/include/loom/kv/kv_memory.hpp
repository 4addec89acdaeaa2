// loom/kv/kv_memory.hpp — the memory a KV store's pool lives in.
//
// The store (loom/kv/kv_cache.hpp) decides which block holds which position; this type owns the bytes: the
// backend's buffer (Backend::alloc, attached once), the pool's layout, and the block copies the store
// recorded (copy-on-write, a contiguous fork), which run on the buffer, in order, before the next forward.
#pragma once

#include "loom/sdk/executor.hpp"

#include <memory>
#include <span>
#include <vector>

namespace loom {

class KVMemory {
public:
  explicit KVMemory(const KVLayout& layout) : layout_(layout) {}
  // The pool's layout: paged, shape.block_size positions per block and the pool's blocks; contiguous,
  // one block of n_ctx positions per sequence that can live at once.
  const KVLayout& layout() const noexcept { return layout_; }

  // A store without memory keeps its accounting; model forwards attach the backend's (Model::forward).
  // Attaching twice is an error.
  void attach(std::unique_ptr<Buffer> buffer);
  Buffer* buffer() noexcept { return buffer_.get(); }
  const Buffer* buffer() const noexcept { return buffer_.get(); }

  // Block copies recorded and not yet run, in the order they will run.
  void record_copy(KVBlockCopy c) { queued_.push_back(c); }
  std::span<const KVBlockCopy> queued_copies() const noexcept { return queued_; }
  // Runs the recorded block copies on the buffer (a no-op without one: nothing was written yet).
  void sync();
  // What reading or writing a row from the host needs: host memory (HostBuffer) when no buffer is
  // attached, then the pending copies run.
  void prepare_row_io();

private:
  KVLayout layout_;
  std::unique_ptr<Buffer> buffer_;
  std::vector<KVBlockCopy> queued_;
};

} // namespace loom
