"""What a test's ``python ...`` runs while the suite's zygote is up (tests/zygote.py): it hands its
command line, environment, working folder and open files to the zygote, which forks the program
from an interpreter that has imported torch already, and then stands for that program: it passes
on the signals it gets and ends as the program ends (its status, or death by its signal).

Where the zygote cannot run the program as a fresh interpreter would (options before the program,
a variable torch reads while it imports, a folder on PYTHONPATH that shadows a module it imported)
or is not there, this becomes the real interpreter (exec), so the program runs exactly as typed.

Run as ``python -I -S zygote_client.py SOCKET REAL_PYTHON ARGS...``: standard library only.
"""

import json
import os
import signal
import socket
import struct
import sys

# The signals a program's parent may send it to stop or poke it; each reaches the program.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGALRM)


def main(address: str, real_python: str, args: list) -> None:
    connection = _connect(_this_hosts_zygote(address))
    if connection is None:
        _become_the_real_interpreter(real_python, args)
    # What this process's parent made it ignore (nohup, a background job of a script), read
    # before anything here sets a handler: a fresh interpreter starts ignoring the same.
    ignored = inherited_ignored()
    # From here a signal is the program's: held until the keeper says it runs, then passed on.
    forwarding = _Forwarding(connection, ignored)
    with connection:
        files = _open_files(except_fd=connection.fileno())
        request = json.dumps({"args": args, "env": dict(os.environ), "cwd": os.getcwd(),
                              "fds": files, "ignored": ignored, "namespaces": namespaces()}).encode()
        socket.send_fds(connection, [struct.pack("!Q", len(request))], files)
        connection.sendall(request)
        replies = connection.makefile("rb")
        if replies.readline() != b"started\n":       # "fresh", or the zygote went away
            connection.close()
            forwarding.stop()
            _become_the_real_interpreter(real_python, args)
        forwarding.start()
        how, _, value = replies.readline().decode().partition(" ")
    if how == "exit":
        os._exit(int(value))
    number = int(value) if how == "signal" else signal.SIGKILL    # "": the zygote was killed
    _die_by(number)


def namespaces() -> dict:
    """Where this process lives: its network namespace and host name (a cluster node's, for one:
    tests/cluster.py), which a program forked from a zygote elsewhere would not share."""
    try:
        network = os.readlink("/proc/self/ns/net")
    except OSError:
        network = None
    return {"network": network, "host name": os.uname().nodename}


def inherited_ignored() -> list:
    """The signals this interpreter started with ignored, as its parent left them; SIGPIPE and
    SIGXFSZ are left out: every interpreter ignores those itself."""
    own = (signal.SIGKILL, signal.SIGSTOP, signal.SIGPIPE, getattr(signal, "SIGXFSZ", None))
    return sorted(int(number) for number in signal.valid_signals()
                  if number not in own and signal.getsignal(number) is signal.SIG_IGN)


class _Forwarding:
    """The signals this process gets, passed on to the program over the connection; those that
    come before the program runs are held until it does. A signal the program starts ignoring
    stays ignored here: passed on, it would do nothing there either."""

    def __init__(self, connection, ignored):
        self.connection = connection
        self.held = []
        self.running = False
        self.forwarded = [number for number in FORWARDED if number not in ignored]
        for number in self.forwarded:
            signal.signal(number, self._received)

    def _received(self, number, _frame):
        if self.running:
            self.connection.sendall(b"%d\n" % number)
        else:
            self.held.append(number)

    def start(self):
        self.running = True
        for number in self.held:
            self.connection.sendall(b"%d\n" % number)

    def stop(self):
        """No program here after all: a signal held is this process's, as it would have been."""
        for number in self.forwarded:
            signal.signal(number, signal.SIG_DFL)
        if self.held:
            _die_by(self.held[0])


def _die_by(number: int) -> None:
    if number not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
    os._exit(128 + number)


def _this_hosts_zygote(address: str) -> str:
    """The socket of the zygote on this host: the one named, unless its folder names another
    zygote for this host name (a cluster node's, reached by pdsh with another node's client)."""
    try:
        with open(os.path.join(os.path.dirname(address), "hosts.json")) as listing:
            hosts = json.load(listing)
    except (OSError, ValueError):
        return address
    return hosts.get(os.uname().nodename, address)


def _connect(address: str):
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(address)
    except OSError:                     # not started yet, or gone
        connection.close()
        return None
    return connection


def _open_files(except_fd: int) -> list:
    """The descriptors this process inherited (stdio, and what a parent passed on)."""
    numbers = []
    for name in os.listdir("/proc/self/fd"):
        number = int(name)
        if number == except_fd:
            continue
        try:
            os.fstat(number)            # the listing's own descriptor is closed by now
        except OSError:
            continue
        numbers.append(number)
    return sorted(numbers)


def _become_the_real_interpreter(real_python: str, args: list) -> None:
    os.execv(real_python, [real_python, *args])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
