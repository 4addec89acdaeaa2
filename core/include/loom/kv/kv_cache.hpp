// loom/kv/kv_cache.hpp — K/V storage for all sequences.
//
// `contiguous`: one max-length slab per sequence. `paged`: blocks shared by forks (below). Positions [0,
// length(seq)) of a sequence are valid; allocate() reserves room for new positions and returns false when
// there is none (an expected outcome: the caller stops or preempts the request, it is not an error).
#pragma once

#include "loom/kv/kv_memory.hpp"
#include "loom/kv/kv_retention.hpp"
#include "loom/kv/kv_stats.hpp"
#include "loom/sdk/dtype.hpp"
#include "loom/sdk/executor.hpp"
#include "loom/sdk/types.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace loom {

struct KVShape {
  int32_t n_layer = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;
  int32_t n_ctx = 0;     // positions per sequence
  int32_t n_seq_max = 1; // sequences that can live at once
  DType dtype = DType::f32;
  int32_t block_size = 16; // paged store: positions per block
  // paged store: blocks of every layer's rows the pool holds (0: enough for n_seq_max full sequences); with
  // layer groups, as many bytes in blocks of fewer layers
  int64_t n_blocks = 0;
  bool prefix_cache = false; // paged store: full blocks are kept by content for later requests
  // What a sequence keeps of its positions (loom/kv/kv_retention.hpp; unbounded: every one). A paged
  // store puts the layers marked in window_layers (some, not all: a hybrid model's sliding-window layers)
  // in layer groups of their own (KVLayout::set_groups), which keep window_retention's positions while the
  // others keep `retention`'s — at 32k positions, Gemma 3 holds 1 layer in 6 in full.
  KVRetention retention{};
  std::vector<bool> window_layers{}; // empty: every layer keeps `retention`'s
  KVRetention window_retention{};
  // Positions one forward may add to a sequence before what its window no longer reads is retired (the
  // scheduler's max_batch_tokens): what a window's blocks grow by, counted in units_for.
  int32_t step_positions = 0;
  int64_t row_elems() const noexcept { return static_cast<int64_t>(n_head_kv) * head_dim; }
};

// The store keeps the accounting — which blocks each sequence holds, reference counts, the prefix
// cache, copy-on-write, sliding-window release, layer groups — and hands each forward the slots of its rows
// and the block tables of its sequences (KVRows, loom/sdk/executor.hpp). The memory is its KVMemory
// (loom/kv/kv_memory.hpp): the backend's buffer, the pool's layout and the block copies the store records;
// what it reports about its storage is a KVStats (loom/kv/kv_stats.hpp).
class KVCacheStore {
public:
  virtual ~KVCacheStore() = default;
  virtual std::string_view name() const noexcept = 0;
  virtual const KVShape& shape() const noexcept = 0;
  KVMemory& memory() noexcept { return memory_; }
  const KVMemory& memory() const noexcept { return memory_; }

  // The pool as the forward of `batch` sees it (its positions allocated): runs pending copies first.
  // The view points into this store and is valid until the next call.
  KVRows rows_for(const BatchView& batch);
  // Byte offset in the pool of the K (kv 0) or V (kv 1) row of (layer, seq, pos): which block holds it.
  size_t row_offset(int32_t layer, int kv, SeqId seq, Pos pos) const;
  // A row's bytes to and from host memory (tests, tools): pending copies run first; a store without
  // memory gets host memory (HostBuffer).
  std::vector<uint8_t> read_row(int32_t layer, int kv, SeqId seq, Pos pos);
  void write_row(int32_t layer, int kv, SeqId seq, Pos pos, std::span<const uint8_t> bytes);

  // Reserves positions [length, length + n_new) of `seq` (creating the sequence if new). Returns
  // false, changing nothing, when the sequence would exceed n_ctx or no slot is free.
  virtual bool allocate(SeqId seq, int32_t n_new) = 0;
  virtual void free(SeqId seq) noexcept = 0;
  // Makes `child` a copy of `parent`'s positions [0, length(parent)); false, changing nothing, when
  // no slot is free or `child` exists. Only the used positions are copied.
  virtual bool fork(SeqId parent, SeqId child) = 0;
  // Keeps the first n positions of seq (speculative rollback).
  virtual void truncate(SeqId seq, int32_t n) = 0;
  virtual int32_t length(SeqId seq) const noexcept = 0; // 0 for an unknown sequence
  virtual bool contains(SeqId seq) const noexcept = 0;
  // Sequences that can still be created (allocate of a new id, fork) — what admission waits for.
  virtual int32_t free_sequences() const noexcept = 0;

  // Bytes held, used, at their peak, resident; blocks in the prefix cache.
  virtual KVStats stats() const noexcept = 0;
  // Starts a new window for KVStats::bytes_allocated_peak: the peak becomes what is held now.
  virtual void reset_peak() noexcept = 0;

