"""The suite's zygote: an interpreter that has imported torch, from which the programs tests start
are forked instead of started afresh.

``import torch`` takes 2-3 CPU-seconds on the machines the suite runs on, and the suite starts
some 500 interpreters (a test's program, torchrun and its ranks, spawned workers): about 40% of
its CPU time. Every pytest worker starts one zygote (``start``); ``conftest.python`` then runs
``zygote_client.py`` in place of the interpreter, and the interpreters the program starts do the
same (``sys.executable`` names the client). Per program the zygote forks a keeper, which forks the
program and tells the client how it ended; the client passes signals on.

A forked program starts as the same command in a fresh interpreter does. What a fresh interpreter
sets up before the program runs is set as it would be: the command line (``-m``, ``-c`` or a
script, with ``-u`` or ``-B``; ``sys.argv``, ``sys.path[0]``, ``__main__``), the environment, the
working folder, the open files (by number), the standard streams, PYTHONPATH and a
``sitecustomize`` on it, signal handlers, a session of its own. Torch's own modules are out of
``sys.modules`` until the program imports torch (``_TorchAsNotYetImported``), so cudashim's
launcher and start-up hook find torch not imported yet and wait for it, as they do in a fresh
interpreter; the libraries torch imported (numpy, pynvml, ...) are there from the start, and sympy,
which torch imports later (``_LIBRARIES_TORCH_IMPORTS_LATER``).

Where a fork cannot be the same, the client execs the real interpreter instead (``_why_fresh``):
other options before the program, a variable Python or torch reads as it starts that differs from
the zygote's, a folder on the path holding a module the zygote imported or a distribution with a
``torch.backends`` entry point (torch loads those as it imports). A test whose subject is torch's
import itself runs ``python(..., fresh=True)``; ``--fresh-interpreters`` starts every program
afresh, and ``TESTS_ZYGOTE_LOG=FILE`` writes a line per program saying which way it started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

HERE = Path(__file__).resolve().parent
CLIENT = HERE / "zygote_client.py"

# Variables read while Python or torch (and the libraries it loads) start: a program whose value
# differs from the zygote's is started afresh. Those read later (at activation, at the first
# collective, at a build) are named in _READ_LATER.
_READ_AT_START = ("PYTHON", "TORCH", "PYTORCH", "OMP_", "KMP_", "GOMP_", "MKL", "LD_", "ATEN_",
                  "DNNL_", "ONEDNN_", "OPENBLAS", "NUMPY", "LC_", "LANG", "MALLOC", "GLIBC", "CUDA_",
                  "HIP", "ROCM", "XLA", "TF_", "SYMPY_", "MPMATH_", "SAGE_ROOT")
_READ_LATER = ("PYTHONPATH", "PYTORCH_NVML_BASED_CUDA_CHECK", "CUDA_VISIBLE_DEVICES",
               "TORCHELASTIC_", "TORCH_NCCL_", "TORCHINDUCTOR_", "TORCH_EXTENSIONS_DIR",
               "TORCH_COMPILE_DEBUG_DIR")

# Libraries that torch's lazily imported parts import, and that import nothing of torch's: the
# zygote imports them after torch, and they stay imported in every program, as numpy does. sympy
# (with mpmath) comes with torch._dynamo, which torch imports at a program's first optimizer step:
# 0.4 of the 1.2 CPU-seconds that import costs a forked program here. torch._dynamo itself stays
# the program's to import: imported before cudashim activates, it would build its tables from
# unpatched torch, which no user's program does.
_LIBRARIES_TORCH_IMPORTS_LATER = ("sympy",)

_running = None                         # this worker's zygote (a Zygote), once started


# --- the pytest worker's side -------------------------------------------------------------
class Zygote:
    """A zygote process of this worker, and the folder holding its socket and client."""

    def __init__(self, env: dict, launcher: Sequence[str] = ()):
        """``launcher``: what the zygote is started under (a cluster node's namespaces); the
        programs forked from it live there too."""
        self.folder = Path(tempfile.mkdtemp(prefix="cudashim-zygote-"))
        self.address = self.folder / "socket"
        self.executable = self._client_executable()
        self.process = subprocess.Popen(
            [*launcher, sys.executable, str(HERE / "zygote.py"), str(self.address)], env=env,
            cwd=str(HERE.parent), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _client_executable(self) -> Path:
        """``bin/python`` running the client, beside links to what the environment's ``bin``
        holds: a program that finds a console script next to ``sys.executable`` still does."""
        folder = self.folder / "bin"
        folder.mkdir()
        real_bin = Path(sys.executable).parent
        for entry in real_bin.iterdir():
            if not entry.name.startswith("python"):
                (folder / entry.name).symlink_to(entry)
        client = folder / "python"
        client.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "{CLIENT}" '
                          f'"{self.address}" "{sys.executable}" "$@"\n')
        client.chmod(0o755)
        return client

    def list_siblings(self, sockets: dict) -> None:
        """Name the zygotes of other hosts (a cluster's nodes: tests/cluster.py) by host name:
        the client reaching this one from such a host connects to that host's instead."""
        written = self.folder / "hosts.json.partial"
        written.write_text(json.dumps(sockets))
        written.rename(self.folder / "hosts.json")

    def serving(self, timeout: float) -> bool:
        """Wait until it serves; False if it ended first or did not serve in time. (Its Popen
        cannot tell from a forked test whether it ended: it is the worker's child, not the test's.)"""
        import time
        deadline = time.monotonic() + timeout
        while not self.address.exists():
            try:
                state = Path(f"/proc/{self.process.pid}/stat").read_text().rpartition(")")[2].split()[0]
            except OSError:
                return False
            if state in ("Z", "X") or time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def start(env: dict) -> None:
    """Start this worker's zygote (it serves once it has imported torch; until then, and if it
    cannot, programs start afresh)."""
    global _running
    # Linux's: the client lists its open files in /proc, the keeper waits on a pidfd.
    if _running is None and sys.platform == "linux" and hasattr(os, "pidfd_open"):
        _running = Zygote(env)


def stop() -> None:
    global _running
    if _running is not None:
        _running.stop()
        _running = None


def executable() -> str:
    """What to run in place of ``python``: the client while a zygote runs, else the interpreter."""
    return str(_running.executable) if _running is not None else sys.executable


# --- the zygote ---------------------------------------------------------------------------
def serve(address: str):
    """Import torch, then fork a keeper per connection. Returns only in a forked program, with
    what it is to run; exits when the worker that started it is gone."""
    if not _imports_quietly():
        return None                     # programs start afresh: the socket never appears
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    partial = f"{address}.{os.getpid()}"
    listener.bind(partial)
    listener.listen(64)
    # What the import made stays out of the collector's sight: a program's collections (and its
    # end, 0.8 s of tearing down torch's objects otherwise) then do not walk or touch them.
    import gc
    gc.collect()
    gc.freeze()
    os.rename(partial, address)          # connections come only once it listens
    listener.settimeout(5.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)      # keepers are reaped by the kernel
    worker = os.getppid()
    while os.getppid() == worker:
        try:
            connection, _ = listener.accept()
        except socket.timeout:
            continue
        if os.fork() == 0:
            listener.close()
            connection.settimeout(None)
            return _keep(connection)
        connection.close()
    shutil.rmtree(os.path.dirname(address), ignore_errors=True)   # its worker was killed
    return None


def _imports_quietly() -> bool:
    """Import torch, as a program's first ``import torch`` would; False if that printed anything
    (a warning a fresh program would show its user), which the zygote cannot pass on."""
    with tempfile.TemporaryFile() as said:
        saved = [os.dup(1), os.dup(2)]
        os.dup2(said.fileno(), 1)
        os.dup2(said.fileno(), 2)
        try:
            import torch  # noqa: F401
            if not _import_libraries_torch_imports_later():
                return False
        except Exception:
            return False
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
        return os.fstat(said.fileno()).st_size == 0


def _import_libraries_torch_imports_later() -> bool:
    """Import those of ``_LIBRARIES_TORCH_IMPORTS_LATER`` that are installed; False where one
    imported a module of torch's, which a program would then find imported before cudashim
    activates (programs start afresh)."""
    import importlib
    torch_modules = {name for name in sys.modules if name.partition(".")[0] in _TorchAsNotYetImported.OWN}
    for library in _LIBRARIES_TORCH_IMPORTS_LATER:
        try:
            importlib.import_module(library)
        except ImportError:
            continue
    return {name for name in sys.modules if name.partition(".")[0] in _TorchAsNotYetImported.OWN} == torch_modules


def _keep(connection: socket.socket):
    """The keeper: read the request, fork the program, pass signals on, report how it ended."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    header, fds, _, _ = socket.recv_fds(connection, 8, 250)
    (length,) = struct.unpack("!Q", _exactly(connection, 8, header))
    request = json.loads(_exactly(connection, length, b""))
    reason = _why_fresh(request)
    if os.environ.get("TESTS_ZYGOTE_LOG"):
        with open(os.environ["TESTS_ZYGOTE_LOG"], "a") as log:
            log.write(f"{reason or 'forked'}: {request['args'][:4]}\n")
    if reason is not None:
        for fd in fds:
            os.close(fd)
        connection.sendall(b"fresh\n")
        os._exit(0)
    program = os.fork()
    if program == 0:
        return request, dict(zip(request["fds"], fds)), connection
    for fd in fds:
        os.close(fd)
    connection.sendall(b"started\n")
    os._exit(_report_end(connection, program))


def _exactly(connection, length: int, start: bytes) -> bytes:
    data = bytearray(start)
    while len(data) < length:
        chunk = connection.recv(length - len(data))
        if not chunk:
            os._exit(1)                 # the client went away
        data += chunk
    return bytes(data)


def _report_end(connection, program: int) -> int:
    """Wait for the program, killing its session should the client die; send how it ended."""
    import selectors
    ended = os.pidfd_open(program)
    events = selectors.DefaultSelector()
    events.register(connection, selectors.EVENT_READ)
    events.register(ended, selectors.EVENT_READ)
    pending = b""
    while True:
        for key, _ in events.select():
            if key.fileobj is connection:
                try:
                    data = connection.recv(256)
                except ConnectionResetError:          # it died before reading "started"
                    data = b""
                if not data:                          # killed: its program goes with it
                    _kill_session(program)
                    events.unregister(connection)
                    continue
                pending += data
                *numbers, pending = pending.split(b"\n")
                for number in numbers:
                    try:
                        os.kill(program, int(number))
                    except ProcessLookupError:
                        pass
            else:
                _, status = os.waitpid(program, 0)
                how = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                       else f"exit {os.WEXITSTATUS(status)}")
                try:
                    connection.sendall(f"{how}\n".encode())
                except OSError:
                    pass
                return 0


def _kill_session(program: int) -> None:
    try:
        os.killpg(program, signal.SIGKILL)
    except ProcessLookupError:          # it has not made its session yet
        try:
            os.kill(program, signal.SIGKILL)
        except ProcessLookupError:
            pass


# Options before the program that a forked one honours: -u (unbuffered standard streams, as
# torchrun starts its ranks) and -B (no bytecode written).
_HONOURED_OPTIONS = ("-u", "-B")


def _options(args: list) -> tuple:
    """(the honoured options before the program, the rest)."""
    count = 0
    while count < len(args) and args[count] in _HONOURED_OPTIONS:
        count += 1
    return set(args[:count]), args[count:]


def _why_fresh(request: dict):
    """Why the program must start in a fresh interpreter, or None."""
    _, args = _options(request["args"])
    if not args or (args[0].startswith("-") and args[0] not in ("-m", "-c")) or \
            (args[0] in ("-m", "-c") and len(args) < 2):
        return "interpreter options"
    if args[0] not in ("-m", "-c") and not os.path.isfile(os.path.join(request["cwd"], args[0])):
        return "not a script file"
    # the client's own function, run from its file: no module of the program's sys.modules
    import runpy
    namespaces = runpy.run_path(str(CLIENT))["namespaces"]
    if request["namespaces"] != namespaces():
        return "another network namespace or host name"   # a cluster node's, not the zygote's
    mine = os.environ
    theirs = request["env"]
    for name in set(mine) | set(theirs):
        if name.startswith(_READ_AT_START) and not name.startswith(_READ_LATER) and \
                mine.get(name) != theirs.get(name):
            return f"{name} differs"
    # (a __main__.py is the main module only where it is run: python -m PACKAGE)
    imported = {name.partition(".")[0] for name in sys.modules} - {"__main__", "__mp_main__"}
    for folder in _added_path(request):
        if not os.path.isdir(folder):
            if os.path.exists(folder):
                return f"{folder} is not a folder"
            continue
        entries = os.listdir(folder)
        shadowing = _module_names(folder, entries) & imported
        if shadowing:
            return f"{folder} holds {sorted(shadowing)}"
        if any(_declares_a_torch_backend(os.path.join(folder, entry)) for entry in entries):
            return f"{folder} installs a torch backend"
    return None


def _added_path(request: dict) -> list:
    """The folders a fresh interpreter would search before the zygote's own path."""
    return [_first_path_entry(request), *_pythonpath(request)]


def _pythonpath(request: dict) -> list:
    cwd = request["cwd"]
    return [os.path.join(cwd, entry) for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep)
            if entry]


def _first_path_entry(request: dict) -> str:
    kind, cwd = _options(request["args"])[1][0], request["cwd"]
    if kind in ("-m", "-c"):
        return cwd
    return os.path.dirname(os.path.realpath(os.path.join(cwd, kind)))


def _declares_a_torch_backend(distribution: str) -> bool:
    """Whether a distribution's metadata names a ``torch.backends`` entry point: torch imports
    those as it imports itself (its device-backend autoload)."""
    if not distribution.endswith((".dist-info", ".egg-info")):
        return False
    try:
        with open(os.path.join(distribution, "entry_points.txt")) as entry_points:
            return "[torch.backends]" in entry_points.read()
    except OSError:
        return False


def _start_dispositions(ignored: set) -> None:
    """Every signal as a fresh interpreter under the client's parent starts with it: ignored
    where the client started ignoring it, and as the interpreter sets it up (SIGPIPE and
    SIGXFSZ ignored, SIGINT raising KeyboardInterrupt unless ignored), the rest by default.
    The zygote's own handlers (its SIGCHLD) do not pass on."""
    for number in signal.valid_signals():
        if number in (signal.SIGKILL, signal.SIGSTOP):
            continue
        if number in ignored or number in (signal.SIGPIPE, getattr(signal, "SIGXFSZ", None)):
            disposition = signal.SIG_IGN
        elif number == signal.SIGINT:
            disposition = signal.default_int_handler
        else:
            disposition = signal.SIG_DFL
        try:
            signal.signal(number, disposition)
        except (OSError, ValueError):           # one the C library keeps for itself
            pass


def _module_names(folder: str, entries: list) -> set:
    names = set()
    for entry in entries:
        stem = entry.partition(".")[0]
        if entry.endswith((".py", ".pyc", ".so", ".pyd")) or \
                ("." not in entry and os.path.isdir(os.path.join(folder, entry))):
            names.add(stem)
    return names


# --- the forked program -------------------------------------------------------------------
def become(request: dict, fds: dict, connection: socket.socket, client: str):
    """Make this forked process what a fresh ``python ARGS`` would be, then run the program."""
    connection.close()
    os.setsid()                          # its own session: killed with its children at the end
    _take_files(fds)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _start_dispositions(set(request["ignored"]))
    options, args = _options(request["args"])
    _new_standard_streams(unbuffered="-u" in options or bool(os.environ.get("PYTHONUNBUFFERED")))
    sys.dont_write_bytecode = sys.dont_write_bytecode or "-B" in options
    sys.executable = client
    sys.orig_argv = [client, *request["args"]]
    base = sys.path[1:]                  # the zygote's own first entry is this folder
    sys.path[:] = [_first_path_entry(request) if args[0] not in ("-m", "-c") else
                   (os.getcwd() if args[0] == "-m" else ""), *_pythonpath(request), *base]
    import importlib
    importlib.invalidate_caches()
    _TorchAsNotYetImported.install()
    if any(os.path.isfile(os.path.join(folder, "sitecustomize.py")) for folder in _pythonpath(request)):
        import site
        site.execsitecustomize()
    _run(args)


class _TorchAsNotYetImported:
    """Torch's own modules out of ``sys.modules`` until the program first imports torch, when
    this finder hands them back whole: the program, and cudashim's launcher and start-up hook,
    find torch not imported yet, as in a fresh interpreter (cudashim's activation then waits
    for the import, its warnings name the program's ``import torch``, and what the program sets
    before it, CUDA_VISIBLE_DEVICES for one, is read). The libraries torch imports (numpy,
    pynvml, ...) stay imported."""

    OWN = ("torch", "torchgen")

    def __init__(self, modules: dict):
        self.modules = modules                       # name -> module, until handed back
        self.specs = {name: modules[name].__spec__ for name in self.OWN if name in modules}

    @classmethod
    def install(cls) -> None:
        modules = {name: module for name, module in sys.modules.items()
                   if name.partition(".")[0] in cls.OWN}
        for name in modules:
            del sys.modules[name]
        sys.meta_path.insert(0, cls(modules))

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.specs:
            return None
        import importlib.util
        return importlib.util.spec_from_loader(fullname, self, origin=self.specs[fullname].origin,
                                               is_package=True)

    def create_module(self, spec):
        return self.modules[spec.name]

    def exec_module(self, module):
        """The import system gave the module this finder's spec: it gets its own back, and its
        submodules return to ``sys.modules``."""
        top = module.__name__
        module.__spec__ = self.specs.pop(top)
        for name in [name for name in self.modules if name.partition(".")[0] == top]:
            sys.modules[name] = self.modules.pop(name)
        if not self.specs:
            sys.meta_path.remove(self)


def _take_files(fds: dict) -> None:
    """The client's descriptors at the client's numbers; its standard ones it lacked, closed."""
    import fcntl
    above = max(fds, default=2) + 1                   # out of the way of every target number
    high = {number: fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, above) for number, fd in fds.items()}
    for fd in fds.values():
        os.close(fd)
    for number, fd in high.items():
        os.dup2(fd, number)
        os.close(fd)
    for number in (0, 1, 2):
        if number not in fds:
            os.close(number)


