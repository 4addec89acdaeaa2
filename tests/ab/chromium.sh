# tests/ab/chromium.sh — sourced by the ab checks: headless Chromium renders an HTML report.
#   require_chromium       sets $chromium, or exits 77 (skipped, with the reason) when none is installed
#   render_dom HTML OUT    the rendered DOM of HTML into OUT; fails when Chromium does, or when its
#                          console logged an error (the log: OUT.log)
find_chromium() {
  chromium=""
  for c in chromium chromium-browser google-chrome; do
    command -v "$c" >/dev/null && chromium="$c" && return 0
  done
}

require_chromium() {
  find_chromium
  if [ -z "$chromium" ]; then
    echo "SKIPPED (HTML part): no chromium (scripts/setup.sh --deps installs it); the JSON checks passed"
    exit 77
  fi
}

chromium_flags() {
  echo --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run --user-data-dir="$1/chromium-profile"
}

render_dom() {
  local html="$1" out="$2"
  # shellcheck disable=SC2046
  "$chromium" $(chromium_flags "$(dirname "$out")") --enable-logging=stderr --v=0 --dump-dom "file://$html" \
    > "$out" 2> "$out.log" || { cat "$out.log"; return 1; }
  if grep -E "CONSOLE|Uncaught|SyntaxError" "$out.log"; then
    echo "the console has errors (above), rendering $html"
    return 1
  fi
}
