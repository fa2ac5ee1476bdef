# isobox kernel harness: one persistent Python interpreter per kernel session.
#
# isoboxd starts this with `python3 -c` inside the session's sandbox. fd 0 is a
# socket to isoboxd and carries the framed protocol; it is moved to a private,
# close-on-exec descriptor and fd 0 becomes /dev/null, so nothing the user's code
# prints (fd 1 and 2 are plain pipes read by isoboxd) can look like a frame.
#
# Frames: a 4-byte big-endian length, then that many bytes of JSON.
#   isoboxd -> harness   {"op": "exec", "code": "..."}
#   harness -> isoboxd   {"ev": "ready", "python": "3.11.2"}            once, at start
#                        {"ev": "artifact", "type": "image/png", "dataB64": "..."}
#                        {"ev": "artifact", "type": "text/html", "data": "..."}
#                        {"ev": "done", "exit": 0, "truncated": false}
# A step's artifacts (at most 8) come before its done frame.
# isoboxd enforces every bound itself; this file only tries to stay within them.
import ast
import base64
import builtins
import importlib
import io
import json
import linecache
import os
import site
import struct
import sys
import traceback
import types

MAX_ARTIFACTS = 8
MAX_ARTIFACT_BYTES = 2 << 20

CTL = os.dup(0)  # close-on-exec: subprocesses never inherit the channel
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
OUT = os.dup(1)
ERR = os.dup(2)


