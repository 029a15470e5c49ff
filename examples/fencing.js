// Fencing tokens through redlock-proxy with node-redis.
//
// A holder takes a lock and its token, then stalls past its lease; a second client takes the
// lock and writes; the stalled holder's late write is rejected by the resource, whose last
// accepted token is newer.
//
//   ./scripts/run-local.sh &        # the proxy on 127.0.0.1:7379
//   NODE_PATH=tests/clients/.deps/node/node_modules node examples/fencing.js
//   (PROXY_PORT=... for another port; `redis` from npm: `bash tests/clients/install.sh`)
'use strict';
const { createClient } = require('redis');
const { randomUUID } = require('crypto');

class Storage {
  // The protected resource: accepts a write only with a token above the last one it saw.
  constructor() { this.lastToken = 0n; this.value = null; }
  write(token, value) {
    if (token <= this.lastToken) {
      throw new Error(`stale token ${token} (last accepted ${this.lastToken})`);
    }
    this.lastToken = token;
    this.value = value;
  }
}

async function acquire(client, key, ttlMs) {
  const value = randomUUID();
  const granted = await client.sendCommand(['LOCK.ACQUIRE', key, value, String(ttlMs)]);
  if (granted === null) return null;
  // Tokens are µs since the epoch: BigInt keeps every digit.
  return { value, token: BigInt(granted[0]), validityMs: Number(granted[1]) };
}

async function main() {
  const client = createClient({ url: `redis://127.0.0.1:${process.env.PROXY_PORT || 7379}` });
  await client.connect();
  const key = `example:fencing:${randomUUID()}`;
  const storage = new Storage();
  const ttlMs = 500;

  const a = await acquire(client, key, ttlMs);
  if (!a) throw new Error('the lock should be free');
  console.log(`A holds the lock with token ${a.token}, then stalls for ${2 * ttlMs} ms`);
  await new Promise((resolve) => setTimeout(resolve, 2 * ttlMs));

  const b = await acquire(client, key, ttlMs);
  if (!b) throw new Error('the lock should have expired');
  storage.write(b.token, 'written by B');
  console.log(`B holds the lock with token ${b.token} and wrote`);

  let rejected = false;
  try {
    storage.write(a.token, 'written by A');
  } catch (err) {
    rejected = true;
    console.log(`A woke up and tried to write: rejected (${err.message})`);
  }
  if (!rejected) throw new Error("FAIL: the stale holder's write was accepted");

  await client.sendCommand(['LOCK.RELEASE', key, b.value]);
  await client.quit();
  console.log('OK');
}

main().catch((err) => { console.error(err); process.exit(1); });