  // Positions in units of the store's allocation (paged: blocks of block_size positions; contiguous:
  // slabs of n_ctx positions). What admission and preemption reason with.
  virtual int64_t n_units() const noexcept = 0;      // in the pool
  virtual int64_t units_in_use() const noexcept = 0; // held by some sequence
  virtual int32_t positions_per_unit() const noexcept = 0;
  int64_t free_units() const noexcept { return n_units() - units_in_use(); }
  // The units a sequence of `positions` positions holds at most (paged: its blocks in every layer group, a
  // sliding window's no more than the window needs; contiguous: a slab) — what admission reasons with.
  virtual int64_t units_for(int64_t positions) const noexcept {
    const int64_t u = positions_per_unit();
    return (std::max<int64_t>(positions, 0) + u - 1) / u;
  }
  // The most positions one sequence could have in `units` units, and in all of them / in the free ones
  // (a partly filled unit's rest is not counted). A sequence also needs a free sequence id.
  int64_t positions_in(int64_t units) const noexcept;
  int64_t capacity_positions() const noexcept { return positions_in(n_units()); }
  // The bytes of units_for(positions): what one sequence of that many positions holds at most.
  size_t bytes_for(int64_t positions) const noexcept {
    return static_cast<size_t>(units_for(positions)) *
           (memory().layout().bytes() / static_cast<size_t>(std::max<int64_t>(n_units(), 1)));
  }
  int64_t free_positions() const noexcept { return positions_in(free_units()); }
  // What the scheduler plans with (it changes nothing): the units allocate(seq, n_new) would take from
  // the free ones now — new blocks, and a private copy of a shared last block — or -1 when it can never
  // succeed (past n_ctx, or a new sequence with no sequence free).
  virtual int64_t units_to_grow(SeqId seq, int32_t n_new) const noexcept = 0;
  // The block copies allocate(seq, n_new) would record now (copy-on-write of a shared, part-filled last
  // block — one per layer group: its id and the positions written in it); none when it would copy nothing.
  struct GrowCopy {
    int32_t src = -1;
    int32_t positions = 0;
    bool operator==(const GrowCopy&) const = default;
  };
  virtual std::vector<GrowCopy> copies_to_grow(SeqId /*seq*/, int32_t /*n_new*/) const { return {}; }
  // The units that would become free if all of `seqs` were freed now (a block also held by a sequence
  // outside the set stays in use).
  virtual int64_t units_freed_by(std::span<const SeqId> seqs) const = 0;

  // Prefix reuse across requests (paged store with shape().prefix_cache; others: no-ops).
  // register_prefix: positions [0, min(length, tokens.size())) of seq hold the K/V of `tokens` (all
  // evaluated): each full block among them becomes findable by its content (the hash of its tokens and
  // of every block before it). A cached block nobody references stays in the pool, evicted least
  // recently used first when a block is needed (it counts as free).
  virtual void register_prefix(SeqId /*seq*/, std::span<const TokenId> /*tokens*/) {}
  // For an empty sequence: attaches the cached blocks holding the longest prefix of `tokens` — whole
  // blocks, then the start of the cached block after them that shares the most of the next tokens — at most
  // max_positions, and returns the positions it now has (0: none found).
  virtual int32_t reuse_prefix(SeqId /*seq*/, std::span<const TokenId> /*tokens*/,
                               int32_t /*max_positions*/) {
    return 0;
  }

  // Sliding-window release: gives back the storage of the positions in [from, to) of seq that whole
  // units cover, in every layer group (paged: the blocks lying inside; contiguous: none — a slab is one
  // unit). Their rows must not be read again (no later query attends them); the length is unchanged.
  // Returns the positions released, summed over the groups.
  virtual int32_t release_positions(SeqId /*seq*/, Pos /*from*/, Pos /*to*/) { return 0; }
  // The same, by the shape's retention, for a sequence whose next query is at position `next`: each layer
  // group releases what its retention no longer reads (shape().retention, window_retention). Returns the
  // positions released, summed over the groups.
  virtual int32_t retire(SeqId /*seq*/, Pos /*next*/) { return 0; }
  // The first position of seq whose row was released in some layer group (length(seq) when none).
  virtual Pos first_released(SeqId seq) const noexcept { return length(seq); }
  // Whether the rows of positions [from, to) of seq are all stored in every layer group (none released).
  virtual bool holds(SeqId /*seq*/, Pos /*from*/, Pos /*to*/) const noexcept { return true; }
  // Whether a query at position `next` finds every row below `end` it reads, in every layer group (after
  // a truncate back past released rows it does not: they are evaluated again).
  virtual bool readable(SeqId /*seq*/, Pos /*next*/, Pos /*end*/) const noexcept { return true; }

protected:
  explicit KVCacheStore(const KVLayout& layout) : memory_(layout) {}
  // The block ids of seq in layer group `group`, in position order (-1: released); empty for an unknown
  // sequence.
  virtual std::span<const int32_t> table(SeqId seq, int32_t group) const noexcept = 0;
  void record_copy(KVBlockCopy c) { memory_.record_copy(c); }

private:
  KVMemory memory_;
  // rows_for's view: per batch row, its sequence's index; per layer group, the slot of each batch row and
  // table_stride block ids per sequence of the batch.
  std::vector<int32_t> row_seq_;
  std::vector<std::vector<int64_t>> slots_;
  std::vector<std::vector<int32_t>> tables_;
};

// Contiguous store (rows of shape.dtype). Slabs are reserved when a sequence is first created; their pages
// are touched (and become resident) only as positions are written or copied.
std::unique_ptr<KVCacheStore> make_contiguous_kv_cache(const KVShape& shape);

// Paged store (rows of shape.dtype): a pool of blocks of `block_size` positions, a block table per sequence,
// fork by sharing blocks (reference counts; copy-on-write when a sequence writes into a block it shares),
// truncate and free returning blocks. Blocks are made as needed and reused.
std::unique_ptr<KVCacheStore> make_paged_kv_cache(const KVShape& shape);

} // namespace loom
