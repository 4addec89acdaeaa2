// quantize.cpp — `loom quantize` (loom/model/synth.hpp): a GGUF model copied with its matrices converted to
// another weight type, rows converted on all cores; quantize_target, llama-quantize's fallback types.
#include "format/gguf_file_type.hpp"
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "loom/model/synth.hpp"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <thread>

namespace loom {

namespace {

bool fs_same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return std::filesystem::exists(b, ec) && std::filesystem::equivalent(a, b, ec);
}

// Every key of `in` but general.file_type and general.quantization_version, which name `type`.
void copy_metadata(GgufWriter& w, const GgufFile& in, DType type) {
  for (const auto& kv : in.metadata()) {
    if (kv.key == "general.file_type" || kv.key == "general.quantization_version") continue;
    w.add(kv.key, kv.value);
  }
  w.add_u32("general.file_type", file_type(type));
  if (is_quantized(type)) w.add_u32("general.quantization_version", 2);
}

// The tensors as written: matrices in quantize_target's type, the rest as they are.
std::vector<GgufWriter::TensorSpec> quantized_specs(const GgufFile& in, const QuantizeOptions& o) {
  std::vector<GgufWriter::TensorSpec> specs;
  for (const auto& t : in.tensors()) {
    if (!dtype_traits(t.type).can_dequantize)
      fail(Errc::unsupported, "quantize",
           o.in + ": tensor " + t.name + " has type " + std::string(dtype_name(t.type)) +
               ", which loom cannot read (it reads " + dtype_names(false) + ")");
    DType to = t.type;
    // Matrices and stacked experts; a MoE router stays as it is (as llama-quantize keeps it): its top-k
    // decides which experts run.
    if (t.ne.size() >= 2 && t.name.find("ffn_gate_inp") == std::string::npos) {
      to = quantize_target(o.type, t.ne[0]).value_or(t.type);
      if (to != o.type && o.on_fallback) o.on_fallback(t.name, to);
    }
    specs.push_back({t.name, to, t.ne});
  }
  return specs;
}

// Tensor t's rows converted to `to` into `bytes`: in contiguous ranges, one per thread (the k-quant
// searches cost ~100 ns a value).
void convert_rows(const GgufTensor& t, DType to, std::vector<uint8_t>& bytes, unsigned n_threads) {
  const int64_t cols = t.ne[0], rows = t.rows();
  const size_t rb_in = row_bytes(t.type, cols), rb = row_bytes(to, cols);
  bytes.resize(rb * static_cast<size_t>(rows));
  auto convert = [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = r0; r < r1; ++r) {
      dequantize_row(t.type, t.data + static_cast<size_t>(r) * rb_in, row.data(), cols);
      quantize_row(to, row.data(), bytes.data() + static_cast<size_t>(r) * rb, cols);
    }
  };
  const auto nt = static_cast<int64_t>(
      std::min<uint64_t>(n_threads, std::max<uint64_t>(1, static_cast<uint64_t>(t.n_elements) >> 16)));
  if (nt <= 1) {
    convert(0, rows);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(nt));
  for (int64_t k = 0; k < nt; ++k)
    pool.emplace_back([&, k] {
      try {
        convert(rows * k / nt, rows * (k + 1) / nt);
      } catch (...) {
        errors[static_cast<size_t>(k)] = std::current_exception();
      }
    });
  for (auto& th : pool)
    th.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

} // namespace

std::optional<DType> quantize_target(DType want, int64_t cols) {
  if (cols % dtype_traits(want).block_size == 0) return want;
  DType fb;
  switch (want) {
  case DType::q2_k:
  case DType::q3_k:
  case DType::iq4_xs:
    fb = DType::iq4_nl;
    break;
  case DType::q4_k:
    fb = DType::q5_0;
    break;
  case DType::q5_k:
    fb = DType::q5_1;
    break;
  case DType::q6_k:
    fb = DType::q8_0;
    break;
  default:
    return std::nullopt;
  }
  return cols % dtype_traits(fb).block_size == 0 ? fb : DType::f16;
}

void quantize_model(const QuantizeOptions& o) {
  if (!dtype_traits(o.type).can_quantize)
    fail(Errc::invalid_argument, "quantize",
         "type " + std::string(dtype_name(o.type)) + " is not offered; use one of " + dtype_names(true));
  const GgufFile in = GgufFile::open(o.in);
  GgufWriter w;
  copy_metadata(w, in, o.type);
  const std::vector<GgufWriter::TensorSpec> specs = quantized_specs(in, o);
  uint64_t total = 0, done = 0;
  for (const auto& t : in.tensors())
    total += static_cast<uint64_t>(t.n_elements);
  if (fs_same_file(o.in, o.out))
    fail(Errc::invalid_argument, "quantize", "the output " + o.out + " is the input; write to another file");
  const unsigned n_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 64u);
  w.write_streaming(o.out, specs, [&](size_t i, std::vector<uint8_t>& bytes) {
    const GgufTensor& t = in.tensors()[i];
    const DType to = specs[i].type;
    if (to == t.type)
      bytes.assign(t.data, t.data + t.n_bytes);
    else
      convert_rows(t, to, bytes, n_threads);
    done += static_cast<uint64_t>(t.n_elements);
    if (o.progress) o.progress(static_cast<double>(done) / static_cast<double>(std::max<uint64_t>(total, 1)));
  });
}

} // namespace loom
