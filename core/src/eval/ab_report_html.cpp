// An A/B experiment's report as one self-contained HTML page (loom/eval/ab_experiment.hpp): the summary
// table, strip plots of TPOT and output length, a panel of the differences' intervals per pair, a
// sweep's accuracy against compute, and the outputs of run 1 with the words not in the first
// variant's output marked. Inline SVG and CSS only: no script, nothing fetched.
#include "eval/ab_format.hpp"
#include "loom/eval/ab_experiment.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>

namespace loom::ab {

namespace {

std::string html_escape(std::string_view s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
    case '&':
      o += "&amp;";
      break;
    case '<':
      o += "&lt;";
      break;
    case '>':
      o += "&gt;";
      break;
    case '"':
      o += "&quot;";
      break;
    default:
      o += ch;
    }
  }
  return o;
}

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> w;
  std::string cur;
  for (char ch : s) {
    cur += ch;
    if (ch == ' ' || ch == '\n') {
      w.push_back(cur);
      cur.clear();
    }
  }
  if (!cur.empty()) w.push_back(cur);
  return w;
}

// `b` as HTML with the words not in the longest common subsequence with `a` marked.
std::string marked_diff(const std::string& a, const std::string& b) {
  const auto wa = words(a), wb = words(b);
  const size_t n = wa.size(), m = wb.size();
  if (n * m > 4'000'000) return html_escape(b); // too long to align: shown plain
  std::vector<std::vector<uint32_t>> L(n + 1, std::vector<uint32_t>(m + 1, 0));
  for (size_t i = n; i-- > 0;)
    for (size_t j = m; j-- > 0;)
      L[i][j] = wa[i] == wb[j] ? L[i + 1][j + 1] + 1 : std::max(L[i + 1][j], L[i][j + 1]);
  std::string out;
  size_t i = 0, j = 0;
  while (j < m) {
    if (i < n && wa[i] == wb[j]) {
      out += html_escape(wb[j]);
      ++i, ++j;
    } else if (i < n && L[i + 1][j] >= L[i][j + 1]) {
      ++i;
    } else {
      out += "<mark>" + html_escape(wb[j]) + "</mark>";
      ++j;
    }
  }
  return out;
}

// A strip plot of per-prompt values per variant (inline SVG).
std::string svg_strip(const std::string& title, const std::vector<std::string>& names,
                      const std::vector<std::vector<double>>& values) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& v : values)
    for (double x : v)
      if (std::isfinite(x)) lo = std::min(lo, x), hi = std::max(hi, x);
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (hi == lo) hi = lo + 1;
  const int W = 560, row = 28, left = 140, H = 40 + row * static_cast<int>(names.size());
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' role='img'><title>"
    << html_escape(title) << "</title><text x='4' y='16' font-size='13'>" << html_escape(title) << "</text>";
  const auto X = [&](double x) { return left + (x - lo) / (hi - lo) * (W - left - 20); };
  for (size_t v = 0; v < names.size(); ++v) {
    const int y = 40 + row * static_cast<int>(v);
    o << "<text x='4' y='" << y + 4 << "' font-size='12'>" << html_escape(names[v]) << "</text>";
    o << "<line x1='" << left << "' x2='" << W - 20 << "' y1='" << y << "' y2='" << y << "' stroke='#ddd'/>";
    std::vector<double> xs;
    for (double x : values[v])
      if (std::isfinite(x)) {
        xs.push_back(x);
        o << "<circle cx='" << X(x) << "' cy='" << y << "' r='3' fill='#3060c0' fill-opacity='0.5'/>";
      }
    if (!xs.empty()) {
      const double mu = mean(xs);
      o << "<line x1='" << X(mu) << "' x2='" << X(mu) << "' y1='" << y - 9 << "' y2='" << y + 9
        << "' stroke='#c03030' stroke-width='2'/>";
    }
  }
  o << "<text x='" << left << "' y='" << H - 4 << "' font-size='11'>" << fmt(lo) << "</text><text x='"
    << W - 80 << "' y='" << H - 4 << "' font-size='11'>" << fmt(hi) << "</text></svg>";
  return o.str();
}

