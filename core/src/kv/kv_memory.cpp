// kv_memory.cpp — the buffer a KV pool lives in and the block copies queued on it.
#include "loom/kv/kv_memory.hpp"

#include "loom/error.hpp"

namespace loom {

void KVMemory::attach(std::unique_ptr<Buffer> buffer) {
  LOOM_ASSERT(buffer != nullptr, "attaching no KV memory");
  if (buffer_) fail(Errc::internal, "kv_cache", "the KV store has its memory already");
  buffer_ = std::move(buffer);
}

void KVMemory::sync() {
  if (queued_.empty()) return;
  if (buffer_) buffer_->copy(layout_, queued_);
  queued_.clear();
}

void KVMemory::prepare_row_io() {
  if (!buffer_) attach(std::make_unique<HostBuffer>(layout_.bytes()));
  sync();
}

} // namespace loom
