"""The command line: ``python -m cudashim ...`` and the ``cudashim`` command.

    python -m cudashim [options] script.py args...     (also -m module, -c code)
    cudashim run [options] script.py args...           (the same)
    cudashim doctor [--backend NAME]                   (what cudashim sees here)
    cudashim image-env [--backend NAME ...]            (the lines that shim every Python in an image)
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from . import __version__, _settings, backends

_VALUE_OPTIONS = {"--backend", "--device-count", "--collective", "--report-json", "--honest", "--unsupported"}


def _add_setting_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", metavar="NAME",
                        help=f"target backend: auto (default), {', '.join(backends.names())} "
                             f"[{_settings.ENV_BACKEND}]")
    parser.add_argument("--device-count", type=int, metavar="N",
                        help=f"virtual CUDA devices on the CPU backend [{_settings.ENV_DEVICE_COUNT}]")
    parser.add_argument("--collective", metavar="LIBRARY",
                        help=f"the torch.distributed backend NCCL becomes (default: the "
                             f"backend's own) [{_settings.ENV_COLLECTIVE}]")
    parser.add_argument("--report", action="store_true", default=None,
                        help=f"print at exit which CUDA APIs ran and what each became [{_settings.ENV_REPORT}]")
    parser.add_argument("--report-json", metavar="PATH",
                        help=f"also write the report as JSON (per rank) [{_settings.ENV_REPORT_JSON}]")
    parser.add_argument("--honest", metavar="Q[,Q]",
                        help=f"answer these truthfully: {', '.join(_settings.HONEST_QUESTIONS)} "
                             f"[{_settings.ENV_HONEST}]")
    parser.add_argument("--unsupported", choices=_settings.UNSUPPORTED_POLICIES,
                        help=f"raise for unsupported CUDA APIs, or warn once and do nothing for "
                             f"harmless ones (nvtx, profiler ranges) [{_settings.ENV_UNSUPPORTED}]")


def run_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Run an unmodified CUDA PyTorch program on the accelerator this "
                               "machine has (or its CPU).")
    parser.add_argument("--version", action="version", version=f"cudashim {__version__}")
    _add_setting_options(parser)
    program = parser.add_mutually_exclusive_group()
    program.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script")
    program.add_argument("-c", dest="code", metavar="CODE", help="run the program passed as a string")
    parser.add_argument("script", nargs="?", help="the program file; its arguments follow it")
    return parser


def split_program(argv: List[str]):
    """Split argv at the program: (cudashim's options and the program, the program's args)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-m", "-c"):
            return argv[:i + 2], argv[i + 2:]
        if arg.startswith(("-m", "-c")) and not arg.startswith("--"):
            return argv[:i] + [arg[:2], arg[2:]], argv[i + 1:]      # python's -mjson.tool
        if arg == "--":
            return argv[:i] + argv[i + 1:i + 2], argv[i + 2:]
        if arg.startswith("-"):
            i += 2 if (arg in _VALUE_OPTIONS and "=" not in arg) else 1
            continue
        return argv[:i + 1], argv[i + 1:]
    return argv, []


def run_main(argv: Optional[List[str]] = None, prog: str = "python -m cudashim") -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = run_parser(prog)
    own, program_args = split_program(argv)
    ns = parser.parse_args(own)
    if ns.script is None and ns.module is None and ns.code is None:
        parser.error("no program given: name a script, -m MODULE or -c CODE")
    settings = _load_settings(parser, ns)

    from . import launcher
    if ns.script is not None:
        launcher.check_script(ns.script)
    launcher.export_to_children(settings)
    _activate(settings)
    if ns.code is not None:
        launcher.run("code", ns.code, program_args)
    elif ns.module is not None:
        launcher.run("module", ns.module, program_args)
    else:
        launcher.run("script", ns.script, program_args)


def _load_settings(parser, ns):
    try:
        fields = _settings.Settings().as_kwargs()
        settings = _settings.load(**{name: getattr(ns, name) for name in fields})
        backends.check_name(settings.backend)
    except ValueError as exc:
        parser.error(str(exc))
    return settings


def _activate(settings) -> None:
    import torch  # noqa: F401  (the backend is resolved now, so a bad one fails here, status 2)

    from . import activation
    from .errors import BackendUnavailableError
    try:
        activation.activate(**settings.as_kwargs())
    except BackendUnavailableError as exc:
        sys.stderr.write(f"cudashim: error: {exc}\n")
        raise SystemExit(2) from None


def main(argv: Optional[List[str]] = None) -> None:
    """The ``cudashim`` console command."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="cudashim", description="Run CUDA PyTorch programs anywhere.")
    parser.add_argument("--version", action="version", version=f"cudashim {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="{run,doctor,image-env}")
    commands.add_parser("run", add_help=False, help="run a program (same as python -m cudashim)")
    doctor = commands.add_parser("doctor", help="show what cudashim sees here and self-check it")
    _add_setting_options(doctor)
    image_env = commands.add_parser("image-env", help="print the environment that shims every Python "
                                                      "started with it (for a container image)")
    _add_setting_options(image_env)
    if argv[:1] == ["run"]:
        return run_main(argv[1:], prog="cudashim run")
    ns = parser.parse_args(argv)
    if ns.command is None:
        parser.print_help()
        raise SystemExit(2)
    settings = _load_settings(doctor if ns.command == "doctor" else image_env, ns)
    if ns.command == "image-env":
        from . import launcher
        for name, value in launcher.child_environment(settings, existing_pythonpath="").items():
            print(f"{name}={value}")
        return None
    from .doctor import doctor as run_doctor
    raise SystemExit(run_doctor(settings))