// Accuracy against a compute measure, one polyline per curve, a point per sweep value with its 95%
// interval as an error bar (inline SVG; a log2 x axis when the measure spans more than 4×).
struct CurvePoint {
  double x, y, lo, hi;
  std::string label;
};
std::string svg_curve(const std::string& title, const std::string& xlabel,
                      const std::vector<std::pair<std::string, std::vector<CurvePoint>>>& curves) {
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo;
  for (const auto& [n, pts] : curves)
    for (const auto& p : pts)
      if (p.x > 0) xlo = std::min(xlo, p.x), xhi = std::max(xhi, p.x);
  if (!std::isfinite(xlo)) xlo = 1, xhi = 2;
  const bool logx = xhi / xlo > 4;
  const auto tx = [&](double x) { return logx ? std::log2(std::max(x, 1e-12)) : x; };
  double a = tx(xlo), b = tx(xhi);
  if (b == a) a -= 0.5, b += 0.5;
  const int W = 620, H = 340, left = 60, right = 20, top = 30, bottom = 50;
  const auto X = [&](double x) { return left + (tx(x) - a) / (b - a) * (W - left - right); };
  const auto Y = [&](double y) { return top + (1.0 - y) * (H - top - bottom); };
  static const char* colors[] = {"#3060c0", "#c03030", "#2a8a2a", "#a060c0", "#c08020"};
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' class='sweep' width='" << W << "' height='" << H
    << "' role='img'><title>" << html_escape(title) << "</title><text x='4' y='16' font-size='13'>"
    << html_escape(title) << "</text>";
  for (int k = 0; k <= 4; ++k) { // accuracy grid
    const double y = k / 4.0;
    o << "<line x1='" << left << "' x2='" << W - right << "' y1='" << Y(y) << "' y2='" << Y(y)
      << "' stroke='#eee'/><text x='" << left - 34 << "' y='" << Y(y) + 4 << "' font-size='11'>" << fmt(y, 2)
      << "</text>";
  }
  o << "<text x='" << left << "' y='" << H - 8 << "' font-size='11'>" << html_escape(xlabel)
    << (logx ? " (log scale)" : "") << ": " << fmt(xlo, 0) << " … " << fmt(xhi, 0) << "</text>";
  size_t c = 0;
  for (const auto& [name, pts] : curves) {
    const char* col = colors[c++ % 5];
    std::string poly;
    for (const auto& p : pts)
      if (std::isfinite(p.y)) poly += fmt(X(p.x), 1) + "," + fmt(Y(p.y), 1) + " ";
    o << "<polyline fill='none' stroke='" << col << "' stroke-width='2' points='" << poly << "'/>";
    for (const auto& p : pts) {
      if (!std::isfinite(p.y)) continue;
      o << "<line x1='" << X(p.x) << "' x2='" << X(p.x) << "' y1='" << Y(p.lo) << "' y2='" << Y(p.hi)
        << "' stroke='" << col << "'/><circle cx='" << X(p.x) << "' cy='" << Y(p.y) << "' r='4' fill='" << col
        << "'/><text x='" << X(p.x) + 6 << "' y='" << Y(p.y) - 6 << "' font-size='11'>"
        << html_escape(p.label) << "</text>";
    }
    o << "<text x='" << W - 200 << "' y='" << top + 14 * static_cast<int>(c) << "' font-size='11' fill='"
      << col << "'>" << html_escape(name) << "</text>";
  }
  o << "</svg>";
  return o.str();
}

// What every section reads: the result, its JSON document and the variants' names.
struct Page {
  const Result& r;
  const nlohmann::json& J;
  std::vector<std::string> names;
};

