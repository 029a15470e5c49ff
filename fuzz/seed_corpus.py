#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora from the traced clients (see fuzz/README.md).

    python3 fuzz/seed_corpus.py ../shared/client-traces

request_parser: each traced connection's requests, as the client sent them (RESP multibulk).
master_reply:   each traced connection's replies, as a master speaking RESP2 sends them
                (RESP3 maps flattened, nulls as $-1, verbatim strings as bulk strings).
lease_script:   every distinct traced lock script, byte-exact.
The request parser also gets a few inline requests (what redis-cli and telnet users type),
which no traced library sends.
"""
import hashlib
import pathlib
import re
import sys

LINE = re.compile(r"^\s*[\d.]+ (c\d+) (C>|S<) (.*)$")


def parse_value(text, pos, nested):
    """One value of the tap's notation at text[pos:]: (kind, payload), new pos."""
    c = text[pos]
    if c == '"':
        return ("str", None), pos
    if text.startswith("$nil", pos) or text.startswith("_", pos):
        return ("null", None), pos + (4 if c == "$" else 1)
    if c in "$=":
        s, pos = parse_string(text, pos + 1)
        if c == "=":
            s = s[4:]  # "txt:" prefix
        return ("bulk", s), pos
    if c in "*%":
        close = "]" if c == "*" else "}"
        pos += 2
        items = []
        while text[pos] != close:
            v, pos = parse_value(text, pos, True)
            items.append(v)
            if text.startswith(": ", pos) or text.startswith(", ", pos):
                pos += 2
        return ("array", items), pos + 1
    if c in "+-:":
        end = len(text)
        if nested:
            end = min(i for i in (text.find(", ", pos), text.find("]", pos), text.find("}", pos), len(text)) if i >= 0)
        kind = {"+": "simple", "-": "error", ":": "int"}[c]
        return (kind, text[pos + 1:end].encode()), end
    raise ValueError(f"unknown value at {text[pos:pos + 20]!r}")


def parse_string(text, pos):
    assert text[pos] == '"'
    pos += 1
    out = bytearray()
    escapes = {"n": b"\n", "r": b"\r", "t": b"\t", '"': b'"', "\\": b"\\"}
    while text[pos] != '"':
        if text[pos] == "\\":
            e = text[pos + 1]
            if e == "x":
                out.append(int(text[pos + 2:pos + 4], 16))
                pos += 4
                continue
            out += escapes[e]
            pos += 2
        else:
            out += text[pos].encode()
            pos += 1
    return bytes(out), pos + 1


def resp2(value):
    kind, payload = value
    if kind == "null":
        return b"$-1\r\n"
    if kind == "bulk":
        return b"$%d\r\n%s\r\n" % (len(payload), payload)
    if kind == "array":
        return b"*%d\r\n" % len(payload) + b"".join(resp2(v) for v in payload)
    return {"simple": b"+", "error": b"-", "int": b":"}[kind] + payload + b"\r\n"


def request(text):
    args, pos = [], 0
    while pos < len(text):
        s, pos = parse_string(text, pos)
        args.append(s)
        pos += 1
    return resp2(("array", [("bulk", a) for a in args]))


def write(directory, data):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / hashlib.sha1(data).hexdigest()).write_bytes(data)


INLINE = [
    b"PING\r\n",
    b"set \"res 1\" 'tok\\'en' NX PX 30000\r\nGET res\n",
    b"echo \"\\x41\\n\\t\"\r\n\r\n*0\r\n*-1\r\nPING\r\n",
]


def main():
    traces = pathlib.Path(sys.argv[1])
    corpus = pathlib.Path(__file__).resolve().parent / "corpus"
    for trace in sorted((traces / "traces").glob("*.wire.txt")):
        sent, answered = {}, {}
        for line in trace.read_text().splitlines():
            m = LINE.match(line)
            if not m or "...(" in m.group(3):
                continue  # connect/close lines, and replies the tap truncated
            conn, direction, text = m.groups()
            if direction == "C>":
                sent.setdefault(conn, bytearray()).extend(request(text))
            else:
                value, _ = parse_value(text, 0, False)
                answered.setdefault(conn, bytearray()).extend(resp2(value))
        # The fuzz targets read their first byte as the read-size pattern.
        for conn, data in sent.items():
            write(corpus / "request_parser", bytes([len(data) % 256]) + bytes(data))
        for conn, data in answered.items():
            write(corpus / "master_reply", bytes([len(data) % 256]) + bytes(data))
    for data in INLINE:
        write(corpus / "request_parser", bytes([len(data)]) + data)
    for script in sorted((traces / "scripts").glob("*.lua")):
        write(corpus / "lease_script", script.read_bytes())


if __name__ == "__main__":
    main()
