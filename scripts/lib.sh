# Shared by the scripts in this folder (sourced, not run).

# Installs redis-server and its tools (redis-cli, redis-benchmark) from Debian if missing, and
# stops the distro's own server on 6379: the proxy, the tests and the benchmark start their own.
ensure_redis() {
  local sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null \
     || ! command -v redis-benchmark >/dev/null; then
    $sudo_cmd apt-get update -q
    $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server redis-tools
    (command -v systemctl >/dev/null && $sudo_cmd systemctl disable --now redis-server 2>/dev/null) || true
  fi
}

# Installs Debian's chromium if missing: the status page's browser test (tests/status.rs) runs
# it headless, and fails without it rather than skip.
ensure_chromium() {
  local sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  if ! command -v chromium >/dev/null; then
    $sudo_cmd apt-get update -q
    $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
  fi
}
