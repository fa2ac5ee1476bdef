# isobox warm-pool harness for Python runtimes: a sandbox booted ahead of time with the
# interpreter already started, waiting for one execution.
#
# isoboxd starts this with `python3 -c` in a sandbox whose fd 0 is a socket to isoboxd.
# It sends one frame (a 4-byte big-endian length, then JSON) when it is ready; isoboxd
# answers with one frame when a request claims the sandbox:
#   {"files": [["main.py", "<base64>"], ...], "argv": ["main.py", "arg1", ...]}
# The files are written into /workspace (read-only, like the cold path's bind mounts),
# and argv[0] runs as `python3 argv[0] argv[1:]` would run it: as __main__, with
# sys.argv, sys.path[0] and __file__ as Python sets them, uncaught exceptions printed by
# sys.excepthook, SystemExit and interpreter shutdown left to Python itself. Whatever
# follows the frame on fd 0 is the program's stdin (isoboxd closes its end after it).
# The sandbox serves exactly this one execution and is destroyed after it.
import base64
import json
import os
import struct
import sys
import types


def _read_exact(n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            os._exit(0)  # isoboxd discarded this sandbox
        buf += chunk
    return bytes(buf)


def _send(obj):
    data = json.dumps(obj).encode()
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(0, view):]


def _claim():
    _send({"ev": "ready"})
    (n,) = struct.unpack(">I", _read_exact(4))
    msg = json.loads(_read_exact(n))
    for name, data in msg["files"]:
        path = os.path.join("/workspace", name)
        d = os.path.dirname(path)
        if d != "/workspace":
            os.makedirs(d, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        view = memoryview(base64.b64decode(data))
        while view:
            view = view[os.write(fd, view):]
        os.close(fd)
    return msg["argv"]


_argv = _claim()
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
del _claim, _read_exact, _send, _f
try:
    exec(compile(_source, _path, "exec"), _main.__dict__)
except SystemExit:
    raise
except BaseException as _e:
    # Printed as the interpreter would, without this harness's frame.
    _e.__traceback__ = _e.__traceback__.tb_next
    sys.excepthook(type(_e), _e, _e.__traceback__)
    sys.exit(1)
