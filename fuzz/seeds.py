#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/corpus/<target>/ (run from anywhere; idempotent).

Seeds are real inputs: requests the way curl and the test suite send them, the
malformed ones from tests/http_conformance.rs, the /execute bodies from
tests/sandbox_execute.rs, WBX batch bodies from tests/wbx_batches.rs, chunked bodies, program output with multi-byte text and
compile-stage frames as the build wrapper prints them; session file API paths
(traversal, duplicate slashes, the 255/256-byte name limit, NUL, non-UTF-8); memory KV
listing requests (prefix, limit, clock, namespace and cursor as the fuzz target lays
them out) and If-Match / If-None-Match headers; request paths of every face's route table.
"""
import base64
import hashlib
import json
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "python-slim"


def write(target, seeds):
    d = os.path.join(HERE, "corpus", target)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    for name, data in seeds:
        if isinstance(data, str):
            data = data.encode()
        h = hashlib.sha1(data).hexdigest()[:12]
        with open(os.path.join(d, f"{name}-{h}"), "wb") as f:
            f.write(data)


def execute_bodies():
    code_run = lambda code, **extra: {"language": PY, "code": code, "network": False, **extra}
    bodies = [
        code_run("print('hello')"),
        {"language": "python", "code": "print('hello')", "network": False},
        {"language": "py3", "code": "print(1)"},
        {"language": "pyslim", "code": "print(1)"},
        {"language": PY, "version": "3.11.2", "code": "print(1)", "network": False},
        {"language": PY, "version": "0.0.1", "code": "print(1)"},
        code_run("import sys,os\nprint(sys.argv[1:])\nprint(os.path.exists('/tmp/pwned'))\nprint(sys.stdin.read())",
                 args=["a b", "it's \"quoted\"", "$(touch /tmp/pwned)", "`id`", "*", ""], stdin="line1\nline2"),
        {"language": PY, "network": False, "files": [
            {"name": "app.py", "content": "from pkg import mod\nprint(mod.X, open('data.bin','rb').read())"},
            {"name": "pkg/__init__.py", "content": ""},
            {"name": "pkg/mod.py", "content": "WD0gNDI=", "encoding": "base64"},
            {"name": "data.bin", "content": "00ff41", "encoding": "hex"}]},
        code_run("import sys\nprint('oops', file=sys.stderr)\nsys.exit(3)"),
        {"language": PY, "code": "print(1)"},
        {"language": PY, "code": "print(1)", "network": True},
        {"code": "print(1)"},
        {"language": "", "code": "print(1)"},
        {"language": "cobol", "code": "x"},
        {"language": PY},
        {"language": PY, "files": []},
        {"language": PY, "code": "x", "bogus": 1},
        {"language": PY, "code": 5},
        {"language": PY, "code": "x", "limits": {"wallTimeMs": "NaN"}},
        {"language": PY, "files": [{"name": "../x.py", "content": ""}]},
        {"language": PY, "files": [{"name": "/etc/passwd", "content": ""}]},
        {"language": PY, "files": [{"name": "a.py", "content": "!!", "encoding": "base64"}]},
        {"language": PY, "files": [{"name": "a.py", "content": "zz", "encoding": "hex"}]},
        {"language": PY, "files": [{"name": "a.py", "content": "", "encoding": "rot13"}]},
        {"language": PY, "files": [{"name": "ok.py", "content": ""}, {"name": "a\\b", "content": ""}]},
        {"language": PY, "files": [{"name": "a", "content": ""}, {"name": "a/b", "content": ""}]},
        {"language": PY, "code": "x", "files": [{"name": "main.py", "content": ""}]},
        code_run("while True: pass", limits={"wallTimeMs": 500}),
        code_run("print(1)", limits={"memoryBytes": 67108864}),
        code_run("print('z' * 300000, end='')", limits={"outputBytes": 4096}),
        code_run("print(1)", limits={"outputBytes": 1024, "wallTimeMs": 20000}),
        code_run("print(1)", limits={"pids": 16, "wallTimeMs": 3000}),
        code_run("print(1)", limits={"memoryBytes": 0.0, "pids": -5.0}),
        code_run("print(1)", limits={"memoryBytes": 1e20, "pids": 1e9}),
        code_run("print(1)", limits={"memoryBytes": 134217728.0, "pids": 64.0}),
        code_run("print(1)", limits={"outputBytes": -1.0}),
        code_run("print(1)", limits={"outputBytes": 1e12}),
        code_run("print(1)", limits={"wallTimeMs": 0}),
        code_run("print(1)", limits={"cpus": 0.0}),
        code_run("print(1)", limits={"cpus": 64.0}),
        code_run("print(1)", limits={"wallTimeMs": 1e12}),
        code_run("print(1)", limits={"memoryBytes": 8388608, "cpus": 2.0, "pids": 256, "outputBytes": 1024, "wallTimeMs": 20000}),
        code_run("print(1)", args=["x\u0000y"]),
    ]
    seeds = [(f"test-{i:02}", json.dumps(b, separators=(",", ":"))) for i, b in enumerate(bodies)]
    for bad in ["{", "[", "null", "\"x\"", "[" * 200, "{}", ""]:
        seeds.append(("bad", bad))
    # Number syntax serde_json has to take: exponents, -0, huge, tiny.
    seeds.append(("numbers", '{"language":"python-slim","code":"","limits":{"memoryBytes":-0,"cpus":1E-400,"pids":1e400,"outputBytes":18446744073709551616,"wallTimeMs":-1.5e3}}'))
    seeds.append(("escapes", '{"language":"python-slim","files":[{"name":"\\u00e9/\\ud83d\\ude00.py","content":"\\u0000"}],"stdin":"\\n"}'))
    return seeds


HTTP = [
    # curl-style
    ("curl-execute", 'POST /execute HTTP/1.1\r\nHost: 127.0.0.1:8090\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\nContent-Type: application/json\r\nContent-Length: 59\r\n\r\n{"language":"python","code":"print(1)","network":false}'),
    ("curl-execute-sse", 'POST /execute?stream=1 HTTP/1.1\r\nHost: localhost:8090\r\nUser-Agent: curl/7.88.1\r\nAccept: text/event-stream\r\nAuthorization: Bearer k1\r\nContent-Type: application/json\r\nContent-Length: 38\r\n\r\n{"language":"python","code":"print(1)"}'),
    ("curl-get", "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:8090\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n"),
    ("http10", "GET /runtimes HTTP/1.0\r\n\r\n"),
    ("http10-keepalive", "GET /runtimes HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"),
    ("query", "GET /x?path=a%2Fb+c&format=zip&stream=true HTTP/1.1\r\nHost: a\r\n\r\n"),
    ("chunked", 'POST /execute HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\n{"cod\r\n7\r\ne":"1"}\r\n0\r\nX-Trailer: y\r\n\r\n'),
    ("expect-100", "POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: 31\r\nExpect: 100-continue\r\n\r\n"),
    ("head-pipelined", "HEAD /llms.txt HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("pipelined", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /runtimes HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("close", "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    ("connection-list", "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade ,close\r\n\r\n"),
    ("bare-lf", "\r\n\r\nGET /healthz HTTP/1.1\nHost: x\n\n"),
    ("mixed-lf", "GET /healthz HTTP/1.1\r\nHost: x\n\r\n"),
    ("get-with-body", "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    ("partial", "GET / HTTP/1.1\r\nHost: x\r\nX: aaaaaaaaaaaaaaaa"),
    ("smuggle-cl-te", "POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("then-garbage", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGARBAGE\r\n\r\n"),
    ("tab-ows", "GET / HTTP/1.1\r\nHost:\t x \t\r\nContent-Length:\t007\r\n\r\n"),
    ("obs-text", b"GET / HTTP/1.1\r\nHost: x\r\nX: caf\xc3\xa9\x80\xff\r\n\r\n"),
]
# tests/http_conformance.rs: malformed requests and their statuses.
MALFORMED = [
    b"GARBAGE\r\n\r\n",
    b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\n\r\n",
    b"GET http://evil/ HTTP/1.1\r\nHost: x\r\n\r\n",
    b"CONNECT x:443 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX\xff: 1\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n",
    b"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello",
    b"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
    b"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    b"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 6\r\n\r\nhello!",
    b"POST /execute HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
    b"POST /execute HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
    b"POST /execute HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /execute HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /execute HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nf0000000000000003\r\nabc\r\n0\r\n\r\nGET /sneaky HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\n\r\n",
    b"get /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: a\x7fb\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\x0b\r\n\r\n",
]

CHUNKED = [
    ("wiki", b"4\r\nWiki\r\n5;ext=1\r\npedia\r\n0\r\nX-T: y\r\n\r\nNEXT"),
    ("conformance", b'5;ext=1\r\n{"cod\r\n7\r\ne":"1"}\r\n0\r\nX-Trailer: y\r\n\r\n'),
    ("splits", b"3\r\nabc\r\na\r\n0123456789\r\n0\r\n\r\n"),
    ("bare-lf", b"3\nabc\nA\n0123456789\n0\n\n"),
    ("upper-hex", b"1A\r\n" + b"x" * 26 + b"\r\n0\r\n\r\n"),
    ("ext-quoted", b'2;name="va;lue"; x=1\r\nhi\r\n0;last\r\n\r\n'),
    ("ws-ext", b"2 \t;a\r\nhi\r\n0\r\n\r\n"),
    ("trailers", b"0\r\nX-A: 1\r\nX-B: 2\r\n\r\nGET / HTTP/1.1\r\n"),
    ("overflow", b"f0000000000000003\r\nabc\r\n0\r\n\r\n"),
    ("garbage", b"zz\r\n"),
    ("empty-line", b"\r\n"),
    ("missing-crlf", b"1\r\nZ\r\n\r\n"),
    ("truncated", b"10\r\n0123456"),
    ("nul-trailer", b"0\r\nX: a\x00b\r\n\r\n"),
    ("leading-zeros", b"000000000000003\r\nabc\r\n0\r\n\r\n"),
    ("big", b"40\r\n" + b"y" * 64 + b"\r\n40\r\n" + b"z" * 64 + b"\r\n0\r\n\r\n"),
]

SSE = [
    ("ascii", b"hello\nworld\n"),
    ("euro", "a\u20ac \ufffd!\n".encode()),
    ("euro-broken", b"a\xe2\x82\xac \xe2\x82!\n"),
    ("emoji", "\U0001F600\U0001F389 caf\u00e9 \u65e5\u672c\u8a9e\n".encode()),
    ("truncated-4", b"ok \xf0\x9f\x98"),
    ("invalid-mix", b"\xff\xfe\xc0\xaf\xed\xa0\x80\xf4\x90\x80\x80\xe0\x80\xaf\xc3"),
    ("overlong", b"\xc0\x80\xe0\x80\x80\xf0\x80\x80\x80"),
    ("surrogates", b"\xed\xa0\xbd\xed\xb8\x80"),
    ("python-traceback", "Traceback (most recent call last):\n  File \"main.py\", line 1, in <module>\nValueError: boom \u2014 \u00fc\n".encode()),
    ("continuations", b"\x80\x80\x80abc\xbf"),
]

FRAMES = [
    ("ok", b"\x1eISOBOX-BUILD 0 1234 4 4\nout\nerr!program stderr"),
    ("split-test", b"\x1eISOBOX-BUILD 2 1234 4 4\nout\nerr!program stderr"),
    ("timeout", b"\x1eISOBOX-BUILD 137 30001 0 0\n"),
    ("timeout-124", b"\x1eISOBOX-BUILD 124 30000 5 0\nslow\n"),
    ("failed", b"\x1eISOBOX-BUILD 1 800 0 37\nerror[E0425]: cannot find value `x`\nmore"),
    ("empty-ok", b"\x1eISOBOX-BUILD 0 0 0 0\n"),
    ("forged-after", b"\x1eISOBOX-BUILD 0 12 0 0\n\x1eISOBOX-BUILD 0 0 0 0\n"),
    ("not-found", b"sh: 1: timeout: not found\n"),
    ("partial-magic", b"\x1eISOBOX-BUI"),
    ("no-newline", b"\x1eISOBOX-BUILD 0 1 2 3"),
    ("bad-fields", b"\x1eISOBOX-BUILD 0 1 2\n"),
    ("negative", b"\x1eISOBOX-BUILD -1 1 0 0\n"),
    ("utf8-payload", "\x1eISOBOX-BUILD 0 5 3 4\n\u00e9\u00e8\u20acrest".encode("utf-8", "surrogatepass")),
]

NAME_255 = b"n" * 255
FS_PATHS = [
    ("passwd", b"../../etc/passwd"),
    ("climb", b"a/../../b"),
    ("slashes", b"//etc//passwd"),
    ("dots", b"./x/./y"),
    ("percent", b"%2e%2e"),
    ("percent-path", b"%2e%2e/%2fetc/passwd"),
    ("name-255", NAME_255),
    ("name-256", b"n" * 256),
    ("dir-name-255", b"d/" + NAME_255 + b"/../" + NAME_255),
    ("nul", b"\x00"),
    ("nul-inside", b"a/b\x00c"),
    ("non-utf8", b"caf\xc3\xa9/\xff\xfe/\x80.txt"),
    ("root", b"/"),
    ("empty", b""),
    ("dot", b"."),
    ("dotdot", b".."),
    ("dots-3", b".../....//. ./.. "),
    ("trailing", b"dir/sub/"),
    ("backslash", b"..\\..\\windows\\win.ini"),
    ("control", b"a\nb/\x1b[31mred\r/\x7f"),
    ("deep", b"a/" * 2047 + b"b"),
    ("max-len", b"a/" * 2047 + b"bc"),
    ("over-len", b"/" * 4097),
    ("upload-temp", b"/.isobox-upload-1234/x"),
]

B64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=")
NS = {"l": 0, "lm": 1, "void": 2, "..": 3}
CLOCK = {"0": 0, "T0": 1, "T0+1s": 2, "T0+25h": 3}


def kv_list(ns="l", clock="T0", limit=10, prefix=b"", cursor=None, encode=False, pad=0):
    """[mode 0][flags][limit][prefix length] prefix cursor-text (see kv_cursor.rs)."""
    flags = (NS[ns] << 6) | (CLOCK[clock] << 4) | (pad << 2)
    if cursor is not None:
        flags |= 1 | (2 if encode else 0)
    return bytes([0, flags, limit, len(prefix)]) + prefix + (cursor or b"")


def etag_header(header, version=0):
    """[mode 1][current: 0..3 a version, 4 absent] header (see kv_cursor.rs)."""
    return bytes([1, version]) + header


KV = [
    ("all", kv_list(limit=253)),
    ("all-max", kv_list(limit=255)),
    ("limit-0", kv_list(limit=0)),
    ("limit-1001", kv_list(limit=254)),
    ("prefix-a", kv_list(prefix=b"a", limit=2)),
    ("prefix-a-cursor", kv_list(prefix=b"a", limit=2, cursor=B64(b"ab"))),
    ("prefix-a-cursor-text", kv_list(prefix=b"a", limit=2, cursor=b"ab", encode=True)),
    ("cursor-padded", kv_list(prefix=b"a", limit=2, cursor=B64(b"a") + b"==")),
    ("cursor-padded-flag", kv_list(limit=3, cursor=b"a", encode=True, pad=2)),
    ("cursor-deleted-key", kv_list(limit=3, cursor=B64(b"aa"))),
    ("cursor-outside-prefix", kv_list(prefix=b"b", cursor=B64(b"a"))),
    ("cursor-bang", kv_list(prefix=b"a", cursor=b"!!!")),
    ("cursor-empty", kv_list(prefix=b"a", cursor=b"")),
    ("cursor-not-utf8", kv_list(prefix=b"a", cursor=B64(b"\xff\xfe"))),
    ("cursor-nul", kv_list(prefix=b"a", cursor=B64(b"a\x00b"))),
    ("cursor-newline", kv_list(cursor=b"a\nb", encode=True)),
    ("cursor-std-alphabet", kv_list(cursor=base64.b64encode("ключ 🙂".encode()))),
    ("cursor-url-alphabet", kv_list(cursor=B64("ключ 🙂".encode()))),
    ("cursor-trailing-bits", kv_list(cursor=b"YR")),
    ("cursor-too-long", kv_list(cursor=b"A" * 2000)),
    ("cursor-512", kv_list(limit=2, cursor=b"k" * 512, encode=True)),
    ("cursor-512-pad1", kv_list(limit=2, cursor=b"k" * 512, encode=True, pad=1)),
    ("cursor-512-pad2", kv_list(limit=2, cursor=b"k" * 512, encode=True, pad=2)),
    ("cursor-513", kv_list(cursor=b"k" * 513, encode=True)),
    ("cursor-e-acute", kv_list(prefix="é".encode(), cursor="é".encode(), encode=True)),
    ("prefix-unicode", kv_list(prefix="ключ".encode())),
    ("prefix-nul", kv_list(prefix=b"a\x00")),
    ("prefix-newline", kv_list(prefix=b"\n")),
    ("prefix-del", kv_list(prefix=b"\x7f")),
    ("prefix-slash", kv_list(prefix=b"../")),
    ("prefix-not-utf8", kv_list(prefix=b"\xc3")),
    ("ns-lm", kv_list(ns="lm", limit=1)),
    ("ns-lm-cursor", kv_list(ns="lm", limit=1, cursor=B64(b"a"))),
    ("ns-void", kv_list(ns="void")),
    ("ns-invalid", kv_list(ns="..", cursor=b"!!")),
    ("ttl-expired", kv_list(clock="T0+1s", prefix=b"ab", limit=1)),
    ("ttl-all-expired", kv_list(clock="T0+25h", prefix=b"z", limit=1)),
    ("ttl-clock-0", kv_list(clock="0", prefix=b"z", limit=1)),
    ("ttl-cursor-expired", kv_list(clock="T0+1s", cursor=B64(b"ab-ttl"), limit=2)),
]
for tag in [b"*", b'"0000000000000001"', b'W/"000000000000002a"', b'"000000000000002a"',
            b"0123456789abcdef", b'"ffffffffffffffff", W/"0000000000000001"',
            b'"a", "b,c", *', b'"a,*", "b"', b"W/*", b'"*"', b' , ,, ', b'"unterminated, *',
            b'W/ "0000000000000001"', b'  "0000000000000001"  ', b'"', b'""', b'W/""',
            b'"0000000000000001"garbage', "\u00a0*\u3000".encode()]:
    for v in range(5):
        KV.append((f"etag-v{v}", etag_header(tag, v)))


def relay_seed(client, app):
    """The http_relay layout: a split byte placing the client's bytes before the app's."""
    client, app = client.encode(), app.encode()
    total = len(client) + len(app)
    split = min(255, -(-len(client) * 255 // max(total, 1)))
    return bytes([split]) + client + app


RELAY = [
    ("get-keepalive", relay_seed(
        "GET /a?x=1 HTTP/1.1\r\nHost: 8000-sb-0123456789abcdef01234567.localhost\r\nCookie: a=1\r\n\r\n"
        "GET /b HTTP/1.1\r\nHost: h\r\n\r\n",
        "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 204 No Content\r\n\r\n")),
    ("post-chunked", relay_seed(
        "POST /u HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3;e=1\nabc\n0\nT: 1\n\n",
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")),
    ("websocket", relay_seed(
        "GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n\r\n\x81\x80abcd",
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\x81\x02hi")),
    ("until-close", relay_seed("HEAD / HTTP/1.1\r\nHost: h\r\n\r\nGET / HTTP/1.0\r\n\r\n",
                               "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nHTTP/1.1 200 OK\r\n\r\nrest")),
    ("smuggle", relay_seed("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                           "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx")),
]


def batch_bodies():
    """POST /wbx/v1/batches bodies as tests/wbx_batches.rs sends them (and near misses)."""
    none = {"mode": "none"}
    j = lambda **kw: dict({"command": "true"}, **kw)
    bodies = {
        "document": {
            "defaults": {"template": "base", "timeout_s": 600, "artifacts": ["output/"]},
            "jobs": [{"command": "python worker.py 1"}, {"command": "python worker.py 2"},
                     {"command": "python merge.py", "depends_on": [0, 1],
                      "inputs": [{"from_index": 0, "name": "output/part.csv", "as": "p1.csv"},
                                 {"from_index": 1, "name": "output/part.csv", "as": "p2.csv"}]}],
            "max_concurrency": 10, "max_total_cost": "2.00", "name": "nightly",
            "idempotency_key": "nightly-2026-11-08"},
        "chain": {"defaults": {"network": none, "retry": {"max_attempts": 2}},
                  "jobs": [j(), j(depends_on=[0]), j(inputs=[{"from_index": 1, "name": "out.txt"}])]},
        "cycle": {"jobs": [j(depends_on=[1]), j(depends_on=[0])]},
        "self": {"jobs": [j(depends_on=[0])]},
        "from-self": {"jobs": [j(inputs=[{"from_index": 0, "name": "a"}])]},
        "both": {"jobs": [j(), j(inputs=[{"from_index": 0, "job_id": "job_" + "0" * 24, "name": "a"}])]},
        "collide": {"jobs": [j(), j(inputs=[{"from_index": 0, "name": "a", "as": "x"},
                                            {"from_index": 0, "name": "b", "as": "x/y"}])]},
        "traversal": {"jobs": [j(), j(inputs=[{"from_index": 0, "name": "../etc/passwd"}])]},
        "job-id": {"jobs": [j(inputs=[{"job_id": "job_" + "a" * 24, "name": "output/x.csv", "as": "d/x.csv"}])]},
        "formula": {"jobs": [{"command": "=HYPERLINK(\"x\")"}, {"command": "-1+2, \"q\"\r\n@x"},
                             {"command": "+cmd", "depends_on": [0]}]},
        "defaults-command": {"defaults": {"command": "echo hi", "env": {"A": "b"}}, "jobs": [{}, {}, {"env": {"C": "d"}}]},
        "bounds": {"jobs": [j()], "max_concurrency": 100, "max_total_cost_eur": "0.5",
                   "webhook_url": "https://example.com/hook"},
        "dup-deps": {"jobs": [j(), j(depends_on=[0, 0, 0])]},
        "fan-in": {"jobs": [j() for _ in range(20)] + [j(depends_on=list(range(20)))]},
        "unknown": {"jobs": [j(sandbox=1)], "extra": 1},
        "idem-in-job": {"jobs": [j(idempotency_key="k")]},
    }
    return [(name, json.dumps(b)) for name, b in bodies.items()]


# Request paths as each face's table sees them (below its base path), the method byte
# first (0 GET, 1 HEAD, 2 PUT, 3 POST, 4 DELETE; 8: the method is the input's first line).
ROUTE_PATHS = [
    (f"{name}-{m}", bytes([m]) + path.encode())
    for name, path in [
        ("root", "/"),
        ("healthz", "/healthz"),
        ("execute", "/execute"),
        ("kv", "/v1/memory/facts/a/b%2Fc"),
        ("kv-list", "/v1/memory/facts"),
        ("session-fs", "/v1/sessions/s_1/fs"),
        ("jobs-wait", "/v1/jobs/wait"),
        ("job", "/v1/jobs/job_1"),
        ("wbx-sandbox", "/v1/sandboxes/sb_1/processes"),
        ("eryx-execute", "/v1/execute"),
        ("double-slash", "/v1//memory/x/y"),
        ("unicode", "/v1/memory/\u00e9/\u00fc"),
    ]
    for m in (0, 1, 2, 3, 4)
] + [("own-method", b"\x08BREW\n/healthz")]


def main():
    write("route_paths", ROUTE_PATHS)
    write("wbx_batch", batch_bodies())
    write("http_relay", RELAY)
    write("http_request", HTTP + [(f"malformed-{i:02}", m) for i, m in enumerate(MALFORMED)]
          + [("many-headers", "GET /healthz HTTP/1.1\r\nHost: x\r\n" + "".join(f"X-{i}: 1\r\n" for i in range(99)) + "\r\n"),
             ("long-uri", "GET /" + "a" * 300 + "?q=" + "%41" * 50 + " HTTP/1.1\r\nHost: x\r\n\r\n")])
    write("http_chunked", CHUNKED)
    write("execute_decode", execute_bodies())
    write("sse_utf8", SSE)
    write("build_frame", FRAMES)
    write("fs_normalize", FS_PATHS)
    write("kv_cursor", KV)


if __name__ == "__main__":
    main()
