#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/corpus/<target>/ (run from anywhere; idempotent).

Seeds are real inputs: requests the way curl and the test suite send them, the
malformed ones from tests/http_conformance.rs, the /execute bodies from
tests/sandbox_execute.rs, chunked bodies, program output with multi-byte text and
compile-stage frames as the build wrapper prints them.
"""
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


def main():
    write("http_request", HTTP + [(f"malformed-{i:02}", m) for i, m in enumerate(MALFORMED)]
          + [("many-headers", "GET /healthz HTTP/1.1\r\nHost: x\r\n" + "".join(f"X-{i}: 1\r\n" for i in range(99)) + "\r\n"),
             ("long-uri", "GET /" + "a" * 300 + "?q=" + "%41" * 50 + " HTTP/1.1\r\nHost: x\r\n\r\n")])
    write("http_chunked", CHUNKED)
    write("execute_decode", execute_bodies())
    write("sse_utf8", SSE)
    write("build_frame", FRAMES)


if __name__ == "__main__":
    main()
