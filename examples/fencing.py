#!/usr/bin/env python3
"""Fencing tokens through redlock-proxy with redis-py.

A holder takes a lock and its token, then stalls past its lease (a GC pause, a stopped VM).
Meanwhile a second client takes the lock and writes. When the first holder wakes up and
writes, the resource rejects it: its token is older than the last one the resource accepted.

    ./scripts/run-local.sh &                       # the proxy on 127.0.0.1:7379
    tests/clients/.deps/venv/bin/python examples/fencing.py   # PROXY_PORT=... for another port
    (redis-py from `bash tests/clients/install.sh`, or any Python with redis installed)
"""
import os
import time
import uuid

import redis


class Storage:
    """The protected resource: accepts a write only with a token above the last one it saw."""

    def __init__(self):
        self.last_token = 0
        self.value = None

    def write(self, token, value):
        if token <= self.last_token:
            raise PermissionError(f"stale token {token} (last accepted {self.last_token})")
        self.last_token = token
        self.value = value


def acquire(client, key, ttl_ms):
    """LOCK.ACQUIRE: (value, token, validity_ms), or None if the lock is held."""
    value = uuid.uuid4().hex
    granted = client.execute_command("LOCK.ACQUIRE", key, value, ttl_ms)
    if granted is None:
        return None
    token, validity_ms = granted
    return value, token, validity_ms


def main():
    client = redis.Redis(host="127.0.0.1", port=int(os.environ.get("PROXY_PORT", "7379")))
    key = f"example:fencing:{uuid.uuid4().hex}"
    storage = Storage()
    ttl_ms = 500

    first = acquire(client, key, ttl_ms)
    assert first is not None, "the lock should be free"
    value_a, token_a, _ = first
    print(f"A holds the lock with token {token_a}, then stalls for {2 * ttl_ms} ms")
    time.sleep(2 * ttl_ms / 1000)  # A's lease runs out while it is stalled

    second = acquire(client, key, ttl_ms)
    assert second is not None, "the lock should have expired"
    value_b, token_b, _ = second
    storage.write(token_b, "written by B")
    print(f"B holds the lock with token {token_b} and wrote")

    try:
        storage.write(token_a, "written by A")
        raise SystemExit("FAIL: the stale holder's write was accepted")
    except PermissionError as refused:
        print(f"A woke up and tried to write: rejected ({refused})")

    # Unmodified acquire code (SET NX PX) gets its token with one call.
    assert client.execute_command("LOCK.RELEASE", key, value_b) == 1
    value_c = uuid.uuid4().hex
    assert client.set(key, value_c, nx=True, px=ttl_ms)
    token_c = client.execute_command("LOCK.TOKEN", key, value_c)
    storage.write(token_c, "written by C")
    print(f"C took the lock with SET NX PX; LOCK.TOKEN gave {token_c}; its write was accepted")
    client.execute_command("LOCK.RELEASE", key, value_c)
    assert storage.value == "written by C"
    print("OK")


if __name__ == "__main__":
    main()
