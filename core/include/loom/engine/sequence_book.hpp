// loom/engine/sequence_book.hpp — the sequences of one request as the engine and its scheduler see them.
//
// A request owns sequences (request-local ids; 0 holds the prompt). The book keeps, per sequence, what
// the engine works with: its tokens (committed, then drafted), which of them have K/V in the store, the
// logits rows it owes and holds, and the work of the current step (pending, taken in chunks, in
// flight); and per request, preemption (evict / restore). It knows nothing of samplers, stop rules,
// text or results: DecodeSession (loom/engine/decode_session.hpp), the decoder's face of the same request,
// owns those and drives the book for everything that touches K/V.
#pragma once

#include "loom/attention.hpp"
#include "loom/engine/session_context.hpp"
#include "loom/kv/kv_cache.hpp"
#include "loom/tokenizer/tokenizer.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

using RequestId = int64_t;
using LocalSeq = int32_t; // request-local sequence id (0 = the prompt sequence)
using StreamCallback = std::function<void(std::string_view text)>;

// The bookkeeping half of a request.
class SequenceBook {
public:
  // One sequence's tokens, K/V and logits rows.
  struct Entry {
    ModelRole role = ModelRole::target; // the model it runs on (SessionContext::models)
    LocalSeq mirror = -1;               // a draft sequence: the target sequence it was forked from
    SeqId kv = -1;                      // id in that model's KV store
    std::vector<TokenId> tokens;        // committed: prompt + generated
    std::vector<TokenId> draft; // uncommitted tokens after `tokens` (not streamed, not seen by stop rules)
    // A draft tree (empty: the draft is linear): parent[i] < i is node i's parent in draft, -1 the last
    // committed token. Node i's K/V lie at slot tree_base + i; it is rotated at tree_base − 1 + its depth.
    // While a path is committed (DecodeSession::commit_node) the nodes stay: tree_at is the last committed
    // node (-1: none yet), and the committed tokens below tree_kv_keep have their K/V at their own
    // positions (a node at its depth's slot); the rest are evaluated again once the tree is dropped.
    std::vector<int32_t> parent;
    int32_t tree_base = 0;
    int32_t tree_at = -1;
    int32_t tree_kv_keep = 0;
    size_t tree_row_off = 0, tree_n_rows = 0; // the rows as evaluated (row 0: the tree's root)
    bool tree_chain = false; // every node the child of the one before: evaluated as plain causal rows
    bool is_tree() const noexcept { return !parent.empty(); }
    int32_t n_cached = 0; // of tokens + draft, those whose K/V are in the store
    // Logits rows: row j (j = 0..n_rows-1) is the distribution after tokens + draft[0..j), stored at
    // rows[(row_off + j) * n_vocab].
    std::vector<float> rows;
    size_t row_off = 0;
    size_t n_rows = 0;
    bool finished = false; // ended (its K/V released at once; nothing is evaluated for it)
    bool planned = false;
    // Pending work (begin_work): positions [n_cached, target) to evaluate, rows from position out_from.
    bool pending = false;
    bool in_flight = false; // a chunk taken this step, its forward not yet run
    int32_t in_flight_n = 0;
    int32_t target = 0, out_from = 0;
    bool has_logits() const noexcept { return n_rows > 0; }
  };

  SequenceBook(SessionContext& ctx, size_t n_prompt) : ctx_(ctx), n_prompt_(n_prompt) {}
  ~SequenceBook() { release(); }
  SequenceBook(const SequenceBook&) = delete;
  SequenceBook& operator=(const SequenceBook&) = delete;

  // ---- what the decoder's session does through the book ----
  SessionContext& context() const noexcept { return ctx_; }
  // A new KV store sequence on model `role`: empty, or (parent_kv ≥ 0 with cached positions) a fork of it.
  // -1 when the store has no free sequence.
  SeqId new_kv(ModelRole role, SeqId parent_kv, bool fork);
  // Gives a KV store sequence back for good (its id is used again).
  void free_kv(ModelRole role, SeqId kv) noexcept;
  LocalSeq add(Entry e); // the next request-local id
  Entry* find(LocalSeq seq) noexcept;
  const Entry* find(LocalSeq seq) const noexcept;
  void erase(LocalSeq seq);             // frees its K/V and KV id
  bool mark_planned(LocalSeq seq);      // false when already planned this step
  void uncache(Entry& e, int32_t keep); // K/V of positions ≥ keep dropped
  void drop_draft(Entry& e);            // the uncommitted tokens, their K/V and rows
  // An ended sequence's K/V go back to the store at once (not while its chunk is in flight: then after
  // the forward). A decoder that truncates it back to life has it evaluated again.
  void drop_kv(Entry& e);
  // A truncate to n committed tokens: its rows are evaluated again when it is next planned; under a
  // sliding window, rows already released before the next query's window are evaluated again too.
  void rewind(Entry& e, size_t n_tokens);
  const float* row(const Entry& e, size_t r) const noexcept {
    return r < e.n_rows ? e.rows.data() + (e.row_off + r) * static_cast<size_t>(ctx_.n_vocab) : nullptr;
  }
  void note() noexcept { ++events_; } // something changed (progress)
  void set_cached_prompt(int32_t n) noexcept { cached_prompt_ = n; }
  const std::map<LocalSeq, Entry>& entries() const noexcept { return seqs_; }

