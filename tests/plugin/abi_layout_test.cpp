// abi_layout_test.cpp — freezes the memory layout of the plugin ABI (sdk/include/loom/sdk/abi.h).
//
// A plugin built against one SDK must keep working with a later host of the same ABI major, so a
// field's offset never changes: new fields are appended at the end of a table (the reader checks
// struct_size) and described in a NEW block below, guarded by the minor that added them. If an
// assertion here fails, the change breaks every plugin already built: revert it, or bump
// LOOM_ABI_MAJOR (and write a new block for the new major).
//
// The numbers are bytes on LP64 (Linux/macOS x86-64 and AArch64): pointers, size_t and function
// pointers are 8 bytes, int32_t/uint32_t/float 4, int64_t 8.
#include "loom/sdk/abi.h"
#include "loom/sdk/backend.h"

#include <cstddef>
#include <cstdint>
#include <gtest/gtest.h>
#include <type_traits>

#define LOOM_ABI_OFFSET(type, field, bytes)                                                                  \
  static_assert(offsetof(type, field) == (bytes), #type "::" #field " moved: ABI layouts are frozen")
#define LOOM_ABI_SIZE(type, bytes)                                                                           \
  static_assert(sizeof(type) == (bytes), "sizeof(" #type ") changed: ABI layouts are frozen")

// The layouts of ABI 3 (what each major and minor changed: sdk/CHANGELOG.md). A minor appends fields
// and adds a block at the end; a new major rewrites this file.
static_assert(LOOM_ABI_MAJOR == 3u, "a new ABI major needs its own frozen layouts here");

// The C ABI's tables must stay plain C data.
static_assert(std::is_standard_layout_v<loom_plugin> && std::is_trivially_copyable_v<loom_plugin>);
static_assert(std::is_standard_layout_v<loom_host> && std::is_trivially_copyable_v<loom_host>);
static_assert(std::is_standard_layout_v<loom_candidates> && std::is_trivially_copyable_v<loom_candidates>);
static_assert(sizeof(loom_token) == 4 && sizeof(loom_seq) == 4);

#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu && SIZE_MAX == 0xFFFFFFFFFFFFFFFFu

// ================================================================================================
// ABI 3.0 — DO NOT MODIFY; append new fields and add a new block
// ================================================================================================

// loom_plugin
LOOM_ABI_OFFSET(loom_plugin, struct_size, 0);
LOOM_ABI_OFFSET(loom_plugin, abi_major, 4);
LOOM_ABI_OFFSET(loom_plugin, abi_minor, 8);
LOOM_ABI_OFFSET(loom_plugin, name, 16);
LOOM_ABI_OFFSET(loom_plugin, version, 24);
LOOM_ABI_OFFSET(loom_plugin, n_factories, 32);
LOOM_ABI_OFFSET(loom_plugin, factories, 40);
LOOM_ABI_OFFSET(loom_plugin, shutdown, 48);
LOOM_ABI_OFFSET(loom_plugin, describe, 56);
LOOM_ABI_SIZE(loom_plugin, 64);
static_assert(LOOM_PLUGIN_SIZE_MIN == 56, "the least plugin table is 56 bytes");

// loom_factory
LOOM_ABI_OFFSET(loom_factory, struct_size, 0);
LOOM_ABI_OFFSET(loom_factory, kind, 4);
LOOM_ABI_OFFSET(loom_factory, name, 8);
LOOM_ABI_OFFSET(loom_factory, create, 16);
LOOM_ABI_SIZE(loom_factory, 24);

// loom_sampler_i
LOOM_ABI_OFFSET(loom_sampler_i, struct_size, 0);
LOOM_ABI_OFFSET(loom_sampler_i, apply, 8);
LOOM_ABI_OFFSET(loom_sampler_i, accept, 16);
LOOM_ABI_OFFSET(loom_sampler_i, reset, 24);
LOOM_ABI_OFFSET(loom_sampler_i, clone, 32);
LOOM_ABI_OFFSET(loom_sampler_i, selects, 40);
LOOM_ABI_OFFSET(loom_sampler_i, destroy, 48);
LOOM_ABI_SIZE(loom_sampler_i, 56);

// loom_stop_i
LOOM_ABI_OFFSET(loom_stop_i, struct_size, 0);
LOOM_ABI_OFFSET(loom_stop_i, check, 8);
LOOM_ABI_OFFSET(loom_stop_i, holdback_bytes, 16);
LOOM_ABI_OFFSET(loom_stop_i, clone, 24);
LOOM_ABI_OFFSET(loom_stop_i, destroy, 32);
LOOM_ABI_SIZE(loom_stop_i, 40);
LOOM_ABI_OFFSET(loom_stop_input, struct_size, 0);
LOOM_ABI_OFFSET(loom_stop_input, token, 4);
LOOM_ABI_OFFSET(loom_stop_input, piece, 8);
LOOM_ABI_OFFSET(loom_stop_input, piece_len, 16);
LOOM_ABI_OFFSET(loom_stop_input, generated, 24);
LOOM_ABI_OFFSET(loom_stop_input, n_generated, 32);
LOOM_ABI_SIZE(loom_stop_input, 40);
LOOM_ABI_OFFSET(loom_stop_verdict, reason, 0);
LOOM_ABI_OFFSET(loom_stop_verdict, drop, 8);
LOOM_ABI_OFFSET(loom_stop_verdict, matched, 16);
LOOM_ABI_OFFSET(loom_stop_verdict, matched_len, 24);
LOOM_ABI_SIZE(loom_stop_verdict, 32);

// loom_verifier_i
LOOM_ABI_OFFSET(loom_verifier_i, struct_size, 0);
LOOM_ABI_OFFSET(loom_verifier_i, score, 8);
LOOM_ABI_OFFSET(loom_verifier_i, destroy, 16);
LOOM_ABI_SIZE(loom_verifier_i, 24);

// loom_decoder_i
LOOM_ABI_OFFSET(loom_decoder_i, struct_size, 0);
LOOM_ABI_OFFSET(loom_decoder_i, start, 8);
LOOM_ABI_OFFSET(loom_decoder_i, plan, 16);
LOOM_ABI_OFFSET(loom_decoder_i, update, 24);
LOOM_ABI_OFFSET(loom_decoder_i, done, 32);
LOOM_ABI_OFFSET(loom_decoder_i, results, 40);
LOOM_ABI_OFFSET(loom_decoder_i, destroy, 48);
LOOM_ABI_SIZE(loom_decoder_i, 56);

// loom_token_data
LOOM_ABI_OFFSET(loom_token_data, id, 0);
LOOM_ABI_OFFSET(loom_token_data, logit, 4);
LOOM_ABI_OFFSET(loom_token_data, p, 8);
LOOM_ABI_SIZE(loom_token_data, 12);

// loom_sampler_ctx
LOOM_ABI_OFFSET(loom_sampler_ctx, struct_size, 0);
LOOM_ABI_OFFSET(loom_sampler_ctx, prompt, 8);
LOOM_ABI_OFFSET(loom_sampler_ctx, n_prompt, 16);
LOOM_ABI_OFFSET(loom_sampler_ctx, generated, 24);
LOOM_ABI_OFFSET(loom_sampler_ctx, n_generated, 32);
LOOM_ABI_OFFSET(loom_sampler_ctx, rng_state, 40);
LOOM_ABI_SIZE(loom_sampler_ctx, 48);

// ---- enum values are part of the ABI too ----
static_assert(LOOM_KIND_BACKEND == 1 && LOOM_KIND_DECODER == 2 && LOOM_KIND_SAMPLER == 3 &&
              LOOM_KIND_STOP == 4);
static_assert(LOOM_LOG_DEBUG == 0 && LOOM_LOG_INFO == 1 && LOOM_LOG_WARN == 2 && LOOM_LOG_ERROR == 3);
static_assert(LOOM_STATUS_INVALID_ARGUMENT == 1 && LOOM_STATUS_NOT_FOUND == 2 &&
              LOOM_STATUS_UNSUPPORTED == 3 && LOOM_STATUS_ABI_MISMATCH == 4 &&
              LOOM_STATUS_OUT_OF_MEMORY == 5 && LOOM_STATUS_DEVICE_ERROR == 6 && LOOM_STATUS_INTERNAL == 7);
static_assert(LOOM_STOP_NONE == 0 && LOOM_STOP_EOS == 1 && LOOM_STOP_STOP_TOKEN == 2 &&
              LOOM_STOP_STOP_STRING == 3 && LOOM_STOP_MAX_TOKENS == 4 && LOOM_STOP_MAX_CONTEXT == 5 &&
              LOOM_STOP_TIMEOUT == 6 && LOOM_STOP_CANCELLED == 7 && LOOM_STOP_CUSTOM == 8);
static_assert(LOOM_STOP_ERROR == 9);
static_assert(LOOM_CONFIG_NONE == 0 && LOOM_CONFIG_BOOL == 1 && LOOM_CONFIG_STRING == 4 &&
              LOOM_CONFIG_FLOAT_ARRAY == 6);
static_assert(LOOM_KIND_VERIFIER == 5);

// ---- the host and its versioned tables ----
// (The tables are asked for by version, loom_host.get_api(table, minor); a minor appends entries, so each
// entry's offset is frozen here; asserting the size as well catches an entry inserted in the middle.)
LOOM_ABI_OFFSET(loom_host, struct_size, 0);
LOOM_ABI_OFFSET(loom_host, abi_major, 4);
LOOM_ABI_OFFSET(loom_host, abi_minor, 8);
LOOM_ABI_OFFSET(loom_host, log, 16); // where every major has it: a plugin of another major logs its refusal
LOOM_ABI_OFFSET(loom_host, get_api, 24);
LOOM_ABI_OFFSET(loom_host, version, 32);
LOOM_ABI_SIZE(loom_host, 40);
static_assert(LOOM_API_CORE == 1u && LOOM_API_CONFIG == 2u && LOOM_API_SESSION == 3u &&
              LOOM_API_REQUEST == 4u && LOOM_API_DRAFT == 5u && LOOM_API_VERIFY == 6u);
LOOM_ABI_OFFSET(loom_core_api, status_create, 0);
LOOM_ABI_OFFSET(loom_core_api, status_code, 8);
LOOM_ABI_OFFSET(loom_core_api, status_message, 16);
LOOM_ABI_OFFSET(loom_core_api, status_free, 24);
LOOM_ABI_OFFSET(loom_core_api, rng_uniform, 32);
LOOM_ABI_SIZE(loom_core_api, 40);
LOOM_ABI_OFFSET(loom_config_api, get_i64, 0);
LOOM_ABI_OFFSET(loom_config_api, get_f64, 8);
LOOM_ABI_OFFSET(loom_config_api, get_bool, 16);
LOOM_ABI_OFFSET(loom_config_api, get_str, 24);
LOOM_ABI_OFFSET(loom_config_api, has, 32);
LOOM_ABI_OFFSET(loom_config_api, type, 40);
LOOM_ABI_OFFSET(loom_config_api, get_i64_array, 48);
LOOM_ABI_OFFSET(loom_config_api, get_f64_array, 56);
LOOM_ABI_SIZE(loom_config_api, 64);
LOOM_ABI_OFFSET(loom_session_info, struct_size, 0);
LOOM_ABI_OFFSET(loom_session_info, n_vocab, 4);
LOOM_ABI_OFFSET(loom_session_info, max_new_tokens, 8);
LOOM_ABI_OFFSET(loom_session_info, n_prompt, 16);
LOOM_ABI_SIZE(loom_session_info, 24);
LOOM_ABI_OFFSET(loom_session_api, info, 0);
LOOM_ABI_OFFSET(loom_session_api, seq_fork, 8);
LOOM_ABI_OFFSET(loom_session_api, seq_free, 16);
LOOM_ABI_OFFSET(loom_session_api, seq_truncate, 24);
LOOM_ABI_OFFSET(loom_session_api, seq_append, 32);
LOOM_ABI_OFFSET(loom_session_api, seq_tokens, 40);
LOOM_ABI_OFFSET(loom_session_api, seq_finished, 48);
LOOM_ABI_OFFSET(loom_session_api, plan, 56);
LOOM_ABI_OFFSET(loom_session_api, seq_logits, 64);
LOOM_ABI_OFFSET(loom_session_api, seq_sample, 72);
LOOM_ABI_OFFSET(loom_session_api, seq_logprob, 80);
LOOM_ABI_OFFSET(loom_session_api, seq_finish, 88);
LOOM_ABI_OFFSET(loom_session_api, seq_score, 96);
LOOM_ABI_OFFSET(loom_session_api, set_stream, 104);
LOOM_ABI_OFFSET(loom_session_api, add_result, 112);
LOOM_ABI_SIZE(loom_session_api, 120);
LOOM_ABI_OFFSET(loom_request_api, tokenize, 0);
LOOM_ABI_OFFSET(loom_request_api, detokenize, 8);
LOOM_ABI_OFFSET(loom_request_api, seq_probs, 16);
LOOM_ABI_OFFSET(loom_request_api, set_output, 24);
LOOM_ABI_OFFSET(loom_request_api, set_metric, 32);
LOOM_ABI_OFFSET(loom_request_api, uniform, 40);
LOOM_ABI_SIZE(loom_request_api, 48);
LOOM_ABI_OFFSET(loom_draft_api, seq_set_draft, 0);
LOOM_ABI_OFFSET(loom_draft_api, seq_commit, 8);
LOOM_ABI_OFFSET(loom_draft_api, seq_n_draft, 16);
LOOM_ABI_OFFSET(loom_draft_api, seq_logits_at, 24);
LOOM_ABI_OFFSET(loom_draft_api, has_draft, 32);
LOOM_ABI_OFFSET(loom_draft_api, seq_fork_draft, 40);
LOOM_ABI_OFFSET(loom_draft_api, seq_set_draft_tree, 48);
LOOM_ABI_OFFSET(loom_draft_api, seq_commit_node, 56);
LOOM_ABI_OFFSET(loom_draft_api, seq_max_tree_nodes, 64);
LOOM_ABI_OFFSET(loom_draft_api, seq_max_tree_depth, 72);
LOOM_ABI_SIZE(loom_draft_api, 80);
LOOM_ABI_OFFSET(loom_verify_api, verify, 0);
LOOM_ABI_OFFSET(loom_verify_api, verify_many, 8);
LOOM_ABI_SIZE(loom_verify_api, 16);
// loom_candidates: an array of loom_token_data that carries its element size
LOOM_ABI_OFFSET(loom_candidates, struct_size, 0);
LOOM_ABI_OFFSET(loom_candidates, data_size, 4);
LOOM_ABI_OFFSET(loom_candidates, data, 8);
LOOM_ABI_OFFSET(loom_candidates, size, 16);
LOOM_ABI_OFFSET(loom_candidates, sorted, 24);
LOOM_ABI_OFFSET(loom_candidates, has_probs, 28);
LOOM_ABI_OFFSET(loom_candidates, selected, 32);
LOOM_ABI_SIZE(loom_candidates, 40);

// ---- loom/sdk/backend.h ----
LOOM_ABI_OFFSET(loom_tensor, name, 0);
LOOM_ABI_OFFSET(loom_tensor, kind, 8);
LOOM_ABI_OFFSET(loom_tensor, dtype, 12);
LOOM_ABI_OFFSET(loom_tensor, ne, 16);
LOOM_ABI_OFFSET(loom_tensor, data, 48);
LOOM_ABI_OFFSET(loom_tensor, weight, 56);
LOOM_ABI_SIZE(loom_tensor, 64);
LOOM_ABI_OFFSET(loom_weight, id, 0);
LOOM_ABI_OFFSET(loom_weight, name, 8);
LOOM_ABI_OFFSET(loom_weight, dtype, 16);
LOOM_ABI_OFFSET(loom_weight, ne, 24);
LOOM_ABI_OFFSET(loom_weight, data, 56);
LOOM_ABI_OFFSET(loom_weight, bytes, 64);
LOOM_ABI_OFFSET(loom_weight, uses, 72);
LOOM_ABI_SIZE(loom_weight, 80);
LOOM_ABI_OFFSET(loom_rope_params, n_dims, 0);
LOOM_ABI_OFFSET(loom_rope_params, beta_slow, 32);
LOOM_ABI_SIZE(loom_rope_params, 36);
LOOM_ABI_OFFSET(loom_attention_params, layer, 0);
LOOM_ABI_OFFSET(loom_attention_params, softcap, 24);
LOOM_ABI_OFFSET(loom_attention_params, sinks, 28);
LOOM_ABI_OFFSET(loom_attention_params, kernel, 32);
LOOM_ABI_SIZE(loom_attention_params, 36);
LOOM_ABI_OFFSET(loom_node, op, 0);
LOOM_ABI_OFFSET(loom_node, src, 4);
LOOM_ABI_OFFSET(loom_node, dst, 16);
LOOM_ABI_OFFSET(loom_node, eps, 20);
LOOM_ABI_OFFSET(loom_node, scale, 24);
LOOM_ABI_OFFSET(loom_node, rope, 28);
LOOM_ABI_OFFSET(loom_node, attn, 64);
LOOM_ABI_OFFSET(loom_node, moe, 100);
LOOM_ABI_OFFSET(loom_node, attn_sink_logits, 116);
LOOM_ABI_OFFSET(loom_node, glu_alpha, 120);
LOOM_ABI_OFFSET(loom_node, glu_limit, 124);
LOOM_ABI_SIZE(loom_node, 128);
LOOM_ABI_OFFSET(loom_moe_params, n_used, 0);
LOOM_ABI_OFFSET(loom_moe_params, weights_scale, 12);
LOOM_ABI_SIZE(loom_moe_params, 16);
LOOM_ABI_OFFSET(loom_graph, struct_size, 0);
LOOM_ABI_OFFSET(loom_graph, n_tensors, 8);
LOOM_ABI_OFFSET(loom_graph, tensors, 16);
LOOM_ABI_OFFSET(loom_graph, tensor_size, 24);
LOOM_ABI_OFFSET(loom_graph, n_nodes, 32);
LOOM_ABI_OFFSET(loom_graph, nodes, 40);
LOOM_ABI_OFFSET(loom_graph, node_size, 48);
LOOM_ABI_OFFSET(loom_graph, n_tokens, 56);
LOOM_ABI_OFFSET(loom_graph, n_outputs, 60);
LOOM_ABI_OFFSET(loom_graph, in_tokens, 64);
LOOM_ABI_OFFSET(loom_graph, in_positions, 68);
LOOM_ABI_OFFSET(loom_graph, in_out_ids, 72);
LOOM_ABI_OFFSET(loom_graph, out_logits, 76);
LOOM_ABI_OFFSET(loom_graph, id, 80);
LOOM_ABI_SIZE(loom_graph, 88);
LOOM_ABI_OFFSET(loom_kv_layout, struct_size, 0);
LOOM_ABI_OFFSET(loom_kv_layout, dtype, 4);
LOOM_ABI_OFFSET(loom_kv_layout, n_layer, 8);
LOOM_ABI_OFFSET(loom_kv_layout, block_size, 20);
LOOM_ABI_OFFSET(loom_kv_layout, n_blocks, 24);
LOOM_ABI_OFFSET(loom_kv_layout, n_groups, 32);
LOOM_ABI_OFFSET(loom_kv_layout, n_slots, 36);
LOOM_ABI_OFFSET(loom_kv_layout, layer_group, 40);
LOOM_ABI_OFFSET(loom_kv_layout, layer_slot, 48);
LOOM_ABI_SIZE(loom_kv_layout, 56);
LOOM_ABI_OFFSET(loom_block_copy, src, 0);
LOOM_ABI_OFFSET(loom_block_copy, dst, 8);
LOOM_ABI_OFFSET(loom_block_copy, n_positions, 16);
LOOM_ABI_SIZE(loom_block_copy, 24);
LOOM_ABI_OFFSET(loom_kv_group_rows, slots, 0);
LOOM_ABI_OFFSET(loom_kv_group_rows, tables, 8);
LOOM_ABI_OFFSET(loom_kv_group_rows, table_stride, 16);
LOOM_ABI_SIZE(loom_kv_group_rows, 24);
LOOM_ABI_OFFSET(loom_batch, struct_size, 0);
LOOM_ABI_OFFSET(loom_batch, n_tokens, 8);
LOOM_ABI_OFFSET(loom_batch, tokens, 16);
LOOM_ABI_OFFSET(loom_batch, positions, 24);
LOOM_ABI_OFFSET(loom_batch, seq_ids, 32);
LOOM_ABI_OFFSET(loom_batch, n_outputs, 40);
LOOM_ABI_OFFSET(loom_batch, output_rows, 48);
LOOM_ABI_OFFSET(loom_batch, kv_layout, 56);
LOOM_ABI_OFFSET(loom_batch, kv, 64);
LOOM_ABI_OFFSET(loom_batch, slots, 72);
LOOM_ABI_OFFSET(loom_batch, row_seq, 80);
LOOM_ABI_OFFSET(loom_batch, n_seqs, 88);
LOOM_ABI_OFFSET(loom_batch, tables, 96);
LOOM_ABI_OFFSET(loom_batch, table_stride, 104);
LOOM_ABI_OFFSET(loom_batch, rope_positions, 112);
LOOM_ABI_OFFSET(loom_batch, tree_base, 120);
LOOM_ABI_OFFSET(loom_batch, tree_mask, 128);
LOOM_ABI_OFFSET(loom_batch, kv_groups, 136);
LOOM_ABI_SIZE(loom_batch, 144);
LOOM_ABI_OFFSET(loom_backend_i, struct_size, 0);
LOOM_ABI_OFFSET(loom_backend_i, name, 8);
LOOM_ABI_OFFSET(loom_backend_i, supports, 16);
LOOM_ABI_OFFSET(loom_backend_i, graph_compute, 24);
LOOM_ABI_OFFSET(loom_backend_i, buffer_alloc, 32);
LOOM_ABI_OFFSET(loom_backend_i, buffer_free, 40);
LOOM_ABI_OFFSET(loom_backend_i, buffer_upload, 48);
LOOM_ABI_OFFSET(loom_backend_i, buffer_download, 56);
LOOM_ABI_OFFSET(loom_backend_i, kv_copy, 64);
LOOM_ABI_OFFSET(loom_backend_i, load_weights, 72);
LOOM_ABI_OFFSET(loom_backend_i, memory_info, 80);
LOOM_ABI_OFFSET(loom_backend_i, workspace_bytes, 88);
LOOM_ABI_OFFSET(loom_backend_i, activation_bytes, 96);
LOOM_ABI_OFFSET(loom_backend_i, destroy, 104);
LOOM_ABI_OFFSET(loom_backend_i, supports_kv_dtype, 112);
LOOM_ABI_OFFSET(loom_backend_i, supports_attention, 120);
LOOM_ABI_OFFSET(loom_backend_i, describe, 128);
LOOM_ABI_SIZE(loom_backend_i, 136);

// ================================================================================================
// (ABI 3.1 and later: a new block here, asserting only the appended fields.)
// ================================================================================================
#endif // LP64

// The assertions above are checked at compile time; this runs so the file shows up in the results.
TEST(AbiLayout, Frozen) {
  EXPECT_EQ(LOOM_ABI_MAJOR, 3u);
  EXPECT_GE(LOOM_ABI_MINOR, 0u);
#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
  EXPECT_EQ(sizeof(loom_session_api),
            120u); // the core: 15 entries (request, draft, verify: their own tables)
#else
  GTEST_SKIP() << "the frozen layouts are stated for LP64 only";
#endif
}
