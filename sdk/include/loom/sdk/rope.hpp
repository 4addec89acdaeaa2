// loom/sdk/rope.hpp — rotary position embedding: the angles of one position, shared by the host and
// every backend (header-only).
#pragma once

#include "loom/sdk/graph.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace loom {

// cos and sin (times the YaRN magnitude) of each rotated pair i < n_dims/2 at position p, after
// ggml's formulas: theta_i = p · base^(−2i/n_dims), linear scaling by freq_scale, and with
// ext_factor ≠ 0 the YaRN ramp between interpolated and extrapolated angles. `freq_factors` (a rope
// node's src2, n_dims/2 values, or null) divide each pair's frequency, as Llama 3.1's rope_freqs do.
inline void rope_table(const RopeParams& rp, Pos p, float* cs, float* sn,
                       const float* freq_factors = nullptr) {
  const int64_t nd = rp.n_dims;
  float corr_lo = 0.0f, corr_hi = 0.0f; // dims whose wavelength fits the original context
  if (rp.ext_factor != 0.0f) {
    const auto corr_dim = [&](float n_rot) {
      return static_cast<float>(nd) *
             std::log(static_cast<float>(rp.orig_ctx) / (n_rot * 2.0f * static_cast<float>(M_PI))) /
             (2.0f * std::log(rp.theta));
    };
    corr_lo = std::max(0.0f, std::floor(corr_dim(rp.beta_fast)));
    corr_hi = std::min(static_cast<float>(nd - 1), std::ceil(corr_dim(rp.beta_slow)));
  }
  for (int64_t i0 = 0; i0 < nd; i0 += 2) {
    const double theta_extrap =
        static_cast<double>(p) *
        std::pow(static_cast<double>(rp.theta), -static_cast<double>(i0) / static_cast<double>(nd)) /
        (freq_factors ? static_cast<double>(freq_factors[i0 / 2]) : 1.0);
    const double theta_interp = static_cast<double>(rp.freq_scale) * theta_extrap;
    double theta = theta_interp;
    double mscale = static_cast<double>(rp.attn_factor);
    if (rp.ext_factor != 0.0f) {
      const float ramp_y = (static_cast<float>(i0 / 2) - corr_lo) / std::max(0.001f, corr_hi - corr_lo);
      const float ramp = 1.0f - std::min(1.0f, std::max(0.0f, ramp_y));
      const double mix = static_cast<double>(ramp * rp.ext_factor);
      theta = theta_interp * (1.0 - mix) + theta_extrap * mix;
      mscale *= 1.0 + 0.1 * std::log(1.0 / static_cast<double>(rp.freq_scale));
    }
    cs[i0 / 2] = static_cast<float>(std::cos(theta) * mscale);
    sn[i0 / 2] = static_cast<float>(std::sin(theta) * mscale);
  }
}

// Rotates one head vector x[D] in place with a position's table (pairs (i, i+n_dims/2) for NeoX,
// else (2i, 2i+1)); dims ≥ n_dims are left as they are.
inline void rope_rotate(const RopeParams& rp, const float* cs, const float* sn, float* x) {
  const int64_t half = rp.n_dims / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = rp.neox ? i : 2 * i, b = rp.neox ? i + half : 2 * i + 1;
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * cs[i] - x1 * sn[i];
    x[b] = x0 * sn[i] + x1 * cs[i];
  }
}

} // namespace loom
