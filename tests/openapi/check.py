#!/usr/bin/env python3
"""Check the OpenAPI document a running isoboxd serves against its route table.

    python3 tests/openapi/check.py BASE_URL PATHS_FILE [--no-live] [--execute-language LANG]

BASE_URL    where the daemon listens, e.g. http://127.0.0.1:8090
PATHS_FILE  the route table, one route a line: PATH<TAB>METHODS, e.g.
                /execute<TAB>POST
                /healthz<TAB>GET, HEAD
            (blank lines and lines starting with `#` are ignored)

Checks:
  * GET BASE_URL/openapi.yaml answers 200 `application/yaml` and parses as YAML;
  * the document is valid OpenAPI 3.1 (openapi-spec-validator);
  * every path of PATHS_FILE is in `paths` with each of its methods (HEAD may be
    left out of the document when GET is there: it mirrors GET), and the document
    lists no path and no operation that PATHS_FILE does not;
  * every JSON example in the document validates against its schema;
  * live (skipped with --no-live): the real responses of GET /healthz, /readyz,
    /runtimes, /llms.txt, /openapi.yaml, HEAD of each GET route, an unknown path
    (404), a wrong method on every route (405 + Allow), POST /execute `{}` (400)
    and POST /execute `{"language":LANG,"code":"print(1)"}` (200) validate
    against the documented schema for their status, and the documented JSON
    examples of those responses have the same shape (keys and value types,
    recursively) as the real bodies. LANG defaults to python-slim; the execute
    check is skipped when LANG is not in GET /runtimes.

The last line printed is `N passed, M failed`; the exit status is 1 when any check
failed (2 on a usage error).

Dependencies: tests/openapi/requirements.txt (pip install -r it into a venv).
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import urllib.parse
from typing import Any

import yaml
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import OpenAPIV31SpecValidator

HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
EXECUTE_CODE = "print(1)"


class Checker:
    """Counts and prints check results."""

    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def ok(self, name: str) -> None:
        self.passed += 1
        print(f"ok    {name}")

    def fail(self, name: str, why: str) -> None:
        self.failed += 1
        print(f"FAIL  {name}: {why}")

    def check(self, name: str, cond: bool, why: str = "") -> bool:
        if cond:
            self.ok(name)
        else:
            self.fail(name, why or "condition not met")
        return cond

    @staticmethod
    def skip(name: str, why: str) -> None:
        print(f"skip  {name}: {why}")


# --- HTTP ------------------------------------------------------------------------


class Http:
    """One request per connection, so a failure never poisons the next check."""

    def __init__(self, base_url: str, timeout: float) -> None:
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"BASE_URL must be http://host[:port]: {base_url!r}")
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port
        self.prefix = u.path.rstrip("/")
        self.timeout = timeout

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=self.timeout)
        try:
            conn.request(method, self.prefix + path, body=body, headers=headers or {})
            resp = conn.getresponse()
            data = resp.read()
            hdrs = {k.lower(): v for k, v in resp.getheaders()}
            return resp.status, hdrs, data
        finally:
            conn.close()


# --- the document ----------------------------------------------------------------


def parse_paths_file(path: str) -> dict[str, set[str]]:
    """PATH<TAB>METHODS lines -> {path: {METHOD, ...}}."""
    routes: dict[str, set[str]] = {}
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 1)
            if len(parts) != 2:
                raise ValueError(f"{path}:{n}: expected PATH<TAB>METHODS, got {raw.rstrip()!r}")
            methods = {m.strip().upper() for m in parts[1].split(",") if m.strip()}
            if not methods:
                raise ValueError(f"{path}:{n}: no methods")
            routes.setdefault(parts[0], set()).update(methods)
    return routes


def deref(doc: dict[str, Any], node: Any) -> Any:
    """Follows local `$ref`s (`#/...`) until a node without one."""
    seen = set()
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/") or ref in seen:
            raise ValueError(f"cannot follow $ref {ref!r}")
        seen.add(ref)
        node = doc
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            node = node[part]
    return node


def schema_errors(doc: dict[str, Any], schema: Any, instance: Any) -> list[str]:
    """Validates `instance` against an OpenAPI 3.1 schema object of `doc`."""
    if isinstance(schema, bool):
        return [] if schema else ["schema is `false`"]
    root = dict(schema)
    # `#/components/...` references resolve against the root of the schema resource.
    root["components"] = doc.get("components", {})
    try:
        v = OAS31Validator(root)
        return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in v.iter_errors(instance)]
    except Exception as e:  # e.g. a $ref that points nowhere
        return [short_exc(e)]


def short_exc(e: Exception) -> str:
    """One short line for an exception (referencing errors embed the whole document)."""
    msg = str(e).split(" within {", 1)[0].split("\n", 1)[0]
    return f"{type(e).__name__}: {msg[:200]}"


def media_examples(media: dict[str, Any]) -> list[tuple[str, Any]]:
    """(name, value) of a media type's `example` / `examples`."""
    out = []
    if "example" in media:
        out.append(("example", media["example"]))
    for name, ex in (media.get("examples") or {}).items():
        if isinstance(ex, dict) and "value" in ex:
            out.append((name, ex["value"]))
    return out