def _new_standard_streams(unbuffered: bool) -> None:
    """sys.stdin, stdout and stderr on the descriptors the program got, made as Python makes
    them at start-up: stderr and a terminal line-buffered; with -u (or PYTHONUNBUFFERED) the
    writing ones unbuffered and every one written through."""
    import io
    streams = []
    for fd, old in ((0, sys.__stdin__), (1, sys.__stdout__), (2, sys.__stderr__)):
        try:
            os.fstat(fd)
        except OSError:
            streams.append(None)
            continue
        writing = fd != 0
        raw = io.open(fd, "wb" if writing else "rb", buffering=0 if unbuffered and writing else -1,
                      closefd=False)
        streams.append(io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors, newline="\n",
                                        line_buffering=not unbuffered and (fd == 2 or os.isatty(fd)),
                                        write_through=unbuffered))
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams


def _run(args: list) -> None:
    import builtins
    import importlib.machinery
    import runpy
    import types
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __annotations__={},
                         __loader__=importlib.machinery.BuiltinImporter)
    sys.modules["__main__"] = main
    if "__mp_main__" in sys.modules:     # multiprocessing names the main module so as it imports
        sys.modules["__mp_main__"] = main
    try:
        if args[0] == "-m":
            sys.argv = args[1:]
            runpy._run_module_as_main(args[1], alter_argv=True)
        elif args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            exec(compile(args[1], "<string>", "exec", dont_inherit=True), main.__dict__)
        else:
            path = os.path.abspath(args[0])
            sys.argv = list(args)
            main.__dict__.update(__file__=path, __cached__=None,
                                 __loader__=importlib.machinery.SourceFileLoader("__main__", path))
            with open(path, "rb") as source:
                code = compile(source.read(), path, "exec", dont_inherit=True)
            exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as error:
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == _run.__code__.co_filename:
            tb = tb.tb_next
        sys.excepthook(type(error), error.with_traceback(tb), tb)
        if isinstance(error, KeyboardInterrupt):    # python's own end: death by SIGINT
            import atexit
            atexit._run_exitfuncs()
            sys.stdout.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        raise SystemExit(1)


if __name__ == "__main__":
    _forked = serve(sys.argv[1])
    if _forked is not None:
        _request, _fds, _connection = _forked
        _client = str(Path(sys.argv[1]).parent / "bin" / "python")
        del _forked
        become(_request, _fds, _connection, _client)
