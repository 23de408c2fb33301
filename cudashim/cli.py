"""The command line: ``python -m cudashim ...`` and the ``cudashim`` command.

    python -m cudashim [options] script.py args...     (also -m module, -c code)
    cudashim run [options] script.py args...           (the same)
    cudashim doctor [--backend NAME] [--kernels | --fast-path] (what cudashim sees here)
    cudashim image-env [--dockerfile] [--backend NAME ...] (the lines that shim every Python in an image)
    cudashim scan [PATH ...] [--backend NAME] [--format text|json|sarif] [--explain RULE]
                                                       (what will carry over, read before running)
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from . import __version__, _settings, backends

# python's own options, which the launcher takes as python does (``python -m cudashim -O -W
# error train.py``). Most act only as the interpreter starts, so the launcher starts python
# again with them: flags python counts (-OO, -vv), then the two that take a value.
_PYTHON_FLAGS = "bBdEiIOPqRsSuvx"
_PYTHON_VALUES = {"-W": "warning control, as python's -W", "-X": "implementation option, as python's -X"}

# Options that take a value, so that split_program() steps over it.
_VALUE_OPTIONS = {option.flag for option in _settings.OPTIONS if option.metavar or option.choices} \
    | set(_PYTHON_VALUES)


def _add_setting_options(parser: argparse.ArgumentParser) -> None:
    """One command-line option per setting, derived from the settings table."""
    for option in _settings.OPTIONS:
        help_text = f"{option.help} [{option.env}]"
        if option.name == "backend":
            help_text = f"target backend: auto (default), {', '.join(backends.built_in())} [{option.env}]"
        if option.metavar is None and option.choices is None:
            parser.add_argument(option.flag, dest=option.name, action="store_true", default=None,
                                help=help_text)
        else:
            parser.add_argument(option.flag, dest=option.name, metavar=option.metavar,
                                choices=option.choices, help=help_text)


def run_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Run an unmodified CUDA PyTorch program on the accelerator this "
                               "machine has (or its CPU).")
    parser.add_argument("--version", action="version", version=f"cudashim {__version__}")
    _add_setting_options(parser)
    python_options = parser.add_argument_group(
        "python's options", f"-{' -'.join(_PYTHON_FLAGS)}, -W ARG and -X OPT mean what they mean to python")
    for flag in _PYTHON_FLAGS:
        python_options.add_argument(f"-{flag}", action="count", dest=f"python_{flag}", help=argparse.SUPPRESS)
    for flag, help_text in _PYTHON_VALUES.items():
        python_options.add_argument(flag, action="append", dest=f"python_{flag[1]}", metavar="ARG",
                                    help=argparse.SUPPRESS)
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
    interpreter_options = _python_options(ns)
    if interpreter_options:                    # the settings travel in the environment
        program = ["-m", ns.module] if ns.module is not None else \
            ["-c", ns.code] if ns.code is not None else [ns.script]
        os.execv(sys.executable, [sys.executable, *interpreter_options, "-m", "cudashim",
                                  *program, *program_args])
    _activate(settings)
    if ns.code is not None:
        launcher.run("code", ns.code, program_args)
    elif ns.module is not None:
        launcher.run("module", ns.module, program_args)
    else:
        launcher.run("script", ns.script, program_args)


def _python_options(ns) -> List[str]:
    """python's own options as given, in python's spelling."""
    options = [f"-{flag * getattr(ns, f'python_{flag}')}" for flag in _PYTHON_FLAGS
               if getattr(ns, f"python_{flag}")]
    for flag in _PYTHON_VALUES:
        for value in getattr(ns, f"python_{flag[1]}") or ():
            options += [flag, value]
    return options


def _load_settings(parser, ns):
    try:
        return _settings.load(**{option.name: getattr(ns, option.name) for option in _settings.OPTIONS})
    except ValueError as exc:                  # an unknown backend is a ValueError too
        parser.error(str(exc))


def _activate(settings) -> None:
    import torch  # noqa: F401  (the backend is resolved now, so a bad one fails here, status 2)

    from . import activation
    from .errors import BackendUnavailableError, ReportPathError
    try:
        activation.activate(settings=settings)
    except (BackendUnavailableError, ReportPathError) as exc:
        sys.stderr.write(f"cudashim: error: {exc}\n")
        raise SystemExit(2) from None


def main(argv: Optional[List[str]] = None) -> None:
    """The ``cudashim`` console command."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="cudashim", description="Run CUDA PyTorch programs anywhere.")
    parser.add_argument("--version", action="version", version=f"cudashim {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="{run,doctor,image-env,scan}")
    commands.add_parser("run", add_help=False, help="run a program (same as python -m cudashim)")
    doctor = commands.add_parser("doctor", help="show what cudashim sees here and self-check it")
    doctor.add_argument("--kernels", action="store_true",
                        help="list the dtypes CUDA kernels take and the target's refuse, and how "
                             "cudashim computes them")
    doctor.add_argument("--fast-path", action="store_true",
                        help="print only whether the compiled fast path runs, and what its absence costs")
    _add_setting_options(doctor)
    image_env = commands.add_parser("image-env", help="print the environment that shims every Python "
                                                      "started with it (for a container image)")
    image_env.add_argument("--dockerfile", action="store_true",
                           help="print Dockerfile ENV lines instead of NAME=value lines "
                                "(the format of docker run --env-file)")
    _add_setting_options(image_env)
    scan = commands.add_parser(
        "scan", help="read Python sources and report every CUDA usage: handled, needs a change, "
                     "cannot run here, or runs differently (exit status 1 when something blocks "
                     "the run, 2 on bad input)")
    scan.add_argument("paths", nargs="*", default=["."], metavar="PATH",
                      help="files or folders (default: the current folder)")
    scan.add_argument("--backend",
                      help=f"classify for this target: auto (this machine's, the default), "
                           f"{', '.join(backends.built_in())} [{_settings.BY_NAME['backend'].env}]")
    scan.add_argument("--device-count", type=int, metavar="N",
                      help="the CUDA devices the run will see, as `python -m cudashim "
                           "--device-count N` (default: the run's own default)")
    scan.add_argument("--format", choices=("text", "json", "sarif"), default=None,
                      help="text (the default), json (stable: its 'format' key versions it), or "
                           "sarif (SARIF 2.1.0, for code-scanning services)")
    scan.add_argument("--json", action="store_true", help="the same as --format json")
    scan.add_argument("--explain", metavar="RULE",
                      help="print what a rule (its id, CS201, or name) means and what decides it")
    if argv[:1] == ["run"]:
        return run_main(argv[1:], prog="cudashim run")
    ns = parser.parse_args(argv)
    if ns.command is None:
        parser.print_help()
        raise SystemExit(2)
    if ns.command == "scan":
        raise SystemExit(_scan(scan, ns))
    settings = _load_settings(doctor if ns.command == "doctor" else image_env, ns)
    if ns.command == "image-env":
        from . import launcher
        for name, value in launcher.image_environment(settings).items():
            print(f"ENV {name}={_dockerfile_quoted(value)}" if ns.dockerfile else f"{name}={value}")
        return None
    if ns.fast_path:
        from . import speedups
        print(speedups.fast_path(settings))
        return None
    from .doctor import doctor as run_doctor
    from .doctor import kernel_gaps
    raise SystemExit(kernel_gaps(settings) if ns.kernels else run_doctor(settings))


def _dockerfile_quoted(value: str) -> str:
    """A value as a Dockerfile ENV line reads it back: quoted where it holds spaces or quotes."""
    if not any(c.isspace() or c in "\"'\\$" for c in value):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


def _scan(parser, ns) -> int:
    from .scan import output, scan

    try:
        backend = _settings.load(backend=ns.backend).backend   # the option, else the variable
    except ValueError as exc:                                  # an unknown backend is one too
        parser.error(str(exc))
    if ns.explain:
        try:
            sys.stdout.write(output.explain(ns.explain))
        except KeyError as exc:
            parser.error(exc.args[0])
        return 0
    if ns.device_count is not None and ns.device_count < 0:
        parser.error(f"--device-count {ns.device_count}: the device count cannot be negative")
    format = "json" if ns.json else ns.format or "text"
    progress = _progress_line if sys.stderr.isatty() and format == "text" else None
    result = scan(ns.paths, backend=backend, progress=progress, device_count=ns.device_count)
    if progress is not None:
        sys.stderr.write("\r\033[K")
    write = {"text": output.as_text, "json": output.as_json, "sarif": output.as_sarif}[format]
    sys.stdout.write(write(result))
    return result.exit_status


def _progress_line(done: int, known: int) -> None:
    """One line on the terminal, rewritten, while a long scan runs."""
    if done % 25 == 0:
        sys.stderr.write(f"\rcudashim scan: {done}/{known} files")
        sys.stderr.flush()
