"""Reading one file: every CUDA usage in its syntax tree, classified for a target.

The file is parsed, never imported. Names are followed through the file's imports
(``import torch as th``, ``from torch import cuda``, ``from torch.cuda.amp import autocast``),
and, within one function, through assignments of devices and of strings made from devices
(``dev = x.device`` then ``dev.type == "cuda"``; ``name = str(dev)`` then
``name.startswith("cuda")``).

What the runtime redirects is classified by ``target.Target``, from the runtime's tables.
What it cannot redirect is a string compare against the real device (the one class of CUDA
assumption that is plain Python, out of any shim's reach), and native CUDA code
(``libraries.py``).
"""

from __future__ import annotations

# The version answers cudashim gives the program (cudashim/cuda_build.py), by name.
VERSION_ANSWERS = {
    "torch.backends.cudnn.version": "the cuDNN torch's wheels of that CUDA line ship (never None)",
    "torch.backends.cudnn.is_available": "True",
    "torch.backends.cuda.is_built": "True",
}

import ast
import copy
import functools
import re
from typing import Callable, Dict, List, Optional, Tuple

from .. import substitutes
from ..patches import _nccl_environment as nccl_environment, extensions, frameworks
from . import libraries
from .findings import CANNOT_RUN, HANDLED, NEEDS_CHANGE, Finding
from .target import Target

# String methods whose result still carries the device's name (``str(d).split(":")[0]``).
_STRING_METHODS = frozenset({"split", "rsplit", "partition", "rpartition", "lower", "upper",
                             "strip", "lstrip", "rstrip", "replace", "casefold"})
# Methods that test a string for the device's name (``str(d).startswith("cuda")``).
_STRING_TESTS = frozenset({"startswith", "endswith", "find", "index", "count", "__contains__"})
_COMPARISONS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)
_NEGATIONS = (ast.NotEq, ast.NotIn, ast.IsNot)
# A device spec built from an index: "cuda:%d" % rank, "cuda:{}".format(rank).
_DEVICE_TEMPLATE = re.compile(r"cuda:(\{[^{}]*\}|%[dis])")
_DEVICE_OBJECT, _DEVICE_STRING, _OTHER = "device", "device string", "other"


@functools.lru_cache(maxsize=4096)
def cuda_device(text: str) -> Optional[Tuple[str, Optional[int]]]:
    """(spec, index) when ``text`` parses as a CUDA device with torch's own parser."""
    if not text.startswith("cuda") or len(text) > 16:
        return None
    import torch
    try:
        device = torch.device(text)
    except RuntimeError:
        return None
    return (text, device.index) if device.type == "cuda" else None


def process_group_spec(text: str) -> bool:
    """Whether ``text`` names NCCL as a process-group backend ("nccl", "cpu:gloo,cuda:nccl")."""
    if "nccl" not in text or len(text) > 40:
        return False
    return any(part.rpartition(":")[2].strip() == "nccl" for part in text.split(","))


