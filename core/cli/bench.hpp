// core/cli/bench.hpp — what the three `loom bench` benchmarks share: the token benchmark
// (bench_tokens.cpp), the load benchmark (bench_load.cpp) and the bandwidth probe (bench_bandwidth.cpp);
// cmd_bench.cpp parses the options and picks one.
#pragma once

#include "cli.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace loom::cli {

// The middle value (the mean of the two middle ones for an even count); 0 for no values.
double median(std::vector<double> v);
// The process's peak resident set, bytes.
uint64_t peak_rss_bytes();

// The pipeline both model benchmarks run: the user's, with --threads, room for n_ctx positions, greedy
// decoding and no stop rule but the token count.
PipelineConfig bench_config(const po::variables_map& vm, int n_ctx);
// One short request before the timed ones: pages in the weights, builds the graphs.
void warm_up(Pipeline& p, std::vector<TokenId> prompt);

// `loom bench` (prefill and decode at --pp / --tg / -d), `--requests N` and `--bandwidth`.
int token_bench(const po::variables_map& vm);
int load_bench(const po::variables_map& vm);
int bandwidth_probe(const po::variables_map& vm);

} // namespace loom::cli
