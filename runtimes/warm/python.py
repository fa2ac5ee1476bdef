# isobox warm-pool harness for Python runtimes: a sandbox booted ahead of time with the
# interpreter already started, waiting for one execution.
#
# isoboxd starts this with `python3 -c` in a sandbox whose fd 0 is a socket to isoboxd.
# It sends one frame (a 4-byte big-endian length, then JSON) when it is ready:
#   {"ev": "ready"}
# and isoboxd answers with one frame when a request claims the sandbox, binary as
# build.pl's: a 4-byte big-endian count of files, each file a 4-byte length and its name
# then a 4-byte length and its bytes, then a 4-byte count of argv words, each a 4-byte
# length and the word (UTF-8).
# It imports only modules the interpreter has built in (or already loaded at its start)
# and `types`: json and base64 would pull in re, enum, functools and collections, about
# a sixth of a pooled sandbox's boot CPU under gVisor, and a program would find them
# already imported where a cold run's would not.
# The files are written into /workspace (read-only, like the cold path's bind mounts),
# and argv[0] runs as `python3 argv[0] argv[1:]` would run it: as __main__, with
# sys.argv, sys.path[0] and __file__ as Python sets them, uncaught exceptions printed by
# sys.excepthook, SystemExit and interpreter shutdown left to Python itself. Whatever
# follows the frame on fd 0 is the program's stdin (isoboxd shuts its writing half after
# it).
#
# When the program has ended — the last atexit handler, registered here first, runs after
# the program's own handlers and after Python has joined its threads — the harness
# flushes stdout and stderr and sends one more frame on a duplicate of fd 0:
#   {"ev": "exit", "code": <the exit status Python is about to exit with>}
# isoboxd then answers at once instead of waiting for the sandbox's teardown (the pipes
# reach EOF only when `runsc run` exits, ~20 ms later under ptrace). Whenever the status
# is not known exactly — os._exit, a signal, a flush that fails (Python would exit 120),
# threads or other processes still running, a forked child's exit — or Python's teardown
# could still write (a live object whose class has __del__, a suspended generator, an
# unfinished coroutine, a file object not closed), no frame is sent
# and isoboxd waits for the exit as on a cold run. A program that forges the frame only
# ends its own run early.
# The sandbox serves exactly this one execution and is destroyed after it.
import sys

# What a cold interpreter has imported when the program starts: whatever the harness
# adds (its own imports; linecache, which Python 3.13 imports before a `-c` command
# runs and not before a script) is taken out of sys.modules before the program runs,
# so a program finds what it would find cold (the harness keeps its own references; a
# program that imports one of them gets it anew, as cold).
_cold_modules = set(sys.modules) - {"linecache"}

import atexit  # noqa: E402
import fcntl  # noqa: E402
import gc  # noqa: E402
import io  # noqa: E402
import os  # noqa: E402
import types  # noqa: E402


