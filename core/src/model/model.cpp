// model.cpp — Model: the architecture (ModelConfig) and weights of a GGUF file, the forward graph of each
// batch shape (its family's layers of GraphBuilder's blocks, cached per shape), and forward() on a backend.
#include "loom/model/model.hpp"

#include "family.hpp"
#include "graph_builder.hpp"
#include "loom/error.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <string>

namespace loom {

namespace {
int64_t new_weight_id() noexcept {
  static std::atomic<int64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

} // namespace

Model::Model(GgufFile f, int32_t max_layers)
    : file_(std::move(f)), cfg_([&] {
        ModelConfig c = ModelConfig::from_gguf(file_);
        if (max_layers > 0 && max_layers < c.n_layer) { // the first layers: their per-layer facts too
          c.n_layer = max_layers;
          for (std::vector<bool>* per_layer : {&c.sliding_layers, &c.rope_layers})
            if (per_layer->size() > static_cast<size_t>(max_layers))
              per_layer->resize(static_cast<size_t>(max_layers));
        }
        return c;
      }()),
      attention_(make_attention_variant(cfg_, AttentionChoice{})) {
  // The weights a backend loads: those of a decode graph (every graph reads the same ones), each once,
  // with how the graph uses it; later graphs carry their ids.
  const Graph g = build_graph(1, 1);
  int32_t head = g.out_logits; // the matmul making the logits (before Gemma 2's final soft-cap)
  for (const Node& n : g.nodes)
    if (n.dst == g.out_logits && n.op == OpKind::softcap) head = n.src[0];
  std::map<std::string, size_t> at;
  for (const Node& n : g.nodes)
    for (size_t i = 0; i <= n.src.size(); ++i) { // (one past: an attention node's sink logits)
      const int32_t id = i < n.src.size() ? n.src[i] : n.op == OpKind::attention ? n.attn.sink_logits : -1;
      if (id < 0) continue;
      const TensorDesc& t = g.tensors[static_cast<size_t>(id)];
      if (t.kind != TensorKind::weight) continue;
      auto it = at.find(t.name);
      if (it == at.end()) {
        WeightDesc w;
        w.tensor = t;
        w.tensor.weight = new_weight_id();
        w.bytes = row_bytes(t.dtype, t.ne[0]) * static_cast<size_t>(t.n_rows());
        it = at.emplace(t.name, weights_.size()).first;
        weight_ids_.emplace(t.name, w.tensor.weight);
        weights_.push_back(std::move(w));
      }
      uint32_t& uses = weights_[it->second].uses;
      if (i == 0 && (n.op == OpKind::matmul || n.op == OpKind::matmul_id))
        uses |= n.dst == head ? weight_use_logits : weight_use_matmul;
      else if (i == 0 && n.op == OpKind::get_rows)
        uses |= weight_use_rows;
      else
        uses |= weight_use_vector;
    }
}

void Model::load_into(Backend& be) {
  std::lock_guard lock(mu_);
  if (std::find(loaded_.begin(), loaded_.end(), be.instance()) != loaded_.end()) return;
  be.load(weights_);
  loaded_.push_back(be.instance());
}

std::unique_ptr<Model> Model::load(const std::string& path) {
  return std::unique_ptr<Model>(new Model(GgufFile::open(path)));
}

std::unique_ptr<Model> Model::with_layers(int32_t n_layers) const {
  if (n_layers < 1 || n_layers > cfg_.n_layer)
    fail(Errc::invalid_argument, "model",
         "a draft of the first " + std::to_string(n_layers) + " layers: expected 1.." +
             std::to_string(cfg_.n_layer) + " (the model has " + std::to_string(cfg_.n_layer) + ")");
  return std::unique_ptr<Model>(new Model(file_.shared_copy(), n_layers));
}

KVShape Model::kv_shape(int32_t n_ctx, int32_t n_seq_max, const Backend* be) const {
  KVShape s;
  s.n_layer = cfg_.n_layer;
  s.n_head_kv = cfg_.n_head_kv;
  s.head_dim = cfg_.head_dim;
  s.n_ctx = n_ctx;
  s.n_seq_max = n_seq_max;
  s.dtype = DType::f32;
  const AttentionVariant& v = *attention_;
  uint32_t reads = 0;
  for (const uint32_t bit : {attn_span_only, attn_kv_groups})
    if (be && be->supports_attention(v.kernel(), v.features() | reads | bit)) reads |= bit;
  v.set_retention(s, reads);
  return s;
}

std::shared_ptr<Model::Shape> Model::shape(int32_t n_tokens, int32_t n_outputs) {
  return graphs_.get({n_tokens, n_outputs}, [&] {
    return std::make_shared<Shape>(Shape{build_graph(n_tokens, n_outputs), {}});
  });
}

std::shared_ptr<const Graph> Model::graph(int32_t n_tokens, int32_t n_outputs) {
  std::lock_guard lock(mu_);
  std::shared_ptr<Shape> s = shape(n_tokens, n_outputs);
  return {s, &s->graph};
}

double Model::forward(Backend& be, const BatchView& batch, KVCacheStore& kv, std::span<float> logits) {
  const auto n_tokens = static_cast<int32_t>(batch.tokens.size());
  const auto n_out = static_cast<int32_t>(batch.output_rows.size());
  LOOM_ASSERT(n_tokens > 0 && batch.positions.size() == batch.tokens.size() &&
                  batch.seq_ids.size() == batch.tokens.size(),
              "malformed batch");
  LOOM_ASSERT(logits.size() >= static_cast<size_t>(n_out) * static_cast<size_t>(cfg_.n_vocab),
              "logits buffer too small");
  for (TokenId t : batch.tokens)
    if (t < 0 || t >= cfg_.n_vocab)
      fail(Errc::invalid_argument, "model",
           "token id " + std::to_string(t) + " is outside the vocabulary (0.." +
               std::to_string(cfg_.n_vocab - 1) + ")");
  std::shared_ptr<Shape> s;
  {
    std::lock_guard lock(mu_);
    s = shape(n_tokens, n_out);
    if (std::find(s->runs_on.begin(), s->runs_on.end(), be.instance()) ==
        s->runs_on.end()) { // once per shape
      for (const Node& n : s->graph.nodes)
        if (!be.supports(s->graph, n))
          fail(Errc::unsupported, "model",
               std::string("backend '") + std::string(be.name()) + "' cannot run op " + op_name(n.op) +
                   " for this model");
      s->runs_on.push_back(be.instance());
    }
  }
  const Graph& g = s->graph;
  load_into(be);
  KVMemory& mem = kv.memory();
  if (!mem.buffer()) mem.attach(be.alloc(mem.layout().bytes(), BufferUsage::kv));
  LOOM_ASSERT(mem.buffer()->owner() == nullptr || mem.buffer()->owner() == be.instance_tag(),
              "a KV store whose memory belongs to another backend");
  const KVRows rows = kv.rows_for(batch);
  const auto t0 = std::chrono::steady_clock::now();
  be.compute(g, batch, rows, logits);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Graph Model::build_graph(int32_t n_tokens, int32_t n_outputs) const {
  Graph g;
  g.id = new_graph_id();
  g.n_tokens = n_tokens;
  g.n_outputs = n_outputs;
  GraphBuilder b(cfg_, file_, *attention_, g);
  const Family* family = find_family(cfg_.arch);
  LOOM_ASSERT(family != nullptr, "an architecture ModelConfig accepted has no family");
  b.add_inputs();
  b.add_rope_freqs();
  const int32_t tok_embd = b.weight("token_embd.weight");
  int32_t x = b.embeddings(tok_embd);
  for (int32_t l = 0; l < cfg_.n_layer; ++l)
    x = family->layer(b, l, x);
  g.out_logits = b.output_head(x, tok_embd);
  for (TensorDesc& t : g.tensors) // the ids the backend loaded them under (none while the list is made)
    if (t.kind == TensorKind::weight)
      if (auto it = weight_ids_.find(t.name); it != weight_ids_.end()) t.weight = it->second;
  return g;
}

} // namespace loom