class FileScanner(ast.NodeVisitor):
    """Collects the findings of one parsed file."""

    def __init__(self, path: str, source: str, target: Target,
                 is_local: Callable[[Optional[str], int], bool]):
        self.path, self.target, self.is_local = path, target, is_local
        self.lines = source.splitlines()
        self.findings: List[Finding] = []
        self.imports: Dict[str, str] = {}          # local name -> qualified name
        self.import_statements: List[ast.AST] = []
        self.scopes: List[Dict[str, Tuple[str, Optional[ast.expr]]]] = [{}]
        self.torch_name = "torch"

    def scan(self, tree: ast.AST) -> List[Finding]:
        self._collect_imports(tree)
        self.visit(tree)
        return self.findings

    # --- names --------------------------------------------------------------------------
    def _collect_imports(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.import_statements.append(node)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.imports[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        self.imports[top] = top
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        self.torch_name = next((name for name, full in self.imports.items() if full == "torch"),
                               "torch")

    def qualify(self, node: ast.AST) -> Optional[str]:
        """The dotted name an expression stands for through the imports, or None."""
        if isinstance(node, ast.Name):
            return self.imports.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.qualify(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def _tracked(self, name: str):
        for scope in (self.scopes[-1], self.scopes[0]):
            if name in scope:
                return scope[name]
        return None

    def _device_object(self, node: ast.AST) -> bool:
        """Whether ``node`` is, as far as the file shows, a torch.device."""
        if isinstance(node, ast.Call):
            return self.qualify(node.func) == "torch.device"
        if isinstance(node, ast.Attribute) and node.attr == "device":
            return True
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        if name is None:
            return False
        tracked = self._tracked(name) if isinstance(node, ast.Name) else None
        if tracked is not None:
            return tracked[0] == _DEVICE_OBJECT
        return name == "dev" or "device" in name.lower()

    def _device_string(self, node: ast.AST) -> Optional[ast.AST]:
        """The device a string expression was made from (``x.device.type``, ``str(dev)``), or None."""
        if isinstance(node, ast.Attribute) and node.attr == "type":
            return node.value
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in ("str", "repr", "format") and node.args:
                return node.args[0] if self._device_object(node.args[0]) else None
            if isinstance(func, ast.Attribute) and func.attr in _STRING_METHODS:
                return self._device_string(func.value)
        if isinstance(node, ast.Subscript):
            return self._device_string(node.value)
        if isinstance(node, ast.JoinedStr):
            for value in node.values:
                if isinstance(value, ast.FormattedValue) and self._device_object(value.value):
                    return value.value
        if isinstance(node, ast.Name):
            tracked = self._tracked(node.id)
            if tracked is not None and tracked[0] == _DEVICE_STRING:
                return tracked[1]
        return None

    # --- findings -----------------------------------------------------------------------
    def _add(self, node: ast.AST, verdict: Tuple[str, str, Optional[str]]) -> None:
        kind, what, fix = verdict
        line = getattr(node, "lineno", 1)
        code = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        self.findings.append(Finding(self.path, line, getattr(node, "col_offset", 0) + 1,
                                     code[:160], kind, what, fix))

    def _native_or(self, language: str, verdict):
        return (HANDLED, f"native {language.upper() if language == 'cuda' else language} code, "
                         f"compiled for the {self.target.device_type} device", None) \
            if self.target.runs(language) else verdict

    # --- scopes and assignments ---------------------------------------------------------
    def visit_FunctionDef(self, node):
        self._kernel_decorators(node)
        self.scopes.append({})
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self.scopes.append({})
        self.generic_visit(node)
        self.scopes.pop()

    def visit_Assign(self, node):
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)
            if isinstance(target, ast.Name):
                self._remember(target.id, node.value)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)
            if isinstance(node.target, ast.Name):
                self._remember(node.target.id, node.value)

    def _remember(self, name: str, value: ast.AST) -> None:
        if self._device_object(value):
            self.scopes[-1][name] = (_DEVICE_OBJECT, value)
        else:
            source = self._device_string(value)
            self.scopes[-1][name] = (_DEVICE_STRING, source) if source is not None else (_OTHER, None)

    def visit_Expr(self, node):
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return                                          # a docstring
        self.generic_visit(node)

    # --- imports --------------------------------------------------------------------------
    def visit_Import(self, node):
        for alias in node.names:
            if not self.is_local(alias.name, 0):
                self._library(node, alias.name)

    def visit_ImportFrom(self, node):
        if node.level or not node.module or self.is_local(node.module, 0):
            return
        if self._library(node, node.module):
            return
        for alias in node.names:
            full = f"{node.module}.{alias.name}"
            if self._library(node, full):
                return
            if full.startswith("torch.cuda.") or full == "torch.utils.cpp_extension.CUDA_HOME":
                self._qualified(node, full)

    def _library(self, node, module: str) -> bool:
        stand_in = substitutes.library_of(module)
        if stand_in is not None and substitutes.provides(module) and not self.target.runs("cuda"):
            self._add(node, (HANDLED, f"imports {module}: substituted, cudashim serves its stand-in "
                                      f"on torch operations where the real {stand_in.name} "
                                      f"cannot work, even where something imported it before "
                                      f"cudashim activated", None))
            return True
        found = libraries.cuda_only_library(module)
        if found is None:
            return False
        name, what, way_out = found
        self._add(node, self._native_or("cuda", (CANNOT_RUN, f"imports {name}: {what}", way_out)))
        return True

    def _kernel_decorators(self, node) -> None:
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            qualified = self.qualify(target) or ""
            for prefix, language in libraries.KERNEL_DECORATORS.items():
                if qualified.startswith(prefix):
                    self._add(decorator, self._native_or(language, (
                        CANNOT_RUN, f"a {language} kernel ('{node.name}') compiled for NVIDIA GPUs",
                        libraries.KERNEL_WAY_OUT)))
                    return

    # --- names the runtime redirects -----------------------------------------------------
    def visit_Attribute(self, node):
        qualified = self.qualify(node)
        if qualified is not None:
            self._qualified(node, qualified)
            return                                          # a dotted name: nothing inside
        if node.attr == "is_cuda":
            self._add(node, (HANDLED, f"True for tensors on the {self.target.device_type} device"
                                      if self.target.redirects else "native CUDA", None))
        self.generic_visit(node)

    def _qualified(self, node, name: str) -> None:
        target = self.target
        if name == "torch.cuda" or name.startswith("torch.cuda."):
            kind, what, fix = target.cuda_name(name)
            self._add(node, (kind, f"{name}: {what}", fix))
        elif name.startswith(("torch.backends.cuda.", "torch.backends.cudnn.")) \
                and name.endswith(("allow_tf32", "fp32_precision")):
            self._add(node, (HANDLED, "a TF32 flag: it turns the target's reduced-precision float32 "
                                      "matmul on and off where it has one (--tf32)"
                                      if target.redirects else "native CUDA", None))
        elif name in VERSION_ANSWERS:
            self._add(node, (HANDLED, f"{name}(): {VERSION_ANSWERS[name]}, from the CUDA build the "
                                      "program hears (--cuda-version), which torch.version.cuda, "
                                      "NCCL's and NVML's versions agree with"
                                      if target.redirects else "native CUDA", None))
        elif name.startswith(("torch.backends.cuda.", "torch.backends.cudnn.")):
            self._add(node, (HANDLED, "a CUDA library flag: setting it is harmless where it does "
                                      "not apply" if target.redirects else "native CUDA", None))
        elif name == "torch.version.cuda":
            self._add(node, (HANDLED, "the CUDA version cudashim's callers hear (--cuda-version)"
                                      if target.redirects else "native CUDA", None))
        elif name.startswith("torch.distributed.") and name.endswith(".NCCL"):
            self._add(node, target.process_group("nccl"))
        elif name == "torch.utils.cpp_extension.CUDA_HOME":
            self._add(node, (NEEDS_CHANGE, "the CUDA toolkit's location, which the target does "
                                           "not have", "build without the CUDA toolkit"))

    # --- calls ------------------------------------------------------------------------------
    def visit_Call(self, node):
        func = node.func
        qualified = self.qualify(func) or ""
        builder = qualified.rpartition(".")[2]
        if qualified == f"{extensions.MODULE}.{builder}" and builder in extensions.BUILDERS:
            self._extension(node, builder)
        elif qualified.startswith("ctypes") and self._loaded_library(node):
            return                                          # its argument is this finding
        elif qualified in frameworks.ENTRY_POINTS:
            framework = frameworks.ENTRY_POINTS[qualified]
            keyword = frameworks.DEVICE_KEYWORDS.get(framework)
            choice = next((_literal(k.value) for k in node.keywords if k.arg == keyword), None) if keyword else None
            verdict = self.target.framework_call(framework, choice if isinstance(choice, (str, bool)) else None)
            if verdict is not None:
                self._add(node, verdict)
        elif isinstance(func, ast.Attribute) and func.attr == "cuda" and not qualified:
            self._add(func, (HANDLED, f".cuda() moves to the {self.target.device_type} device"
                                      if self.target.redirects else "native CUDA", None))
        elif isinstance(func, ast.Attribute) and func.attr in _STRING_TESTS and node.args:
            literal = self._cuda_literal(node.args[0])
            device = self._device_string(func.value) if literal else None
            if device is not None:
                self._string_compare(node, device, literal, negated=False, substring=True)
                self.visit(func.value)
                return
        self.generic_visit(node)

    def _extension(self, node, builder: str) -> None:
        import inspect

        import torch.utils.cpp_extension as cpp_extension

        parameters = list(inspect.signature(getattr(cpp_extension, builder)).parameters)
        arguments = {}
        for parameter, value in zip(parameters, node.args):
            if not isinstance(value, ast.Starred):
                arguments[parameter] = _literal(value)
        arguments.update((k.arg, _literal(k.value)) for k in node.keywords if k.arg)
        sources = extensions.cuda_sources(builder, arguments)
        if sources is not None:
            self._add(node, self._native_or("cuda", (
                CANNOT_RUN, f"builds a CUDA C++ extension ({', '.join(sources)}); under cudashim "
                            f"{builder}() raises UnsupportedCudaAPI",
                extensions.way_out(self.target))))

    def _loaded_library(self, node) -> bool:
        for argument in node.args:
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                library = libraries.cuda_library_file(argument.value, bare_names=True)
                if library is not None:
                    self._add(node, self._native_or("cuda", (
                        CANNOT_RUN, f"loads the CUDA library '{library}' by hand",
                        "call the torch API the library call stands for (torch.cuda, which "
                        "cudashim redirects)")))
                    return True
        return False

    # --- comparisons with the real device ----------------------------------------------------
    def _cuda_literal(self, node) -> Optional[str]:
        """The CUDA device spec ``node`` is, or holds (in a tuple, list or set), or None."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value if cuda_device(node.value) else None
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return next((found for found in map(self._cuda_literal, node.elts) if found), None)
        return None

    def visit_Compare(self, node):
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands, operands[1:]):
            if not isinstance(op, _COMPARISONS):
                continue
            for literal_side, other in ((right, left), (left, right)):
                literal = self._cuda_literal(literal_side)
                device = self._device_string(other) if literal else None
                if device is not None:
                    substring = isinstance(op, (ast.In, ast.NotIn)) and literal_side is left
                    self._string_compare(node, device, literal, isinstance(op, _NEGATIONS), substring)
                    break
        for operand in operands:                # a literal compared is no device argument
            if self._cuda_literal(operand) is None:
                self.visit(operand)

    def visit_Match(self, node):                 # match dev.type: case "cuda": ...
        device = self._device_string(node.subject)
        for case in node.cases if device is not None else ():
            pattern = case.pattern
            values = pattern.patterns if isinstance(pattern, ast.MatchOr) else [pattern]
            if any(isinstance(value, ast.MatchValue) and self._cuda_literal(value.value)
                   for value in values):
                self._add(pattern, self._string_match(device))
        self.visit(node.subject)
        for case in node.cases:                 # patterns are compared, not device arguments
            for part in (case.guard, *case.body):
                if part is not None:
                    self.visit(part)

    def _string_match(self, device):
        if not self.target.redirects:
            return HANDLED, "native CUDA", None
        test = (f"{ast.unparse(device.value)}.is_cuda"
                if isinstance(device, ast.Attribute) and device.attr == "device"
                else f"{ast.unparse(device)}.type == {self.torch_name}.device('cuda').type")
        return (NEEDS_CHANGE, f"matches the device's name against 'cuda'; at run time it is "
                              f"'{self.target.device_type}' on the '{self.target.name}' target",
                f"test `if {test}:` before the match")

    def _string_compare(self, node, device, literal: str, negated: bool, substring: bool) -> None:
        target = self.target
        if not target.redirects:
            self._add(node, (HANDLED, "native CUDA", None))
            return
        what = (f"compares the device's name with {literal!r} as a string: at run time the device "
                f"is the real one ('{target.device_type}' on the '{target.name}' target), so the "
                f"test no longer sees CUDA")
        if isinstance(device, ast.Attribute) and device.attr == "device" and literal == "cuda" \
                and (substring or isinstance(node, ast.Call) or isinstance(node, ast.Compare)
                     and _simple_equality(node)):
            fix = f"{'not ' if negated else ''}{ast.unparse(device.value)}.is_cuda"
        else:
            stand_in = (f'{self.torch_name}.device("cuda").type' if literal == "cuda"
                        else f'str({self.torch_name}.device("{literal}"))')
            fix = ast.unparse(_ReplaceLiteral(literal, stand_in).visit(copy.deepcopy(node)))
        self._add(node, (NEEDS_CHANGE, what, fix))

    # --- strings the runtime reads ------------------------------------------------------------
    def visit_JoinedStr(self, node):
        head = node.values[0] if node.values else None
        if isinstance(head, ast.Constant) and head.value == "cuda:" and len(node.values) == 2:
            index = "{" + ast.unparse(node.values[1].value) + "}"
            self._add(node, self.target.device(f"cuda:{index}", index))
            return                                          # f"cuda:{rank}"
        self.generic_visit(node)

    def visit_Constant(self, node):
        text = node.value
        if not isinstance(text, str) or not text:
            return
        device = cuda_device(text)
        if device is not None:
            self._add(node, self.target.device(*device))
        elif process_group_spec(text):
            self._add(node, self.target.process_group(text))
        elif text == "CUDA_VISIBLE_DEVICES":
            self._add(node, self.target.visible_devices())
        elif nccl_environment.is_nccl_variable(text):
            self._add(node, self.target.nccl_variable(text))
        elif _DEVICE_TEMPLATE.fullmatch(text):
            self._add(node, self.target.device(text, text[len("cuda:"):]))
        elif text.startswith("torch.cuda."):
            kind, what, fix = self.target.cuda_name(text)
            self._add(node, (kind, f"{text}: {what}", fix))
        elif libraries.cuda_tool(text) and self.target.redirects:
            tool = libraries.cuda_tool(text)
            self._add(node, (NEEDS_CHANGE, f"runs NVIDIA's {tool}, which the target does not have",
                             "ask torch.cuda (device_count, get_device_name, mem_get_info), which "
                             "cudashim answers for the target" if tool == "nvidia-smi"
                             else extensions.way_out(self.target)))
        elif libraries.cuda_toolkit_path(text) and self.target.redirects:
            self._add(node, (NEEDS_CHANGE, "names the CUDA toolkit, which the target does not have",
                             "build and run without the CUDA toolkit"))
        elif libraries.cuda_library_file(text, bare_names=False):
            self._add(node, self._native_or("cuda", (
                CANNOT_RUN, f"names the CUDA library '{libraries.cuda_library_file(text, False)}'",
                "call the torch API the library call stands for")))


def _simple_equality(node: ast.Compare) -> bool:
    return len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq, ast.Is, ast.IsNot))


def _literal(node: ast.AST):
    """The value of a literal argument; ``...`` when it is not one."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return ...


class _ReplaceLiteral(ast.NodeTransformer):
    """Puts an expression where a CUDA literal was, to show the fix."""

    def __init__(self, literal: str, expression: str):
        self.literal, self.expression = literal, ast.parse(expression, mode="eval").body

    def visit_Constant(self, node):
        return self.expression if node.value == self.literal else node
