// loom/sdk/host.hpp — the host's services as the SDK binds them: the versioned tables (abi.h's get_api),
// statuses as exceptions (StatusError), logging. A plugin's loom_plugin_init binds them (plugin.hpp);
// the host binds its own, so that the interfaces of loom/sdk/ run the same in both. Header-only.
#pragma once

#include "loom/sdk/abi.h"
#include "loom/sdk/error.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <utility>

namespace loom::sdk {

// The host minor whose tables the plugin asks for (abi.h: loom_host.get_api). Define it lower before
// including this header to run on older hosts of the same major, using only what that minor has.
#ifndef LOOM_SDK_TARGET_MINOR
#define LOOM_SDK_TARGET_MINOR LOOM_ABI_MINOR
#endif

namespace detail {
struct HostTables {
  const loom_host* host = nullptr;
  const loom_core_api* core = nullptr;
  const loom_config_api* config = nullptr;
  const loom_session_api* session = nullptr;
  const loom_request_api* request = nullptr;
  const loom_draft_api* draft = nullptr;
  const loom_verify_api* verify = nullptr;
};
inline HostTables& tables() noexcept {
  static HostTables t; // set by loom_plugin_init (one per plugin: hidden), and by the host for itself
  return t;
}
inline const char*& plugin_name_ref() noexcept {
  static const char* n = "plugin";
  return n;
}
// Asks the host for every table at LOOM_SDK_TARGET_MINOR; false (after one log line) when the host is
// older than that minor or speaks another major.
inline bool bind_host(const loom_host* h, uint32_t abi_major, const char* name) noexcept {
  if (!h) return false;
  char line[200];
  if (abi_major != LOOM_ABI_MAJOR) {
    std::snprintf(line, sizeof line,
                  "the host speaks ABI %u.x, this plugin ABI %u.x: rebuild it against the host's SDK",
                  abi_major, LOOM_ABI_MAJOR);
    if (h->log) h->log(LOOM_LOG_ERROR, name, line);
    return false;
  }
  HostTables t;
  t.host = h;
  if (h->struct_size >= offsetof(loom_host, get_api) + sizeof(h->get_api) && h->get_api) {
    t.core = static_cast<const loom_core_api*>(h->get_api(LOOM_API_CORE, LOOM_SDK_TARGET_MINOR));
    t.config = static_cast<const loom_config_api*>(h->get_api(LOOM_API_CONFIG, LOOM_SDK_TARGET_MINOR));
    t.session = static_cast<const loom_session_api*>(h->get_api(LOOM_API_SESSION, LOOM_SDK_TARGET_MINOR));
    t.request = static_cast<const loom_request_api*>(h->get_api(LOOM_API_REQUEST, LOOM_SDK_TARGET_MINOR));
    t.draft = static_cast<const loom_draft_api*>(h->get_api(LOOM_API_DRAFT, LOOM_SDK_TARGET_MINOR));
    t.verify = static_cast<const loom_verify_api*>(h->get_api(LOOM_API_VERIFY, LOOM_SDK_TARGET_MINOR));
  }
  if (!t.core || !t.config || !t.session || !t.request || !t.draft || !t.verify) {
    std::snprintf(
        line, sizeof line,
        "the host (ABI %u.%u) is older than this plugin's ABI %u.%u: upgrade Loom, or build the plugin "
        "with LOOM_SDK_TARGET_MINOR=%u",
        h->abi_major, h->abi_minor, LOOM_ABI_MAJOR, static_cast<unsigned>(LOOM_SDK_TARGET_MINOR),
        h->abi_minor);
    if (h->log) h->log(LOOM_LOG_ERROR, name, line);
    return false;
  }
  tables() = t;
  return true;
}
} // namespace detail

// The host and its tables (valid from loom_plugin_init on).
inline const loom_host& host() {
  return *detail::tables().host;
}
inline const loom_core_api& core_api() {
  return *detail::tables().core;
}
inline const loom_config_api& config_api() {
  return *detail::tables().config;
}
inline const loom_session_api& session_api() {
  return *detail::tables().session;
}
inline const loom_request_api& request_api() {
  return *detail::tables().request;
}
inline const loom_draft_api& draft_api() {
  return *detail::tables().draft;
}
inline const loom_verify_api& verify_api() {
  return *detail::tables().verify;
}

// Thrown by plugin code (loom/sdk/error.hpp's, the host's too); a status with its code at the boundary.
using Error = loom::Error;

// A status from the host becomes an exception inside plugin code. It owns the status: left alone it
// reaches the boundary, where the SDK hands the status back to the host (take()), which reports it with
// its full text; code that handles it reads code() and message() and lets it go (or calls release()).
class StatusError : public std::exception {
public:
  explicit StatusError(loom_status* s) : held_(std::make_shared<Held>(s)) {}
  const char* what() const noexcept override {
    return held_->status ? core_api().status_message(held_->status) : "a host status, already released";
  }
  int32_t code() const noexcept { return held_->status ? core_api().status_code(held_->status) : 0; }
  std::string message() const { return what(); }
  void release() noexcept { held_->free(); }
  // The status, for the host to own (the exception then holds none).
  loom_status* take() const noexcept { return std::exchange(held_->status, nullptr); }

private:
  struct Held {
    loom_status* status;
    explicit Held(loom_status* s) : status(s) {}
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    void free() noexcept {
      if (status) core_api().status_free(std::exchange(status, nullptr));
    }
    ~Held() { free(); }
  };
  std::shared_ptr<Held> held_; // shared: an exception object is copied
};
inline void check(loom_status* s) {
  if (s) throw StatusError(s);
}

inline void log(loom_log_level level, const std::string& msg) {
  if (detail::tables().host) host().log(level, detail::plugin_name_ref(), msg.c_str());
}

} // namespace loom::sdk