def _read_exact(n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(CTL, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _recv():
    (n,) = struct.unpack(">I", _read_exact(4))
    return json.loads(_read_exact(n))


def _send(obj):
    data = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        n = os.write(CTL, view)
        view = view[n:]


def _stream(fd):
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(io.BufferedWriter(raw, 65536), encoding="utf-8",
                            errors="backslashreplace", line_buffering=True)


STDOUT = _stream(1)
STDERR = _stream(2)


def _restore_stdio():
    # A step may have closed or redirected fd 1/2, closed or replaced sys.std*.
    global STDOUT, STDERR
    for saved, fd in ((OUT, 1), (ERR, 2)):
        try:
            os.dup2(saved, fd)
        except OSError:
            pass
    if STDOUT.closed:
        STDOUT = _stream(1)
    if STDERR.closed:
        STDERR = _stream(2)
    sys.stdout, sys.stderr = STDOUT, STDERR
    if sys.stdin is None or sys.stdin.closed:
        sys.stdin = open(0, "r", closefd=False)


def _flush():
    for s in (sys.stdout, sys.stderr, STDOUT, STDERR):
        try:
            s.flush()
        except BaseException:
            pass


def _user_site():
    # `pip install --user` during the session: make its site-packages importable.
    try:
        us = site.getusersitepackages()
        if os.path.isdir(us) and us not in sys.path:
            # Before the system's site-packages, as Python puts it; then its .pth files.
            at = next((i for i, p in enumerate(sys.path) if p.endswith("-packages")), len(sys.path))
            sys.path.insert(at, us)
            site.addsitedir(us)
        importlib.invalidate_caches()
    except BaseException:
        pass


def _exit_code(e):
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except BaseException:
        pass
    return 1


def _print_exception(e, skip_harness):
    tb = e.__traceback__
    if skip_harness and tb is not None:
        tb = tb.tb_next
    try:
        if isinstance(e, SyntaxError):
            text = "".join(traceback.format_exception_only(type(e), e))
        else:
            text = "".join(traceback.format_exception(type(e), e, tb))
        sys.stderr.write(text)
    except BaseException:
        try:
            os.write(ERR, ("%s\n" % type(e).__name__).encode())
        except BaseException:
            pass


class _Artifacts:
    def __init__(self):
        self.items = []
        self.truncated = False

    def add(self, kind, payload):
        size = len(payload.encode()) if isinstance(payload, str) else len(payload)
        if len(self.items) >= MAX_ARTIFACTS or size > MAX_ARTIFACT_BYTES:
            self.truncated = True
        elif kind == "image/png":
            self.items.append({"type": kind, "dataB64": payload})
        else:
            self.items.append({"type": kind, "data": payload})


def _figures(arts):
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        nums = list(plt.get_fignums())
    except BaseException:
        return
    for num in nums:
        try:
            fig = plt.figure(num)
            buf = io.BytesIO()
            fig.savefig(buf, format="png")
            arts.add("image/png", base64.b64encode(buf.getvalue()).decode("ascii"))
        except BaseException:
            pass
        finally:
            try:
                plt.close(num)
            except BaseException:
                pass


def _rich(value, arts):
    """The value's HTML or PNG representation, as an artifact; False when it has none."""
    try:
        f = getattr(value, "_repr_html_", None)
        html = f() if callable(f) else None
        if isinstance(html, str):
            arts.add("text/html", html)
            return True
        f = getattr(value, "_repr_png_", None)
        png = f() if callable(f) else None
        if isinstance(png, (bytes, bytearray)):
            arts.add("image/png", base64.b64encode(png).decode("ascii"))
            return True
    except BaseException:
        pass
    return False


def _shell(command, timeout):
    # The agent's run_shell (and the UI's): `bash -c command` on the step's own stdout
    # and stderr, in its own process group. The step ends with bash's exit status;
    # past `timeout` seconds the whole group is killed in place and the status is
    # 124 with a note on stderr. The kernel lives on either way.
    import signal
    import subprocess

    _flush()
    p = subprocess.Popen(["/bin/bash", "-c", command], stdin=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        code = p.wait(timeout=timeout)
    except BaseException as e:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        sys.stderr.write("[shell timed out after %ss]\n" % format(timeout, "g"))
        code = 124
    if code < 0:
        code = 128 - code  # killed by a signal: reported as bash would
    raise SystemExit(code)


# `__import__("_isobox").shell(command, seconds)`: reachable from any step without a
# name in the user's namespace.
_ISOBOX = types.ModuleType("_isobox")
_ISOBOX.shell = _shell
sys.modules["_isobox"] = _ISOBOX

_SOURCES = []
_SOURCE_BYTES = 0

MAIN = types.ModuleType("__main__")
MAIN.__dict__["__builtins__"] = builtins
sys.modules["__main__"] = MAIN
sys.argv = [""]
NS = MAIN.__dict__


def _step(code, n):
    _restore_stdio()
    sys.modules["_isobox"] = _ISOBOX  # a step may have removed or replaced it
    _user_site()
    name = "<step %d>" % n
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    # Tracebacks show the source of recent steps; older sources are let go, so a long
    # session's memory does not grow with all the code it was ever sent.
    _SOURCES.append((name, len(code)))
    global _SOURCE_BYTES
    _SOURCE_BYTES += len(code)
    while len(_SOURCES) > 1 and (len(_SOURCES) > 1000 or _SOURCE_BYTES > 8 << 20):
        old, size = _SOURCES.pop(0)
        _SOURCE_BYTES -= size
        linecache.cache.pop(old, None)
    exit_code = 0
    has_value, value = False, None
    try:
        tree = ast.parse(code, name, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, name, "exec"), NS)
        if last is not None:
            value = eval(compile(last, name, "eval"), NS)
            has_value = True
    except SystemExit as e:
        exit_code = _exit_code(e)
    except BaseException as e:
        exit_code = 1
        _print_exception(e, skip_harness=True)
    arts = _Artifacts()
    _figures(arts)
    if has_value and value is not None:
        builtins._ = value
        if not _rich(value, arts):
            try:
                print(repr(value))
            except BaseException as e:
                _print_exception(e, skip_harness=False)
    _flush()
    return exit_code, arts


def _serve():
    _send({"ev": "ready", "python": sys.version.split()[0]})
    n = 0
    while True:
        try:
            msg = _recv()
        except EOFError:
            return
        except BaseException:
            # A signal handler or a thread of an earlier step raised while we waited:
            # not this harness's business. (A frame cut in half by it cannot be
            # resynchronised: isoboxd ends the kernel when the next frame is invalid.)
            continue
        if msg.get("op") != "exec":
            continue
        n += 1
        try:
            exit_code, arts = _step(msg.get("code", ""), n)
        except BaseException as e:
            # The harness itself failed around the step: report it, stay alive.
            try:
                os.write(ERR, ("isobox kernel: %r\n" % (e,)).encode())
            except BaseException:
                pass
            exit_code, arts = 1, _Artifacts()
        while True:
            try:
                for a in arts.items:
                    a["ev"] = "artifact"
                    _send(a)
                arts.items = []
                _send({"ev": "done", "exit": exit_code, "truncated": arts.truncated})
                break
            except InterruptedError:
                continue
            except BaseException:
                # Interrupted mid-frame: the channel is out of step; isoboxd ends the
                # kernel when it sees the broken frame.
                raise


_serve()