def iter_json_media(doc: dict[str, Any]):
    """Yields (label, media object) of every application/json request and response body."""
    for path, item in (doc.get("paths") or {}).items():
        for method in HTTP_METHODS:
            op = item.get(method)
            if not isinstance(op, dict):
                continue
            label = f"{method.upper()} {path}"
            if "requestBody" in op:
                rb = deref(doc, op["requestBody"])
                for mt, media in (rb.get("content") or {}).items():
                    if mt.split(";")[0].strip() == "application/json":
                        yield f"{label} request", media
            for status, resp in (op.get("responses") or {}).items():
                resp = deref(doc, resp)
                for mt, media in (resp.get("content") or {}).items():
                    if mt.split(";")[0].strip() == "application/json":
                        yield f"{label} {status}", media


def response_media(doc: dict[str, Any], path: str, method: str, status: int) -> dict[str, Any] | None:
    """The documented application/json media object of a response, if any."""
    op = ((doc.get("paths") or {}).get(path) or {}).get(method.lower())
    if not isinstance(op, dict):
        return None
    responses = op.get("responses") or {}
    resp = responses.get(str(status)) or responses.get(f"{str(status)[0]}XX") or responses.get("default")
    if resp is None:
        return None
    resp = deref(doc, resp)
    for mt, media in (resp.get("content") or {}).items():
        if mt.split(";")[0].strip() == "application/json":
            return media
    return None


def shape(v: Any) -> Any:
    """Keys and JSON types, recursively (array items merged)."""
    if isinstance(v, dict):
        return {k: shape(x) for k, x in sorted(v.items())}
    if isinstance(v, list):
        items = []
        for x in v:
            s = shape(x)
            if s not in items:
                items.append(s)
        return items
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if v is None:
        return "null"
    return "string"


# --- checks ----------------------------------------------------------------------


def check_document(c: Checker, doc: Any, routes: dict[str, set[str]]) -> bool:
    if not c.check("document is a YAML mapping", isinstance(doc, dict), f"got {type(doc).__name__}"):
        return False
    version = str(doc.get("openapi", ""))
    c.check("openapi is 3.1.x", version.startswith("3.1."), f"openapi: {version!r}")
    try:
        errors = [str(e).split("\n", 1)[0] for e in OpenAPIV31SpecValidator(doc).iter_errors()]
    except Exception as e:  # unresolvable $ref and the like are raised, not yielded
        errors = [short_exc(e)]
    c.check("valid OpenAPI 3.1 (openapi-spec-validator)", not errors, "; ".join(errors[:10]) + (f" (+{len(errors) - 10} more)" if len(errors) > 10 else ""))

    paths = doc.get("paths") or {}
    for path in sorted(routes):
        item = paths.get(path)
        if not c.check(f"path {path} documented", isinstance(item, dict), "missing from `paths`"):
            continue
        for method in sorted(routes[path]):
            m = method.lower()
            if m == "head" and m not in item:
                c.check(f"{method} {path} documented (mirrors GET)", "get" in item, "neither HEAD nor GET documented")
            else:
                c.check(f"{method} {path} documented", isinstance(item.get(m), dict), "operation missing")
    extra = []
    for path, item in sorted(paths.items()):
        if path not in routes:
            extra.append(f"path {path}")
            continue
        for m in HTTP_METHODS:
            if m in item and m.upper() not in routes[path]:
                extra.append(f"{m.upper()} {path}")
    c.check("document lists nothing outside PATHS_FILE", not extra, "extra: " + ", ".join(extra))

    try:
        medias = list(iter_json_media(doc))
    except Exception as e:
        c.fail("examples", f"cannot walk the document: {short_exc(e)}")
        return True
    count, bad = 0, []
    for label, media in medias:
        schema = media.get("schema")
        for name, value in media_examples(media):
            count += 1
            errs = ["no schema"] if schema is None else schema_errors(doc, schema, value)
            if errs:
                bad.append(f"{label} {name}: {'; '.join(errs[:3])}")
    c.check(f"all {count} JSON examples match their schemas", not bad, " | ".join(bad))
    return True


