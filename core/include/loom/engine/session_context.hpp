// loom/engine/session_context.hpp — what every request's session shares with the engine: the models its
// sequences run on (the target, and the pipeline's draft model when it has one), the tokenizer, the
// context size, the KV sequence ids and the verifier.
#pragma once

#include "loom/kv/kv_cache.hpp"
#include "loom/sdk/verifier.hpp"
#include "loom/tokenizer/tokenizer.hpp"

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace loom {

class Model;
class Backend;

// Which model a sequence runs on: the target, or the pipeline's draft model (speculative decoding).
enum class ModelRole : uint8_t { target, draft };
inline constexpr std::array<ModelRole, 2> k_model_roles = {ModelRole::target, ModelRole::draft};

// One value per model role (a forward's rows, a request's forward time, …).
template <class T> struct PerModel {
  T target{};
  T draft{};
  T& operator[](ModelRole r) noexcept { return r == ModelRole::target ? target : draft; }
  const T& operator[](ModelRole r) const noexcept { return r == ModelRole::target ? target : draft; }
  bool operator==(const PerModel&) const = default;
};

// One model a request's sequences run on, with its backend, its KV store and what that backend makes of
// the model's attention.
struct ModelSlot {
  Model* model = nullptr; // null: no such model (a pipeline without a draft)
  Backend* backend = nullptr;
  KVCacheStore* kv = nullptr; // what a sequence keeps of its positions is the store's (KVShape::retention)
  // Token trees (set_draft_tree): the most nodes a draft tree may have (0: its backend runs no tree rows),
  // and the deepest (below the narrowest sliding window: a tree row's window is taken at its depth, its
  // ancestors always attended).
  int32_t tree_nodes = 0;
  int32_t tree_depth = 0;
  // The draft model is the target's own first layers ([decoder] draft_layers): a draft sequence takes the
  // K/V of the tokens its target sequence has evaluated from the target's store (those layers' rows
  // copied) instead of evaluating them again.
  bool target_layers = false;
  explicit operator bool() const noexcept { return model != nullptr; }
};

// What a session needs of the engine: shared, outliving every session.
struct SessionContext {
  const Tokenizer& tok;
  int32_t n_ctx = 0;
  int32_t n_vocab = 0;
  PerModel<ModelSlot> models;
  KVCacheStore& kv() const noexcept { return *models.target.kv; } // the target's
  KVCacheStore& kv(ModelRole r) const noexcept { return *models[r].kv; }
  bool has_draft() const noexcept { return static_cast<bool>(models.draft); }
  // KV store ids (both stores): unique among the sequences alive. An id goes back to free_kv_seqs when its
  // sequence ends for good (freed, or its request released) — not when it is only evicted — and is used
  // again first, so ids stay below the most sequences ever alive at once and never wrap however many
  // forks a long-running engine makes.
  SeqId next_kv_seq = 0; // never used yet
  std::vector<SeqId> free_kv_seqs;
  SeqId kv_seq_to_take() const noexcept { return free_kv_seqs.empty() ? next_kv_seq : free_kv_seqs.back(); }
  void take_kv_seq(SeqId id) { // after the store allocated kv_seq_to_take()
    if (!free_kv_seqs.empty() && free_kv_seqs.back() == id)
      free_kv_seqs.pop_back();
    else
      ++next_kv_seq;
  }
  // The pipeline's verifier (loom/sdk/verifier.hpp: model_judge or a plugin's); nullptr = none.
  std::shared_ptr<Verifier> verifier;
  // Token rows the verifier's own model has evaluated so far (a judge model; empty: no model): what a
  // request's verifier calls cost, counted as the difference around them.
  std::function<size_t()> verifier_tokens;
};

} // namespace loom