  // ---- engine-facing ----
  // One planned sequence's unevaluated tokens, for the scheduler's batch.
  struct Work {
    LocalSeq seq;
    ModelRole role = ModelRole::target;
    SeqId kv = -1;
    Pos first_pos = 0;           // position of tokens[0]
    std::vector<TokenId> tokens; // to evaluate
    Pos out_from = 0;            // positions ≥ out_from produce logits rows …
    int32_t first_row = 0;       // … rows first_row, first_row + 1, … (set_logits)
    // Token-tree rows (empty when the chunk has none): per token, its rope position, tree base and mask
    // (BatchView's).
    std::vector<Pos> rope, tree_base;
    std::vector<uint64_t> tree_mask;
  };
  // Turns this step's plans into pending work: each planned sequence's tokens without K/V (the
  // committed ones a truncate or a preemption dropped, the new ones, the drafts) and the logits rows
  // it owes. Reserves nothing: the scheduler takes the work in chunks (take_chunk) as its token budget
  // and the KV store allow, over one step or several; the decoder is called again only when
  // work_pending() is false.
  void begin_work();
  bool work_pending() const noexcept;
  struct Pending {
    LocalSeq seq;
    ModelRole role = ModelRole::target;
    SeqId kv = -1;         // its sequence in that model's KV store
    int32_t remaining = 0; // tokens left to evaluate
  };
  std::vector<Pending> pending() const;
  // The KV store sequences this request holds on a model: what preempting it frees.
  std::vector<SeqId> kv_held(ModelRole role) const;
  // The next (at most n) tokens of a pending sequence, their KV positions reserved; nullopt, changing
  // nothing, when the store has no room for them.
  std::optional<Work> take_chunk(LocalSeq seq, int32_t n);
  // The forward passes of this step's chunks ran (their rows are set; their full blocks become
  // findable by content for later requests).
  void chunks_evaluated();
  void set_logits(LocalSeq seq, size_t row, std::span<const float> logits);
  // Prompt positions found in the prefix cache when the request started (not evaluated again).
  int32_t cached_prompt() const noexcept { return cached_prompt_; }
  // Preemption: every sequence's K/V and KV sequence id are given back (logits rows, tokens and all
  // other state stay); its pending work, and any later plan, evaluates from position 0 once restore()
  // got the ids back.
  void evict();
  bool evicted() const noexcept { return evicted_; }
  bool restore(); // false, holding nothing, when the stores lack free sequences
  // KV units the live sequences hold or will need once their pending work is done (admission of a
  // preempted request).
  int64_t units_needed() const noexcept;
  // Tokens generated so far by the sequence with the most (metrics: inter-token latency).
  size_t max_generated() const noexcept;
  bool any_generated() const noexcept;
  // A number that changes whenever the request does something (appends, evaluates, ends, forks).
  uint64_t progress() const noexcept { return events_; }
  // Token rows evaluated for this request so far, on each model.
  size_t evaluated(ModelRole role) const noexcept { return evaluated_[role]; }
  // Positions a draft of the target's layers took from the target's store instead of evaluating them.
  size_t kv_copied() const noexcept { return kv_copied_; }
  void release(); // frees every sequence's KV and KV id

private:
  Entry& at(LocalSeq seq); // throws for an unknown sequence
  // A draft of the target's layers: its positions [n_cached, out_from) that its target sequence has
  // evaluated with the same tokens get those layers' K/V rows from the target's store.
  void copy_from_target(Entry& q);

  SessionContext& ctx_;
  size_t n_prompt_;
  std::map<LocalSeq, Entry> seqs_;
  LocalSeq next_seq_ = 0;
  std::vector<LocalSeq> planned_;
  bool evicted_ = false;
  int32_t cached_prompt_ = 0;
  PerModel<size_t> evaluated_;
  size_t kv_copied_ = 0;
  uint64_t events_ = 0; // progress counter
};

} // namespace loom