void html_head(std::ostream& h, const Page& pg) {
  const Options& o = pg.r.options;
  h << "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>loom ab</title><style>"
       "body{font-family:sans-serif;margin:24px;max-width:1200px}table{border-collapse:collapse;margin:"
       "12px 0}"
       "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f4f4f4}"
       "td.l{text-align:left}.better{background:#e3f6e3}.worse{background:#fbe3e3}mark{background:#ffe28a}"
       ".out{white-space:pre-wrap;text-align:left;vertical-align:top;font-family:monospace;font-size:12px}"
       ".right{color:#1a7a1a;font-weight:bold}.wrong{color:#b02020;font-weight:bold}"
       "</style></head><body><h1>loom ab</h1>";
  h << "<p>" << pg.r.prompts.size() << " prompts × " << o.runs << " runs × " << pg.names.size()
    << " variants; seeds " << o.seed << " + i·" << o.runs << " + r; " << o.bootstrap
    << " bootstrap resamples (" << ci_name(o.ci) << "), 95% intervals"
    << (pg.r.interrupted ? "; <b>interrupted</b>: partial results" : "") << ".</p>";
  const auto& vs = pg.r.variants;
  if (std::none_of(vs.begin(), vs.end(), [](const Variant& v) { return !v.chat_template.empty(); })) return;
  h << "<table id='templates'><tr><th>variant</th><th>conversations rendered with</th></tr>";
  for (const Variant& v : vs)
    h << "<tr><td class='l'>" << html_escape(v.name) << "</td><td class='l'>" << html_escape(v.chat_template)
      << "</td></tr>";
  h << "</table>";
}

// Per metric: each variant's mean, then each pair's difference with its interval and verdict.
void html_summary(std::ostream& h, const Page& pg) {
  const auto& names = pg.names;
  const size_t V = names.size();
  h << "<table id='summary'><tr><th>metric</th>";
  for (const auto& n : names)
    h << "<th>" << html_escape(n) << "</th>";
  for (size_t b = 1; b < V; ++b)
    h << "<th>" << html_escape(names[b]) << " − " << html_escape(names[0]) << " [95% CI]</th>";
  h << "</tr>";
  for (const auto& m : pg.r.aggregates.metric_names) {
    if (!has_data(pg.J, m)) continue;
    h << "<tr><td class='l'>" << html_escape(m) << "</td>";
    for (size_t v = 0; v < V; ++v) {
      const auto& mm = pg.J["aggregates"][v]["metrics"][m]["mean"];
      h << "<td>" << (mm.is_null() ? "—" : fmt(mm.get<double>())) << "</td>";
    }
    for (size_t b = 1; b < V; ++b) {
      const nlohmann::json& pr_b = pg.J["pairs"][b - 1];
      if (!pr_b.contains("metrics") || !pr_b["metrics"].contains(m)) {
        h << "<td>—</td>";
        continue;
      }
      const auto& x = pr_b["metrics"][m];
      const std::string verdict = x["verdict"].get<std::string>();
      h << "<td class='" << verdict << "'>" << fmt(x["diff"].get<double>()) << " ["
        << fmt(x["ci"][0].get<double>()) << ", " << fmt(x["ci"][1].get<double>()) << "] "
        << html_escape(verdict) << "</td>";
    }
    h << "</tr>";
  }
  h << "</table>";
}

void html_distributions(std::ostream& h, const Page& pg) {
  const auto& pp = pg.r.aggregates.per_prompt;
  h << "<h2>Distributions (per prompt; red: mean)</h2>" << svg_strip("TPOT (ms)", pg.names, pp.at("tpot_ms"))
    << svg_strip("output length (tokens)", pg.names, pp.at("tokens"));
}

// The differences of a pair with their intervals, each metric scaled to its own range (inline SVG).
std::string svg_differences(const std::string& a, const std::string& b, const nlohmann::json& pm) {
  std::ostringstream o;
  const int W = 620, row = 24, left = 170, H = 40 + row * static_cast<int>(pm.size());
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' role='img'><title>"
    << "differences " << html_escape(b) << " − " << html_escape(a) << "</title>";
  int k = 0;
  for (const auto& [m, x] : pm.items()) {
    const double lo = x["ci"][0].get<double>(), hi = x["ci"][1].get<double>(), d = x["diff"].get<double>();
    const double span = std::max({std::fabs(lo), std::fabs(hi), std::fabs(d), 1e-12});
    const auto X = [&](double v) { return left + (v / span * 0.5 + 0.5) * (W - left - 20); };
    const int y = 30 + row * k++;
    const std::string color = x["verdict"] == "better"  ? "#2a8a2a"
                              : x["verdict"] == "worse" ? "#b02a2a"
                                                        : "#666";
    o << "<text x='4' y='" << y + 4 << "' font-size='12'>" << html_escape(m) << "</text>"
      << "<line x1='" << X(0) << "' x2='" << X(0) << "' y1='" << y - 10 << "' y2='" << y + 10
      << "' stroke='#aaa'/><line x1='" << X(lo) << "' x2='" << X(hi) << "' y1='" << y << "' y2='" << y
      << "' stroke='" << color << "' stroke-width='3'/><circle cx='" << X(d) << "' cy='" << y
      << "' r='4' fill='" << color << "'/>";
  }
  o << "</svg>";
  return o.str();
}

