#!/bin/bash
# Install every client library used by the real-client compatibility scripts in
# this directory, on a fresh Debian 12 (bookworm) machine where we are root.
# Idempotent: each step is skipped when what it installs is already in place,
# so a second run takes about a second.
#
#   bash tests/clients/install.sh
#   CLIENT_DEPS_DIR=/some/dir bash tests/clients/install.sh   (default: tests/clients/.deps)
#
# What it installs (only Debian packages, PyPI and the npm registry are used):
#   apt:  php-cli php-redis redis-tools (redis-cli)       [+ python3-venv, nodejs/npm if missing]
#   pip:  redis 8.1.0, pottery 3.0.1, python-redis-lock 4.0.1, sherlock 0.4.1 in a venv at
#         $CLIENT_DEPS_DIR/venv                           (pip install -r deps/requirements.txt)
#   npm:  ioredis 5.9.2, ioredis6 = ioredis@6.0.0, redis 6.3.1, redis4 = redis@4.7.0,
#         redis5 = redis@5.9.0, redlock 5.0.0-beta.2, redlock-universal 0.8.5,
#         redis-semaphore 5.8.0, @sesamecare-oss/redlock 1.4.0, @microfleet/ioredis-lock 6.0.1
#         at $CLIENT_DEPS_DIR/node/node_modules
#         (npm ci from deps/package.json + deps/package-lock.json)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DEPS_DIR=${CLIENT_DEPS_DIR:-$HERE/.deps}
export DEBIAN_FRONTEND=noninteractive
log() { echo "install.sh: $*" >&2; }

APT_UPDATED=0
apt_install() {  # pkg...
  if [ "$APT_UPDATED" = 0 ]; then
    apt-get update -q
    APT_UPDATED=1
  fi
  apt-get install -y -q --no-install-recommends "$@"
}

# 1. Debian packages: PHP CLI with phpredis, and redis-cli.
need_apt=()
command -v php >/dev/null 2>&1 || need_apt+=(php-cli)
if ! command -v php >/dev/null 2>&1 || ! php -r 'exit(extension_loaded("redis") ? 0 : 1);' >/dev/null 2>&1; then
  need_apt+=(php-redis)
fi
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt-get install ${need_apt[*]}"
  apt_install "${need_apt[@]}"
else
  log "php-cli, php-redis, redis-tools: already installed"
fi

# 2. redis-py and the Python lock libraries in a virtual environment; a copy of the
#    requirements installed last marks the venv as up to date.
PY="$DEPS_DIR/venv/bin/python"
STAMP="$DEPS_DIR/venv/installed-requirements.txt"
if [ -x "$PY" ] && cmp -s "$HERE/deps/requirements.txt" "$STAMP"; then
  log "venv: deps/requirements.txt already installed"
else
  mkdir -p "$DEPS_DIR"
  if [ ! -x "$PY" ]; then
    if ! python3 -m venv "$DEPS_DIR/venv" 2>/dev/null; then
      rm -rf "$DEPS_DIR/venv"
      log "python3 -m venv failed; installing python3-venv"
      apt_install python3-venv
      python3 -m venv "$DEPS_DIR/venv"
    fi
  fi
  log "pip install -r deps/requirements.txt"
  "$PY" -m pip install -q --disable-pip-version-check -r "$HERE/deps/requirements.txt"
  "$PY" -c 'import redis, pottery, redis_lock, sherlock; print("install.sh: redis-py", redis.__version__)' >&2
  cp "$HERE/deps/requirements.txt" "$STAMP"
fi

# 3. Node.js client libraries, exact versions from the committed lock file.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  log "node/npm missing; installing Debian's nodejs and npm"
  apt_install nodejs npm
fi
NODE_MAJOR=$(node -p 'process.versions.node.split(".")[0]')
if [ "$NODE_MAJOR" -lt 20 ]; then
  log "warning: Node.js $(node -v) < 20; ioredis@6 and redis@6 need Node.js >= 20"
fi
NODE_DIR="$DEPS_DIR/node"
if [ -f "$NODE_DIR/node_modules/.package-lock.json" ] \
   && cmp -s "$HERE/deps/package.json" "$NODE_DIR/package.json" \
   && cmp -s "$HERE/deps/package-lock.json" "$NODE_DIR/package-lock.json" \
   && [ -f "$NODE_DIR/node_modules/redlock/package.json" ]; then
  log "node modules: already installed from the same package-lock.json"
else
  mkdir -p "$NODE_DIR"
  cp "$HERE/deps/package.json" "$HERE/deps/package-lock.json" "$NODE_DIR/"
  log "npm ci in $NODE_DIR"
  (cd "$NODE_DIR" && npm ci --no-audit --no-fund --loglevel=error)
fi

log "done. redis-cli: $(redis-cli --version)  php: $(php -r 'echo PHP_VERSION, " phpredis ", phpversion("redis");')"
log "      python: $PY  node modules: $NODE_DIR/node_modules"