def _read_exact(n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            os._exit(0)  # isoboxd discarded this sandbox
        buf += chunk
    return bytes(buf)


def _send(data, fd=0):
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        view = view[os.write(fd, view):]


def _claim():
    _send(b'{"ev": "ready"}')
    msg = memoryview(_read_exact(int.from_bytes(_read_exact(4), "big")))
    at = 0

    def take(n):
        nonlocal at
        b = msg[at:at + n]
        if len(b) != n:
            raise ValueError("the claim ends early")
        at += n
        return b

    def item():
        return take(int.from_bytes(take(4), "big"))

    files = [(bytes(item()).decode(), item()) for _ in range(int.from_bytes(take(4), "big"))]
    argv = [bytes(item()).decode() for _ in range(int.from_bytes(take(4), "big"))]
    if at != len(msg):
        raise ValueError("bytes after the claim")
    for name, data in files:
        path = os.path.join("/workspace", name)
        d = os.path.dirname(path)
        if d != "/workspace":
            os.makedirs(d, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        view = data
        while view:
            view = view[os.write(fd, view):]
        os.close(fd)
    return argv


_argv = _claim()
# The exit frame's channel: fd 0 itself may be closed by the program (sys.stdin.close()).
# A high number, close-on-exec: the program's own first open still gets fd 3.
_ctl = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 100)
# The status Python will exit with, once known exactly; None: no frame.
_status = None


def _exit_status(e):
    # As Python's handle_system_exit computes it from a SystemExit.
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if -(2**31) <= code < 2**31 else None
    return 1  # Python prints the object to stderr and exits 1


_pid = os.getpid()


# What a live object of a type means for the teardown (see _teardown_may_run_code).
_QUIET, _RUNS, _FILE, _GEN, _CORO = range(5)
# In-memory files write nothing anywhere when they die.
_MEMORY_FILES = (io.StringIO, io.BytesIO)


def _kind_of(k):
    if k is types.GeneratorType:
        return _GEN
    if k is types.CoroutineType:
        return _CORO
    if issubclass(k, io.IOBase):
        if issubclass(k, _MEMORY_FILES):
            return _QUIET
        # io's own classes write buffered data when they die, if not closed; a file
        # class written in Python may run anything (even its `closed`).
        return _FILE if k.__module__ in ("_io", "io") else _RUNS
    return _RUNS if getattr(k, "__del__", None) is not None else _QUIET


def _teardown_may_run_code():
    # What Python's own teardown, after this handler, could still run or write: an
    # instance of a class with __del__ (async generators included), a file object not
    # closed other than the standard streams, a generator suspended inside its body
    # (closing it runs its `finally` blocks), an unfinished coroutine ("never awaited").
    std = set()
    for f in (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__):
        for o in (f, getattr(f, "buffer", None), getattr(getattr(f, "buffer", None), "raw", None)):
            std.add(id(o))
    kinds = {}
    for o in gc.get_objects():
        k = type(o)
        v = kinds.get(k)
        if v is None:
            v = kinds[k] = _kind_of(k)
        if v == _QUIET:
            continue
        if v == _RUNS:
            return True
        if v == _FILE and id(o) not in std and not o.closed:
            return True
        if v == _GEN and getattr(o, "gi_suspended", True):
            return True
        if v == _CORO and o.cr_frame is not None:
            return True
    return False


def _others_alive():
    # Processes the program started and left running may still write to the pipes.
    try:
        return any(p.isdigit() and int(p) != _pid for p in os.listdir("/proc"))
    except OSError:
        return True


def _finish():
    # A forked child's own exit is not the program's; threads or processes still running
    # may write; finalisers run after this handler could write (they end the run the
    # cold way).
    if _status is None or os.getpid() != _pid or len(sys._current_frames()) > 1:
        return
    try:
        if _others_alive() or _teardown_may_run_code():
            return
        for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            if f is not None:
                f.flush()
        _send(b'{"ev": "exit", "code": %d}' % _status, _ctl)
    except BaseException:
        pass


atexit.register(_finish)
_path = os.path.join("/workspace", _argv[0])
sys.argv = list(_argv)
sys.path[0] = os.path.dirname(_path)
_main = types.ModuleType("__main__")
_main.__file__ = _path
_main.__builtins__ = __builtins__
_main.__cached__ = None
sys.modules["__main__"] = _main
with open(_path, "rb") as _f:
    _source = _f.read()
del _claim, _read_exact, _f
for _m in set(sys.modules) - _cold_modules:
    del sys.modules[_m]
try:
    exec(compile(_source, _path, "exec"), _main.__dict__)
    _status = 0
except SystemExit as _e:
    _status = _exit_status(_e)
    raise
except BaseException as _e:
    # Printed as the interpreter would, without this harness's frame.
    _e.__traceback__ = _e.__traceback__.tb_next
    # Kept as PyErr_Print keeps them (their frames live until the teardown).
    sys.last_type, sys.last_value, sys.last_traceback = type(_e), _e, _e.__traceback__
    sys.excepthook(type(_e), _e, _e.__traceback__)
    # An uncaught KeyboardInterrupt ends Python by SIGINT after its shutdown; the
    # sandbox reports that as 130 (and PID 1 ignores the signal and exits 130).
    _status = 130 if isinstance(_e, KeyboardInterrupt) else 1
    sys.exit(_status)
