// Plugin objects behind the host's C++ interfaces. Each adapter shares ownership of its library, so
// the library stays loaded while any object from it lives; objects are destroyed in their module.
#include "plugin_internal.hpp"

#include <cstddef>

namespace loom::plugin {

namespace {

// Whether a table of the plugin's struct_size holds `field` (tables only grow at the end).
#define LOOM_HAS(vt, type, field)                                                                            \
  ((vt)->struct_size >= offsetof(type, field) + sizeof(((type*)nullptr)->field))

template <class VT> struct Object {
  std::shared_ptr<PluginLibrary> lib;
  void* self = nullptr;
  const VT* vt = nullptr;
  Object(std::shared_ptr<PluginLibrary> l, void* s, const VT* v) : lib(std::move(l)), self(s), vt(v) {}
  Object(const Object&) = delete;
  Object& operator=(const Object&) = delete;
  ~Object() {
    if (self && vt && vt->destroy) vt->destroy(self);
  }
};

template <class VT>
std::unique_ptr<Object<VT>> create_object(const PluginRegistry::Found& f, const std::string& name,
                                          const std::vector<std::pair<std::string, ParamValue>>& params,
                                          const std::string& where,
                                          std::initializer_list<size_t> required_offsets) {
  loom_config cfg;
  cfg.where = where;
  cfg.params = &params;
  void* self = nullptr;
  const void* vt = nullptr;
  const std::string ctx =
      "creating " + std::string(kind_name(f.factory->kind)) + " '" + name + "' from " + f.lib->path();
  throw_if(f.factory->create(&cfg, &self, &vt), ctx);
  if (!self || !vt) fail(Errc::invalid_argument, "plugin", ctx + ": create returned no object");
  auto obj = std::make_unique<Object<VT>>(f.lib, self, static_cast<const VT*>(vt));
  for (size_t off : required_offsets)
    if (obj->vt->struct_size < off + sizeof(void*) ||
        *reinterpret_cast<void* const*>(reinterpret_cast<const char*>(obj->vt) + off) == nullptr)
      fail(Errc::invalid_argument, "plugin", ctx + ": its vtable lacks a required function");
  check_all_read(cfg, std::string(kind_name(f.factory->kind)) + " '" + name + "'");
  return obj;
}

// ---- samplers ----

class PluginSampler final : public Sampler {
public:
  PluginSampler(std::shared_ptr<Object<loom_sampler_i>> o, std::string name)
      : o_(std::move(o)), name_(std::move(name)) {}
  std::string_view name() const noexcept override { return name_; }
  void apply(Candidates& c, const SamplerContext& ctx) override {
    // TokenData is loom_token_data (loom/sdk/sampler.hpp): the host's view is the plugin's.
    loom_candidates lc{sizeof(loom_candidates),
                       sizeof(loom_token_data),
                       reinterpret_cast<loom_token_data*>(c.data.data()),
                       c.data.size(),
                       c.sorted ? 1 : 0,
                       c.has_probs ? 1 : 0,
                       c.selected};
    loom_sampler_ctx sc{sizeof(loom_sampler_ctx), ctx.prompt.data(),    ctx.prompt.size(),
                        ctx.generated.data(),     ctx.generated.size(), ctx.rng_state};
    throw_if(o_->vt->apply(o_->self, &lc, &sc), "sampler '" + name_ + "'");
    if (lc.data != reinterpret_cast<loom_token_data*>(c.data.data()) || lc.size > c.data.size())
      fail(Errc::internal, "plugin", "sampler '" + name_ + "' replaced or grew the candidate array");
    if (lc.selected >= static_cast<int64_t>(lc.size))
      fail(Errc::internal, "plugin", "sampler '" + name_ + "' selected an index outside the candidates");
    c.data = c.data.first(lc.size);
    c.sorted = lc.sorted != 0;
    c.has_probs = lc.has_probs != 0;
    c.selected = lc.selected;
  }
  void accept(TokenId token) override {
    if (LOOM_HAS(o_->vt, loom_sampler_i, accept) && o_->vt->accept) o_->vt->accept(o_->self, token);
  }
  void reset() override {
    if (LOOM_HAS(o_->vt, loom_sampler_i, reset) && o_->vt->reset) o_->vt->reset(o_->self);
  }
  std::unique_ptr<Sampler> clone() const override {
    void* out = nullptr;
    throw_if(o_->vt->clone(o_->self, &out), "cloning sampler '" + name_ + "'");
    return std::make_unique<PluginSampler>(std::make_shared<Object<loom_sampler_i>>(o_->lib, out, o_->vt),
                                           name_);
  }
  bool selects() const noexcept override {
    return LOOM_HAS(o_->vt, loom_sampler_i, selects) && o_->vt->selects && o_->vt->selects(o_->self) != 0;
  }

private:
  std::shared_ptr<Object<loom_sampler_i>> o_;
  std::string name_;
};

// ---- stop criteria ----

// The longest text a stop verdict may say matched (a stop string, not a document).
constexpr size_t k_max_matched_bytes = 64 * 1024;

// A plugin's stop criterion (loom_stop_i) as one more StopCriterion of the sequence's StopTracker.
class PluginStopAdapter final : public StopCriterion {
public:
  PluginStopAdapter(std::shared_ptr<Object<loom_stop_i>> o, std::string name)
      : o_(std::move(o)), name_(std::move(name)) {}
  std::string_view name() const noexcept override { return name_; }
  StopVerdict check(const StopInput& in) override {
    const loom_stop_input li{sizeof(loom_stop_input), in.token,           in.piece.data(), in.piece.size(),
                             in.generated.data(),     in.generated.size()};
    loom_stop_verdict v{};
    throw_if(o_->vt->check(o_->self, &li, &v), "stop criterion '" + name_ + "'");
    if (v.reason <= LOOM_STOP_NONE) return {};
    // A reason past `custom` (error, or one this host does not know) is the plugin's own: custom.
    const auto reason = v.reason >= LOOM_STOP_CUSTOM ? StopReason::custom : static_cast<StopReason>(v.reason);
    // drop is bounded by the text held (StopTracker); matched is the plugin's until its next call.
    if (v.matched && v.matched_len > k_max_matched_bytes)
      fail(Errc::invalid_argument, "plugin",
           "stop criterion '" + name_ + "' returned a matched text of " + std::to_string(v.matched_len) +
               " bytes; expected a stop text of at most " + std::to_string(k_max_matched_bytes));
    return {reason, v.drop, v.matched ? std::string(v.matched, v.matched_len) : std::string()};
  }
  size_t holdback_bytes() const override {
    return LOOM_HAS(o_->vt, loom_stop_i, holdback_bytes) && o_->vt->holdback_bytes
               ? o_->vt->holdback_bytes(o_->self)
               : 0;
  }
  std::unique_ptr<StopCriterion> clone() const override {
    void* out = nullptr;
    throw_if(o_->vt->clone(o_->self, &out), "cloning stop criterion '" + name_ + "'");
    return std::make_unique<PluginStopAdapter>(std::make_shared<Object<loom_stop_i>>(o_->lib, out, o_->vt),
                                               name_);
  }

private:
  std::shared_ptr<Object<loom_stop_i>> o_;
  std::string name_;
};

// ---- verifiers ----

class PluginVerifier final : public Verifier {
public:
  PluginVerifier(std::unique_ptr<Object<loom_verifier_i>> o, std::string name)
      : o_(std::move(o)), name_(std::move(name)) {}
  double score(std::string_view prompt, std::string_view text, std::string_view task) override {
    double v = -1;
    throw_if(o_->vt->score(o_->self, prompt.data(), prompt.size(), text.data(), text.size(),
                           task.empty() ? nullptr : task.data(), task.size(), &v),
             "verifier '" + name_ + "'");
    if (!(v >= 0.0 && v <= 1.0))
      fail(Errc::invalid_argument, "plugin",
           "verifier '" + name_ + "' returned the score " + std::to_string(v) +
               "; expected a number in [0, 1]");
    return v;
  }

private:
  std::unique_ptr<Object<loom_verifier_i>> o_;
  std::string name_;
};

// ---- decoders ----

class PluginDecoder final : public Decoder {
public:
  PluginDecoder(std::unique_ptr<Object<loom_decoder_i>> o, std::string name)
      : o_(std::move(o)), name_(std::move(name)) {}
  std::string_view name() const noexcept override { return name_; }
  void start(Session& s) override {
    if (LOOM_HAS(o_->vt, loom_decoder_i, start) && o_->vt->start)
      throw_if(o_->vt->start(o_->self, s.raw()), "decoder '" + name_ + "' start");
  }
  void plan(Session& s) override {
    throw_if(o_->vt->plan(o_->self, s.raw()), "decoder '" + name_ + "' plan");
  }
  void update(Session& s) override {
    throw_if(o_->vt->update(o_->self, s.raw()), "decoder '" + name_ + "' update");
  }
  bool done(const Session& s) const override { return o_->vt->done(o_->self, s.raw()) != 0; }
  void results(Session& s) override {
    throw_if(o_->vt->results(o_->self, s.raw()), "decoder '" + name_ + "' results");
  }

private:
  std::unique_ptr<Object<loom_decoder_i>> o_;
  std::string name_;
};

} // namespace

std::unique_ptr<Sampler> make_plugin_sampler(const PluginRegistry::Found& f, const SamplerSpec& spec) {
  auto o = create_object<loom_sampler_i>(
      f, spec.name, spec.params, spec.where,
      {offsetof(loom_sampler_i, apply), offsetof(loom_sampler_i, clone), offsetof(loom_sampler_i, destroy)});
  return std::make_unique<PluginSampler>(std::shared_ptr<Object<loom_sampler_i>>(std::move(o)), spec.name);
}

std::unique_ptr<StopCriterion> make_plugin_stop(const PluginRegistry::Found& f, const SamplerSpec& spec) {
  auto o = create_object<loom_stop_i>(
      f, spec.name, spec.params, spec.where,
      {offsetof(loom_stop_i, check), offsetof(loom_stop_i, clone), offsetof(loom_stop_i, destroy)});
  return std::make_unique<PluginStopAdapter>(std::shared_ptr<Object<loom_stop_i>>(std::move(o)), spec.name);
}

std::shared_ptr<Verifier> make_plugin_verifier(const PluginRegistry::Found& f, const std::string& name,
                                               const std::vector<std::pair<std::string, ParamValue>>& params,
                                               const std::string& where) {
  auto o = create_object<loom_verifier_i>(
      f, name, params, where, {offsetof(loom_verifier_i, score), offsetof(loom_verifier_i, destroy)});
  return std::make_shared<PluginVerifier>(std::move(o), name);
}

std::function<std::unique_ptr<Decoder>()>
make_plugin_decoder_factory(const PluginRegistry::Found& f, std::string name,
                            std::vector<std::pair<std::string, ParamValue>> params, std::string where) {
  const std::initializer_list<size_t> required = {
      offsetof(loom_decoder_i, plan), offsetof(loom_decoder_i, update), offsetof(loom_decoder_i, done),
      offsetof(loom_decoder_i, results), offsetof(loom_decoder_i, destroy)};
  (void)create_object<loom_decoder_i>(f, name, params, where, required); // validate the table now
  auto shared_params = std::make_shared<std::vector<std::pair<std::string, ParamValue>>>(std::move(params));
  return [f, name, shared_params, where] {
    auto o = create_object<loom_decoder_i>(f, name, *shared_params, where,
                                           {offsetof(loom_decoder_i, plan), offsetof(loom_decoder_i, update),
                                            offsetof(loom_decoder_i, done), offsetof(loom_decoder_i, results),
                                            offsetof(loom_decoder_i, destroy)});
    return std::unique_ptr<Decoder>(std::make_unique<PluginDecoder>(std::move(o), name));
  };
}

} // namespace loom::plugin
