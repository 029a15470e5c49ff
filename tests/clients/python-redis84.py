"""redis-py 8.1's lock cycle without Lua, as lock code written for Redis 8.4 does it:

    PROXY_PORT=7000 MASTER_PORTS=7001,7002,7003 [KEY=...] \\
        tests/clients/.deps/venv/bin/python tests/clients/python-redis84.py

Through PROXY_PORT (RESP3, redis-py's default): acquire with set(nx=True, px=30000); a
contender's set(nx=True) is None; extend with set(token, ifeq=token, px=45000) (the PTTL moves
up on a majority); set(ifeq=<another value>) is None and changes nothing; release with
delex(ifeq=token) == 1 (nothing left on any master), again == 0; a waiter then gets in; digest()
is 16 hex digits and delex(ifdeq=digest) releases it. Every step is checked on each master in
MASTER_PORTS directly. A server without DELEX (the plain Redis 7.0 baseline) is reported as
`"status":"n/a"`: these commands are Redis 8.4's.
"""
import os
import sys
import uuid
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import common as CM  # noqa: E402
from common import check, check_absent, check_majority, step  # noqa: E402
import redis  # noqa: E402

# redis-py marks ifeq/ifne/ifdeq/ifdne experimental and warns on every call.
warnings.simplefilter("ignore")
API = ("SET NX PX, set(ifeq=, px=) extend, delex(ifeq=) release, digest() + "
       "delex(ifdeq=), contender and waiter")
KEY = CM.setup("redis-py", redis.__version__, "RESP3", timeout_s=90)


def main():
    r = redis.Redis(host=CM.HOST, port=CM.PROXY_PORT, socket_timeout=10)
    other = redis.Redis(host=CM.HOST, port=CM.PROXY_PORT, socket_timeout=10)
    step("probe DELEX")
    try:
        r.delex(KEY)
    except redis.ResponseError as e:
        if "unknown command" in str(e):
            sys.stdout.write(CM._result_line("n/a", api=API) + "\n")
            return
        raise
    token, rival = uuid.uuid4().hex, uuid.uuid4().hex
    step("acquire")
    check(r.set(KEY, token, nx=True, px=30000) is True, "acquire not granted")
    check_majority(KEY, token, 20000, "after acquire", max_pttl=30000)
    step("contend")
    check(other.set(KEY, rival, nx=True, px=30000) is None, "contender granted")
    step("extend with set(ifeq=)")
    check(r.set(KEY, token, ifeq=token, px=45000) is True, "extend refused")
    check_majority(KEY, token, 35000, "after extend", max_pttl=45000)
    check(other.set(KEY, rival, ifeq=rival, px=45000) is None, "a stranger's extend granted")
    check_majority(KEY, token, 30000, "after the stranger's extend", max_pttl=45000)
    step("release with delex(ifeq=)")
    check(other.delex(KEY, ifeq=rival) == 0, "a stranger released the lock")
    check(r.delex(KEY, ifeq=token) == 1, "release refused")
    check_absent(KEY, "after release")
    check(r.delex(KEY, ifeq=token) == 0, "released twice")
    step("waiter gets in")
    check(other.set(KEY, rival, nx=True, px=30000) is True, "waiter not granted")
    check_majority(KEY, rival, 20000, "waiter's lock", max_pttl=30000)
    step("digest and delex(ifdeq=)")
    digest = other.digest(KEY)
    digest = digest.decode() if isinstance(digest, bytes) else digest
    check(digest is not None and len(digest) == 16, "digest %r" % digest)
    check(r.delex(KEY, ifdeq="0" * 16) == 0, "a wrong digest released")
    check(other.delex(KEY, ifdeq=digest) == 1, "release by digest refused")
    check_absent(KEY, "after the release by digest")
    CM.result(api=API)


CM.run(main)