def check_live_json(c: Checker, doc: dict[str, Any], name: str, path: str, method: str, status: int, body: bytes, headers: dict[str, str], compare_examples: bool = True) -> Any:
    """Validates a real JSON response against the documented one; returns the parsed body."""
    media = response_media(doc, path, method, status)
    if not c.check(f"{name}: status {status} documented with a JSON body", media is not None, f"no application/json response {status} for {method} {path}"):
        return None
    ctype = headers.get("content-type", "")
    c.check(f"{name}: Content-Type is application/json", ctype.split(";")[0].strip() == "application/json", f"got {ctype!r}")
    try:
        value = json.loads(body)
    except ValueError as e:
        c.fail(f"{name}: body is JSON", str(e))
        return None
    errs = schema_errors(doc, media.get("schema", True), value)
    c.check(f"{name}: body matches the documented schema", not errs, "; ".join(errs[:5]))
    if compare_examples:
        examples = media_examples(media)
        if examples:
            live = shape(value)
            same = [n for n, ex in examples if shape(ex) == live]
            c.check(f"{name}: a documented example has the real body's shape", bool(same), f"real {json.dumps(live)} vs examples {[n for n, _ in examples]}")
    return value


def check_live(c: Checker, h: Http, doc: dict[str, Any], routes: dict[str, set[str]], language: str) -> None:
    gets = [p for p in sorted(routes) if "GET" in routes[p]]
    for path in gets:
        try:
            status, hdrs, body = h.request("GET", path)
        except OSError as e:
            c.fail(f"GET {path}", str(e))
            continue
        if path in ("/", "/llms.txt", "/openapi.yaml", "/metrics"):
            op = (doc.get("paths") or {}).get(path, {}).get("get", {})
            documented = list(((op.get("responses") or {}).get("200") or {}).get("content", {}).keys())
            ctype = hdrs.get("content-type", "")
            base = lambda t: t.split(";")[0].strip().lower()  # noqa: E731
            c.check(f"GET {path}: 200 with a body", status == 200 and len(body) > 0, f"status {status}, {len(body)} bytes")
            c.check(f"GET {path}: Content-Type is documented", base(ctype) in [base(t) for t in documented], f"got {ctype!r}, documented {documented}")
        else:
            check_live_json(c, doc, f"GET {path}", path, "GET", status, body, hdrs)
        if "HEAD" in routes[path]:
            item = (doc.get("paths") or {}).get(path) or {}
            op = item.get("head") if isinstance(item.get("head"), dict) else item.get("get") or {}
            documented = {str(k) for k in (op.get("responses") or {})}
            try:
                hstatus, hhdrs, hbody = h.request("HEAD", path)
                # The status may legitimately change between the two requests (/readyz).
                c.check(f"HEAD {path}: GET's status (or another documented one), no body", hbody == b"" and (hstatus == status or str(hstatus) in documented), f"HEAD {hstatus} ({len(hbody)} bytes) vs GET {status}")
            except OSError as e:
                c.fail(f"HEAD {path}", str(e))

    # Unknown path: the documented error body.
    try:
        status, hdrs, body = h.request("GET", "/this-path-does-not-exist")
        ok = status == 404
        c.check("GET unknown path: 404", ok, f"status {status}")
        if ok:
            errs = schema_errors(doc, {"$ref": "#/components/schemas/Error"}, json.loads(body)) if "Error" in doc.get("components", {}).get("schemas", {}) else ["no components.schemas.Error"]
            c.check("GET unknown path: body is an Error", not errs, "; ".join(errs))
    except (OSError, ValueError) as e:
        c.fail("GET unknown path", str(e))

    # A wrong method on every route: 405, Allow lists PATHS_FILE's methods.
    for path in sorted(routes):
        wrong = "DELETE" if "DELETE" not in routes[path] else "PATCH"
        try:
            status, hdrs, body = h.request(wrong, path)
            allow = {m.strip() for m in hdrs.get("allow", "").split(",") if m.strip()}
            c.check(f"{wrong} {path}: 405 with Allow {', '.join(sorted(routes[path]))}", status == 405 and allow == routes[path], f"status {status}, Allow {hdrs.get('allow')!r}")
            item = (doc.get("paths") or {}).get(path) or {}
            op = next((m for m in HTTP_METHODS if m.upper() in routes[path] and m in item), None)
            media = response_media(doc, path, op, 405) if op else None
            if media is not None:
                errs = schema_errors(doc, media.get("schema", True), json.loads(body))
                c.check(f"{wrong} {path}: body matches the documented 405", not errs, "; ".join(errs))
            else:
                c.fail(f"{wrong} {path}: 405 documented", "no JSON 405 response on the route's operation")
        except (OSError, ValueError) as e:
            c.fail(f"{wrong} {path}", str(e))

    if "/execute" not in routes or "POST" not in routes["/execute"]:
        return
    jh = {"Content-Type": "application/json"}
    try:
        status, hdrs, body = h.request("POST", "/execute", b"{}", jh)
        c.check("POST /execute {}: 400", status == 400, f"status {status}")
        v = check_live_json(c, doc, "POST /execute {}", "/execute", "POST", status, body, hdrs, compare_examples=False)
        if isinstance(v, dict):
            c.check("POST /execute {}: error is language_required", v.get("error") == "language_required", f"got {v.get('error')!r}")
    except OSError as e:
        c.fail("POST /execute {}", str(e))

    try:
        status, _, body = h.request("GET", "/runtimes")
        installed = {r.get("language") for r in json.loads(body)} | {a for r in json.loads(body) for a in r.get("aliases", [])}
    except (OSError, ValueError, AttributeError, TypeError) as e:
        c.fail("GET /runtimes for the execute check", str(e))
        return
    if language not in installed:
        Checker.skip(f"POST /execute {language}", f"{language!r} is not installed here (GET /runtimes)")
        return
    req = json.dumps({"language": language, "code": EXECUTE_CODE}).encode()
    name = f"POST /execute {req.decode()}"
    try:
        status, hdrs, body = h.request("POST", "/execute", req, jh)
    except OSError as e:
        c.fail(name, str(e))
        return
    if not c.check(f"{name}: 200", status == 200, f"status {status}: {body[:300]!r}"):
        return
    v = check_live_json(c, doc, name, "/execute", "POST", status, body, hdrs)
    if isinstance(v, dict):
        run = v.get("run") or {}
        c.check(f"{name}: printed 1 and exited 0", run.get("stdout") == "1\n" and run.get("exitCode") == 0, f"run: {json.dumps(run)[:300]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base_url", metavar="BASE_URL")
    ap.add_argument("paths_file", metavar="PATHS_FILE")
    ap.add_argument("--no-live", action="store_true", help="only check the document, not the daemon's real responses")
    ap.add_argument("--execute-language", default="python-slim", metavar="LANG", help="language of the live POST /execute check (default: python-slim)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per HTTP request (default: 60)")
    args = ap.parse_args()

    c = Checker()
    try:
        routes = parse_paths_file(args.paths_file)
        h = Http(args.base_url, args.timeout)
    except (OSError, ValueError) as e:
        print(f"check.py: {e}", file=sys.stderr)
        print("0 passed, 1 failed")
        return 2

    try:
        status, hdrs, body = h.request("GET", "/openapi.yaml")
    except OSError as e:
        c.fail("GET /openapi.yaml", str(e))
        print(f"{c.passed} passed, {c.failed} failed")
        return 1
    ctype = hdrs.get("content-type", "")
    ok = c.check("GET /openapi.yaml: 200", status == 200, f"status {status}")
    c.check("GET /openapi.yaml: Content-Type application/yaml", ctype.split(";")[0].strip() == "application/yaml", f"got {ctype!r}")
    doc = None
    if ok:
        try:
            doc = yaml.safe_load(body)
            c.ok("openapi.yaml parses as YAML")
        except yaml.YAMLError as e:
            c.fail("openapi.yaml parses as YAML", str(e))
    if doc is not None and check_document(c, doc, routes) and not args.no_live:
        check_live(c, h, doc, routes, args.execute_language)

    print(f"{c.passed} passed, {c.failed} failed")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