// Variant b against the first: the differences' panel, agreement, win/tie/loss, McNemar, greedy identity.
void html_pair(std::ostream& h, const Page& pg, size_t b) {
  const auto& names = pg.names;
  const nlohmann::json& pr = pg.J["pairs"][b - 1];
  static const nlohmann::json no_metrics = nlohmann::json::object();
  h << "<h2>" << html_escape(names[b]) << " − " << html_escape(names[0])
    << " (95% CI; each metric scaled to its own range, the grey line is 0)</h2>"
    << svg_differences(names[0], names[b], pr.contains("metrics") ? pr["metrics"] : no_metrics);
  h << "<p>agreement (same text): "
    << (pr["agreement"].is_null() ? std::string("—") : fmt(pr["agreement"].get<double>()))
    << "; win/tie/loss by mean log-prob: " << pr["logprob_win_tie_loss"][0] << "/"
    << pr["logprob_win_tie_loss"][1] << "/" << pr["logprob_win_tie_loss"][2]
    << "; McNemar exact p on exact match: " << fmt(pr["mcnemar"]["p"].get<double>()) << "</p>";
  if (!pr["same_vocabulary"].get<bool>())
    h << "<p>Different vocabularies: only time and exact match are compared (token counts, log-probs and "
         "distinct-n are per model).</p>";
  if (pr.contains("greedy_identical")) {
    const auto& gi = pr["greedy_identical"];
    h << "<p class='" << (gi["identical"] == gi["runs"] ? "better" : "worse")
      << "'>greedy outputs identical (tokens): " << gi["identical"].get<int64_t>() << " of "
      << gi["runs"].get<int64_t>() << " runs";
    for (const auto& d : gi["differing_prompts"])
      h << (&d == &gi["differing_prompts"].front() ? "; differing: " : ", ")
        << html_escape(d.get<std::string>());
    h << "</p>";
  }
}

// A sweep point's row of the sweep table; its points on the two curves.
void html_sweep_point(std::ostream& h, const std::string& cname, const nlohmann::json& p,
                      std::vector<CurvePoint>& by_tokens, std::vector<CurvePoint>& by_wall) {
  const bool has = p.contains("accuracy");
  const double y = has ? p["accuracy"].get<double>() : std::nan("");
  const double lo = has ? p["ci"][0].get<double>() : y, hi = has ? p["ci"][1].get<double>() : y;
  const std::string label = p["value"].get<std::string>();
  by_tokens.push_back({p["tokens_evaluated"].get<double>(), y, lo, hi, label});
  by_wall.push_back({p["wall_s"].get<double>(), y, lo, hi, label});
  h << "<tr><td class='l'>" << html_escape(cname) << "</td><td>" << html_escape(label) << "</td><td>"
    << (has ? fmt(y) + " [" + fmt(lo) + ", " + fmt(hi) + "]" : std::string("—")) << "</td><td>"
    << fmt(p["tokens_evaluated"].get<double>(), 0) << "</td><td>"
    << (p["tokens_per_run"].is_null() ? std::string("—") : fmt(p["tokens_per_run"].get<double>(), 1))
    << "</td><td>" << fmt(p["wall_s"].get<double>(), 2) << "</td>";
  if (p.contains("gain"))
    h << "<td class='" << (p["gain"]["pays"].get<bool>() ? "better" : "") << "'>"
      << fmt(p["gain"]["diff"].get<double>()) << " [" << fmt(p["gain"]["ci"][0].get<double>()) << ", "
      << fmt(p["gain"]["ci"][1].get<double>()) << "]</td>";
  else
    h << "<td>—</td>";
  h << "</tr>";
}

