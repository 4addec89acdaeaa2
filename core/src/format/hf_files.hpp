// format/hf_files.hpp — the files of a Hugging Face checkpoint directory, read as untrusted input
// (private header): a path must name a regular file (a FIFO would block the read, a directory cannot
// be read), a JSON file is read whole only below its size limit, a safetensors shard is mapped.
#pragma once

#include "format/mapped_file.hpp"
#include "loom/error.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <sys/stat.h>

namespace loom::hf {

constexpr uint64_t k_max_config = 16ull << 20; // config.json, tokenizer_config.json, chat_template.jinja

// A checkpoint's error: "hf: <where>: <msg>", `where` the file (or directory) as messages show it.
[[noreturn]] void bad(const std::string& where, const std::string& msg, Errc code = Errc::parse_error);

// `name` inside directory `dir`.
std::string join(const std::string& dir, const std::string& name);

// stat() of `path`: nullopt when it does not exist; a loom::Error for other failures and for anything
// that is not a regular file. `what` names the file in messages ("config.json").
std::optional<struct stat> stat_regular(const std::string& path, const std::string& what);

// The whole (small) file, or nullopt when it does not exist; over `max` bytes is an error.
std::optional<std::string> read_small(const std::string& path, uint64_t max, const std::string& what);

// The whole file mapped read-only.
std::unique_ptr<MappedFile> map_file(const std::string& path, const std::string& what);

} // namespace loom::hf