// The sweep: its table, where more compute stops paying, and accuracy against tokens and wall time.
void html_sweep(std::ostream& h, const nlohmann::json& sw) {
  std::vector<std::pair<std::string, std::vector<CurvePoint>>> by_tokens, by_wall;
  h << "<h2>Accuracy against compute: " << html_escape(sw["key"].get<std::string>())
    << "</h2><table id='sweep'><tr><th>config</th><th>value</th><th>accuracy [95% CI]</th>"
       "<th>tokens evaluated</th><th>per run</th><th>wall s</th><th>gain over the previous [95% "
       "CI]</th></tr>";
  for (const auto& cv : sw["curves"]) {
    const std::string cname = std::filesystem::path(cv["config"].get<std::string>()).stem().string();
    std::vector<CurvePoint> pt, pw;
    for (const auto& p : cv["points"])
      html_sweep_point(h, cname, p, pt, pw);
    by_tokens.emplace_back(cname, pt);
    by_wall.emplace_back(cname, pw);
  }
  h << "</table>";
  for (const auto& cv : sw["curves"])
    h << "<p>" << html_escape(std::filesystem::path(cv["config"].get<std::string>()).stem().string()) << ": "
      << (cv["stops_paying_after"].is_null()
              ? std::string("every step up in compute paid (its accuracy gain resolved above 0)")
              : "more compute stops paying after " + html_escape(sw["key"].get<std::string>()) + " = " +
                    html_escape(cv["stops_paying_after"].get<std::string>()) +
                    " (the next gain's interval is not above 0)")
      << "</p>";
  h << svg_curve("accuracy against tokens evaluated (95% CI)", "tokens evaluated", by_tokens)
    << svg_curve("accuracy against wall time (95% CI)", "wall seconds", by_wall);
}

// A variant's output of run 1 of a prompt: failed, or its text (marked against the first variant's)
// with its answer right or wrong.
void html_output_cell(std::ostream& h, const std::vector<const Row*>& rr, size_t v) {
  if (!rr[v]) {
    h << "<td class='out'>—</td>";
  } else if (!rr[v]->ok) {
    h << "<td class='out'>failed: " << html_escape(rr[v]->error) << "</td>";
  } else {
    const std::string base = rr[0] && rr[0]->ok ? rr[0]->result.text : std::string();
    std::string mark;
    if (rr[v]->correct)
      mark = std::string("<div class='") + (*rr[v]->correct ? "right'>✓ " : "wrong'>✗ ") +
             html_escape(rr[v]->answer.empty() ? std::string("(no answer)") : rr[v]->answer) + "</div>";
    h << "<td class='out'>" << mark
      << (v == 0 ? html_escape(rr[v]->result.text) : marked_diff(base, rr[v]->result.text)) << "</td>";
  }
}

void html_outputs(std::ostream& h, const Page& pg) {
  const auto& names = pg.names;
  const auto& prompts = pg.r.prompts;
  const size_t V = names.size();
  const bool any_expected =
      std::any_of(prompts.begin(), prompts.end(), [](const Prompt& p) { return p.expected.has_value(); });
  h << "<h2>Outputs (run 1; marked: words not in " << html_escape(names[0]) << "'s output"
    << (any_expected ? "; ✓ right, ✗ wrong: the extracted answer against the expected one" : "")
    << ")</h2><table id='outputs'><tr><th>prompt</th>";
  if (any_expected) h << "<th>expected</th>";
  for (const auto& n : names)
    h << "<th>" << html_escape(n) << "</th>";
  h << "</tr>";
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<const Row*> rr(V, nullptr);
    for (const auto& row : pg.r.rows)
      if (row.prompt == i && row.run == 0) rr[row.variant] = &row;
    h << "<tr><td class='out'>" << html_escape(prompts[i].prompt) << "</td>";
    if (any_expected) h << "<td class='out'>" << html_escape(prompts[i].expected.value_or("")) << "</td>";
    for (size_t v = 0; v < V; ++v)
      html_output_cell(h, rr, v);
    h << "</tr>";
  }
  h << "</table></body></html>\n";
}

} // namespace

std::string report_html(const Result& r, const nlohmann::json& doc) {
  Page pg{r, doc, {}};
  for (const Variant& v : r.variants)
    pg.names.push_back(v.name);
  std::ostringstream h;
  html_head(h, pg);
  html_summary(h, pg);
  html_distributions(h, pg);
  for (size_t b = 1; b < pg.names.size(); ++b)
    html_pair(h, pg, b);
  if (doc.contains("sweep")) html_sweep(h, doc["sweep"]);
  html_outputs(h, pg);
  return h.str();
}

} // namespace loom::ab
