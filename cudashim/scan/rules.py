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

import ast
import copy
import functools
import re
from typing import Callable, Dict, List, Optional, Tuple

from .. import substitutes
from ..backends.base import Backend
from ..patches import _nccl_environment as nccl_environment, extensions, frameworks, version_gates
from ..tables import device_parameters, dtype_gaps, dtype_gaps_by_release, meshes
from . import catalog, libraries
from .findings import CANNOT_RUN, DIFFERS, HANDLED, NEEDS_CHANGE, Finding
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
_MOVED_TO_AN_UNKNOWN_SIDE = "moved to a device of unknown side"   # y = x.to(t.device)
# What a move's destination is, where the CPU backend cannot honour CUDA's copy by it.
_READ_OFF_A_RESULT, _A_DEVICES_STRING = "read off an op's result", "a device's string"
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
# What programs name their modules: a device read off one is its parameters' (model.device).
_MODULE_NAME = re.compile(r"(^|_)(model|module|net|network|unet|vae|encoder|decoder|backbone|"
                          r"generator|discriminator|policy|critic|actor|classifier)$")
# Where a string is prose, never code: what a program prints, logs, warns or raises, and the
# help texts it gives argparse and the like.
_PROSE_FUNCTIONS = frozenset({"print", "input"})
_PROSE_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "critical", "exception",
                            "log", "write", "echo", "set_description", "set_postfix_str",
                            "add_note", "fail", "skipTest"})
_PROSE_KEYWORDS = frozenset({"help", "description", "epilog", "usage", "msg", "message", "desc",
                             "title", "doc", "reason"})
_EXCEPTION_NAME = re.compile(r"(Error|Exception|Warning)$")
# Calls that end the program: a branch that makes one stops where CUDA's went on.
_EXITS = frozenset({"sys.exit", "exit", "quit", "os._exit", "os.abort"})
# torch.cuda's CUDA-graph names: the class, and the names a backend's device module serves
_GRAPH_NAMES = frozenset({"CUDAGraph", *Backend.GRAPH_NAMES})


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
        self.parents: Dict[ast.AST, ast.AST] = {}
        self.prose = 0                              # > 0 while visiting prose
        self.uses_autocast = False
        self.reported_moves: set = set()
        # moves of unknown side, and writes in place, by what they moved or wrote (a name or an
        # attribute chain), per function; attributes are matched across the file at its end
        self.move_sources: List[list] = [[]]
        self.writes: List[list] = [[]]
        self.attribute_moves: list = []
        self.attribute_writes: list = []
        self.attribute_values: Dict[str, List[ast.expr]] = {}   # "self.device" -> what is assigned

    def scan(self, tree: ast.AST) -> List[Finding]:
        self._collect_imports(tree)
        for parent in ast.walk(tree):
            for child in ast.iter_child_nodes(parent):
                self.parents[child] = parent
        for node in ast.walk(tree):                 # self.device = ..., read in another method
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Attribute) \
                    and self._held_by(node.targets[0]) is not None:
                self.attribute_values.setdefault(self._held_by(node.targets[0]), []).append(node.value)
        self.uses_autocast = any(
            "autocast" in (self.qualify(node) or getattr(node, "attr", ""))
            for node in ast.walk(tree) if isinstance(node, (ast.Attribute, ast.Name)))
        self.visit(tree)
        self._end_of_scope()
        self._sources_written(self.attribute_moves, self.attribute_writes, anywhere=True)
        return self.findings

    def _visit_as_prose(self, node) -> None:
        self.prose += 1
        try:
            self.visit(node)
        finally:
            self.prose -= 1

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
    def _add(self, node: ast.AST, verdict: Tuple[str, str, Optional[str]], rule: str) -> None:
        kind, what, fix = verdict
        line = getattr(node, "lineno", 1)
        code = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        self.findings.append(Finding(self.path, line, getattr(node, "col_offset", 0) + 1,
                                     code[:160], kind, what, fix, catalog.BY_NAME[rule].id))

    def _native_or(self, language: str, verdict):
        return (HANDLED, f"native {language.upper() if language == 'cuda' else language} code, "
                         f"compiled for the {self.target.device_type} device", None) \
            if self.target.runs(language) else verdict

    # --- scopes and assignments ---------------------------------------------------------
    def visit_FunctionDef(self, node):
        self._kernel_decorators(node)
        self._enter_scope()
        self.generic_visit(node)
        self._leave_scope()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self._enter_scope()
        self.generic_visit(node)
        self._leave_scope()

    def _enter_scope(self) -> None:
        self.scopes.append({})
        self.move_sources.append([])
        self.writes.append([])

    def _leave_scope(self) -> None:
        self.scopes.pop()
        self._end_of_scope()

    def visit_Assign(self, node):
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)
            if isinstance(target, ast.Name):
                self._remember(target.id, node.value)
            elif isinstance(target, ast.Subscript):          # moved[0] = 7
                self._written_in_place(target.value)

    def visit_AugAssign(self, node):                         # moved += 1
        self.generic_visit(node)
        self._written_in_place(node.target)

    # --- moves that CUDA makes copies --------------------------------------------------------
    def _move_destination(self, node: ast.AST) -> Optional[ast.AST]:
        """``dest`` where ``node`` is ``x.to(dest, ...)`` / ``x.to(device=dest)``, else None."""
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "to"):
            return None
        return node.args[0] if node.args else next(
            (k.value for k in node.keywords if k.arg == "device"), None)

    def _moved_to_an_unknown_side(self, node: ast.AST) -> bool:
        """Whether ``node`` is a move whose side a host-memory target cannot tell: to a device
        read off a tensor that is not plainly a parameter (``x.to(logits.device)``, or
        ``x.to(self.device)`` where the file assigns ``self.device`` one). A parameter's device
        (``layer.weight.device``, ``next(model.parameters()).device``) names the side the
        runtime knows it is on."""
        spec = self._move_destination(node)
        return spec is not None and self._destination_kind(spec) == _READ_OFF_A_RESULT

    def _destination_kind(self, spec: ast.AST, depth: int = 0) -> Optional[str]:
        """``_READ_OFF_A_RESULT`` for a device read off a tensor that is not plainly a
        parameter, ``_A_DEVICES_STRING`` for a string made from a device (``str(d)``,
        ``d.type``, ``f"{d}"``, or a variable holding one) or a device made from one
        (``torch.device(str(d))``), else None; an attribute the file assigns
        (``self.device = ...``) is what it was assigned."""
        assigned = self.attribute_values.get(self._held_by(spec)) \
            if isinstance(spec, ast.Attribute) and depth < 3 else None
        if assigned:
            return next((kind for kind in (self._destination_kind(value, depth + 1)
                                           for value in assigned) if kind is not None), None)
        if isinstance(spec, ast.Attribute) and spec.attr == "device":
            return None if _a_parameter(spec.value) else _READ_OFF_A_RESULT
        # a device made again from a device's string: torch.device(str(d)), or a name holding one
        if isinstance(spec, ast.Name) and depth < 3:
            tracked = self._tracked(spec.id)
            if tracked is not None and tracked[0] == _DEVICE_OBJECT and \
                    self._destination_kind(tracked[1], depth + 1) == _A_DEVICES_STRING:
                return _A_DEVICES_STRING
        if isinstance(spec, ast.Call) and self.qualify(spec.func) == "torch.device" and spec.args \
                and depth < 3 and self._destination_kind(spec.args[0], depth + 1) == _A_DEVICES_STRING:
            return _A_DEVICES_STRING
        made_from = self._device_string(spec)
        if made_from is not None and self._device_object(made_from) and not self._the_host(made_from):
            return _A_DEVICES_STRING
        return None

    def _the_host(self, device: ast.AST) -> bool:
        """Whether the file shows ``device`` to be ``torch.device("cpu")``."""
        if isinstance(device, ast.Name):
            tracked = self._tracked(device.id)
            device = tracked[1] if tracked is not None and tracked[1] is not None else device
        return isinstance(device, ast.Call) and self.qualify(device.func) == "torch.device" \
            and bool(device.args) and _literal(device.args[0]) in ("cpu", "cpu:0")

    def _moved_by_a_devices_string(self, node: ast.Call) -> None:
        """``x.to(str(d))``: on the CPU backend every device's string is the host's name."""
        spec = self._move_destination(node)
        if spec is None or self.target.device_type != "cpu" or not self.target.redirects \
                or self._destination_kind(spec) != _A_DEVICES_STRING:
            return
        self._add(node, (DIFFERS, f"a move to a string made from a device: on the {self.target.name} "
                                  "backend every device's string is 'cpu', the host's name, so what "
                                  "it moves (a tensor or a module) lands in host memory as the "
                                  "program's own 'cpu' would put it: a move of a tensor already "
                                  "there (pinned, or moved to the host) returns it itself, and a "
                                  "later .cpu() of what it moved returns that itself, where CUDA "
                                  "copies both times; torch.cuda.memory_allocated() leaves it out",
                         "move by the device object itself (.to(d), not .to(str(d)) or "
                         ".to(d.type)), or by name (.to('cuda'))"), "move-by-device-string")

    def _a_move(self, node: ast.Call) -> None:
        """Remember a move of unknown side by what it moved, for the writes into that tensor."""
        source = self._held_by(node.func.value)
        assignment = self.parents.get(node)
        if isinstance(assignment, ast.Assign) and [self._held_by(t) for t in assignment.targets] == [source]:
            return           # x = x.to(...): nothing here holds the tensor moved any more
        if source is not None:
            self.move_sources[-1].append((source, node, self._loops(node)))

    def _written_in_place(self, node: ast.AST) -> None:
        """A write into what ``node`` holds: where it is a move of unknown side, or the tensor
        such a move moved, the finding (once per move) where host memory is the device's."""
        move = node if self._moved_to_an_unknown_side(node) else None
        if move is None and isinstance(node, ast.Name):
            tracked = self._tracked(node.id)
            move = tracked[1] if tracked is not None and tracked[0] == _MOVED_TO_AN_UNKNOWN_SIDE else None
        if move is not None:
            self._report_move(move)
        written = self._held_by(node)
        if written is not None:
            self.writes[-1].append((written, node, self._loops(node)))

    def _held_by(self, node: ast.AST) -> Optional[str]:
        """``staging`` or ``self.staging``: what a move moved or a write wrote, where it is a
        name or an attribute chain on one (an attribute of ``self`` known by its class's name,
        as two classes' ``self.device`` differ); else None (a call's result, an item)."""
        chain = node
        while isinstance(chain, ast.Attribute):
            chain = chain.value
        if not isinstance(chain, ast.Name):
            return None
        held = ast.unparse(node)
        if chain.id in ("self", "cls") and chain is not node:
            parent = self.parents.get(node)
            while parent is not None and not isinstance(parent, ast.ClassDef):
                parent = self.parents.get(parent)
            if parent is not None:
                held = f"{parent.name}:{held}"
        return held

    def _loops(self, node: ast.AST) -> frozenset:
        """The loops of its function around ``node``: a write in one of them reaches every turn."""
        loops = []
        parent = self.parents.get(node)
        while parent is not None and not isinstance(parent, _SCOPES):
            if isinstance(parent, (ast.For, ast.AsyncFor, ast.While)):
                loops.append(parent)
            parent = self.parents.get(parent)
        return frozenset(loops)

    def _sources_written(self, moves, writes, anywhere: bool) -> None:
        """Report each move whose moved tensor is written in place after it: later in its
        function, in a loop around both (the refill of a staging buffer at the next turn), or,
        for an attribute (``self.staging``), in any method, which a program calls again."""
        for source, move, move_loops in moves:
            for written, write, write_loops in writes:
                if written == source and (anywhere or write_loops & move_loops
                                          or (write.lineno, write.col_offset)
                                          > (move.lineno, move.col_offset)):
                    self._report_move(move)
                    break

    def _end_of_scope(self) -> None:
        moves, writes = self.move_sources.pop(), self.writes.pop()
        self._sources_written(moves, writes, anywhere=False)
        self.attribute_moves += [entry for entry in moves if "." in entry[0]]
        self.attribute_writes += [entry for entry in writes if "." in entry[0]]

    def _report_move(self, move: ast.Call) -> None:
        if not self.target.device_memory_is_host or move in self.reported_moves:
            return
        self.reported_moves.add(move)
        self._add(move, (DIFFERS, "a move to a device read off a tensor, and the tensor moved or the "
                                  "result then written in place: on the "
                                  f"{self.target.name} backend, whose device memory is host memory, a "
                                  "device read off an op's result does not say which side it means, so "
                                  "the move returns the tensor itself where CUDA copies between host "
                                  "and device, and a write to either changes both",
                         "read the device off a parameter or a moved tensor, move by name where "
                         "the copy matters (.to('cuda'), .cuda(), .cpu()), or pass copy=True"),
                  "move-by-tensor-device")

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)
            if isinstance(node.target, ast.Name):
                self._remember(node.target.id, node.value)

    def _remember(self, name: str, value: ast.AST) -> None:
        if self._moved_to_an_unknown_side(value):
            self.scopes[-1][name] = (_MOVED_TO_AN_UNKNOWN_SIDE, value)
        elif self._device_object(value):
            self.scopes[-1][name] = (_DEVICE_OBJECT, value)
        else:
            source = self._device_string(value)
            self.scopes[-1][name] = (_DEVICE_STRING, source) if source is not None else (_OTHER, value)

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
                                      f"cudashim activated", None), "substituted-library")
            return True
        found = libraries.cuda_only_library(module)
        if found is None:
            return False
        name, what, way_out = found
        self._add(node, self._unless_caught(node, _CATCHES_IMPORT, self._native_or("cuda", (
            CANNOT_RUN, f"imports {name}: {what}", way_out)), "where it is not installed"),
                  "cuda-only-library")
        return True

    def _unless_caught(self, node, catches, verdict, where: str = ""):
        """A blocker the program catches (``try: import triton / except ImportError``) runs
        differently: the program goes on without what failed."""
        kind, what, way_out = verdict
        caught = self._caught(node, catches) if kind in (CANNOT_RUN, NEEDS_CHANGE) else None
        if caught is None:
            return verdict
        return DIFFERS, f"{what}; the program {caught} and goes on without it {where}".rstrip(), way_out

    def _kernel_decorators(self, node) -> None:
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            qualified = self.qualify(target) or ""
            for prefix, language in libraries.KERNEL_DECORATORS.items():
                if qualified.startswith(prefix):
                    self._add(decorator, self._native_or(language, self._kernel_elsewhere(language, node.name)),
                              "cuda-kernel")
                    return

    def _kernel_elsewhere(self, language: str, name: str):
        """What a kernel gets on a target that does not compile its language: a Triton kernel
        runs through Triton's interpreter (patches/triton), any other cannot run."""
        if language == "triton" and self.target.redirects:
            return (DIFFERS, f"a triton kernel ('{name}'): runs through Triton's interpreter on the "
                             f"{self.target.device_type} device, one program at a time (slow; the "
                             f"report times it)", libraries.KERNEL_WAY_OUT)
        return (CANNOT_RUN, f"a {language} kernel ('{name}') compiled for NVIDIA GPUs", libraries.KERNEL_WAY_OUT)

    # --- names the runtime redirects -----------------------------------------------------
    def visit_Attribute(self, node):
        qualified = self.qualify(node)
        if qualified is not None:
            self._qualified(node, qualified)
            return                                          # a dotted name: nothing inside
        if node.attr == "is_cuda":
            self._add(node, (HANDLED, f"True for tensors on the {self.target.device_type} device"
                                      if self.target.redirects else "native CUDA", None), "tensor-device")
        self.generic_visit(node)

    def _qualified(self, node, name: str) -> None:
        target = self.target
        if name == "torch.cuda" or name.startswith("torch.cuda."):
            kind, what, fix = target.cuda_name(name)
            rule = _cuda_rule(name)
            if rule == "cuda-graphs" and kind == HANDLED and target.redirects:
                what = target.graphs()
            self._add(node, (kind, f"{name}: {what}", fix), rule)
        elif name.startswith(("torch.backends.cuda.", "torch.backends.cudnn.")) \
                and name.endswith(("allow_tf32", "fp32_precision")):
            self._add(node, (HANDLED, "a TF32 flag: it turns the target's reduced-precision float32 "
                                      "matmul on and off where it has one (--tf32)"
                                      if target.redirects else "native CUDA", None), "cuda-flag")
        elif name in VERSION_ANSWERS:
            self._add(node, (HANDLED, f"{name}(): {VERSION_ANSWERS[name]}, from the CUDA build the "
                                      "program hears (--cuda-version), which torch.version.cuda, "
                                      "NCCL's and NVML's versions agree with"
                                      if target.redirects else "native CUDA", None), "version-answer")
        elif name.startswith(("torch.backends.cuda.", "torch.backends.cudnn.")):
            self._add(node, (HANDLED, "a CUDA library flag: setting it is harmless where it does "
                                      "not apply" if target.redirects else "native CUDA", None),
                      "cuda-flag")
        elif name in _PRIVATE_ENTRIES:
            self._private_entry(node, name)
        elif name == "torch.version.cuda":
            self._add(node, (HANDLED, "the CUDA version cudashim's callers hear (--cuda-version)"
                                      if target.redirects else "native CUDA", None), "version-answer")
        elif name.startswith("torch.distributed.") and name.endswith(".NCCL"):
            self._add(node, target.process_group("nccl"), "process-group")
        elif name == "torch.utils.cpp_extension.CUDA_HOME":
            self._add(node, (NEEDS_CHANGE, "the CUDA toolkit's location, which the target does "
                                           "not have", "build without the CUDA toolkit"),
                      "cuda-toolkit")

    def _private_entry(self, node, name: str) -> None:
        entry = _PRIVATE_ENTRIES[name]
        if not self.target.redirects:
            self._add(node, (HANDLED, "native CUDA", None), "private-entry-point")
        elif entry.how.endswith(device_parameters.ABSENT_OFF_CUDA):
            guarded = any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "hasattr"
                          for test in self._tests_around(node) for n in ast.walk(test))
            self._add(node, (DIFFERS if guarded else NEEDS_CHANGE,
                             f"{name}: a private binding that exists only in CUDA builds of torch"
                             + ("; the program checks hasattr first" if guarded else ""),
                             None if guarded else "use the public torch.cuda API it stands for"),
                      "private-entry-point")
        else:
            self._add(node, (HANDLED, f"{name}: {entry.how}", None), "private-entry-point")

    def _looked_up(self, node) -> Optional[str]:
        """'looks for it first' where the string is only looked up (shutil.which("nvcc"))."""
        call = self.parents.get(node)
        if isinstance(call, ast.Call) and self.qualify(call.func) in _LOOKUPS:
            return f"only looks for it ({self.qualify(call.func)}), and finds none"
        return None

    def _caught(self, node, catches) -> Optional[str]:
        """The handler around ``node`` that catches one of ``catches``, if one does."""
        child, parent = node, self.parents.get(node)
        while parent is not None:
            if isinstance(parent, ast.Try) and child in parent.body:
                for handler in parent.handlers:
                    caught = handler.type
                    names = [caught] if not isinstance(caught, ast.Tuple) else caught.elts
                    for name in names:
                        text = "except:" if name is None else ast.unparse(name)
                        if name is None or text.rpartition(".")[2] in catches:
                            return f"catches the failure ({'except ' + text if name else text})"
            child, parent = parent, self.parents.get(parent)
        return None

    def _tests_around(self, node):
        """The statement holding ``node`` and the tests of the ifs and whiles around it."""
        child, parent = node, self.parents.get(node)
        while parent is not None and not isinstance(child, ast.stmt):
            child, parent = parent, self.parents.get(parent)
        yield child
        while parent is not None:
            if isinstance(parent, (ast.If, ast.While)) and child in parent.body:
                yield parent.test
            child, parent = parent, self.parents.get(parent)

    # --- calls ------------------------------------------------------------------------------
    def visit_Call(self, node):
        func = node.func
        qualified = self.qualify(func) or ""
        if self._prose_call(func, qualified):
            self.visit(func)
            for part in (*node.args, *(keyword.value for keyword in node.keywords)):
                self._visit_as_prose(part)
            return
        prose, self.prose = self.prose, 0       # print(subprocess.run(["nvidia-smi"])) runs it
        try:
            self._visit_call(node, func, qualified)
        finally:
            self.prose = prose

    @staticmethod
    def _in_the_gap(node, qualified: str) -> bool:
        """Whether a call of a kernel-gap function is one the gap is in: any call, or, where the
        gap is only in calls passing a keyword true (``F.interpolate(..., antialias=True)``),
        those not passing it a literal false."""
        keyword = _GAP_ONLY_WITH.get(qualified)
        if keyword is None:
            return True
        given = next((k.value for k in node.keywords if k.arg == keyword), None)
        return given is not None and _literal(given) not in (False, None, 0)

    def _visit_call(self, node, func, qualified: str) -> None:
        if isinstance(func, ast.Attribute) and _in_place_method(func.attr):
            self._written_in_place(func.value)
        if self._moved_to_an_unknown_side(node):
            self._a_move(node)
        self._moved_by_a_devices_string(node)
        builder = qualified.rpartition(".")[2]
        called = qualified or (func.attr if isinstance(func, ast.Attribute) else
                               func.id if isinstance(func, ast.Name) else "")
        if called.rpartition(".")[2] in _DATA_PARALLEL:
            self._device_ids(node)
        elif qualified in _GAP_FUNCTIONS and self._in_the_gap(node, qualified):
            dtypes = _GAP_DTYPES[qualified]
            self._add(node, (HANDLED, f"{qualified}: its CUDA kernel takes {dtypes}, which the "
                                      f"target's may not; cudashim's kernels fill the gap"
                             if self.target.redirects else "native CUDA", None), "kernel-gap")
        if qualified == f"{extensions.MODULE}.{builder}" and builder in extensions.BUILDERS:
            self._extension(node, builder)
        elif qualified.startswith("ctypes") and self._loaded_library(node):
            return                                          # its argument is this finding
        elif qualified in meshes.CALLS:
            self._add(node, self.target.mesh_call(qualified), "device-mesh")
        elif qualified in frameworks.ENTRY_POINTS:
            framework = frameworks.ENTRY_POINTS[qualified]
            keyword = frameworks.DEVICE_KEYWORDS.get(framework)
            choice = next((_literal(k.value) for k in node.keywords if k.arg == keyword), None) if keyword else None
            verdict = self.target.framework_call(framework, choice if isinstance(choice, (str, bool)) else None)
            if verdict is not None:
                self._add(node, verdict, "framework-accelerator")
        elif isinstance(func, ast.Attribute) and func.attr == "cuda" and not qualified:
            index = _literal(node.args[0]) if node.args else None
            if isinstance(index, int) and not isinstance(index, bool) and self.target.lacks(index):
                self._add(func, self.target.device(f"cuda:{index}", index), "device-spec")
            else:
                self._add(func, (HANDLED, f".cuda() moves to the {self.target.device_type} device"
                                          if self.target.redirects else "native CUDA", None),
                          "tensor-device")
        elif isinstance(func, ast.Attribute) and func.attr in _STRING_TESTS and node.args:
            literal = self._cuda_literal(node.args[0])
            device = self._device_string(func.value) if literal else None
            if device is not None:
                self._string_compare(node, device, literal, negated=False, substring=True)
                self.visit(func.value)
                return
        elif qualified in ("torch.cuda.set_device", "torch.device") and node.args:
            index = _literal(node.args[-1])
            if isinstance(index, int) and not isinstance(index, bool) and self.target.lacks(index):
                self._add(node, self.target.device(f"cuda:{index}", index), "device-spec")
        self.visit(func)
        for argument in node.args:
            self.visit(argument)
        for keyword in node.keywords:
            if keyword.arg in _PROSE_KEYWORDS:
                self._visit_as_prose(keyword.value)
            else:
                self.visit(keyword.value)

    def _prose_call(self, func, qualified: str) -> bool:
        """Whether a call's string arguments are prose: print, logging, warnings, exceptions."""
        name = func.id if isinstance(func, ast.Name) else \
            func.attr if isinstance(func, ast.Attribute) else ""
        if qualified == "warnings.warn" or _EXCEPTION_NAME.search(name):
            return True
        if isinstance(func, ast.Name):
            return name in _PROSE_FUNCTIONS and not qualified
        return isinstance(func, ast.Attribute) and name in _PROSE_METHODS

    def _device_ids(self, node) -> None:
        """DataParallel(module, device_ids=[0, 1]): it needs every device it names."""
        given = next((k.value for k in node.keywords if k.arg in ("device_ids", "devices")),
                     node.args[1] if len(node.args) > 1 and isinstance(node.args[1], ast.List) else None)
        indices = _literal(given) if given is not None else None
        if not isinstance(indices, (list, tuple)) or not indices:
            return
        numbers = [i for i in indices if isinstance(i, int) and not isinstance(i, bool)]
        highest = max(numbers, default=None)
        if highest is not None and self.target.lacks(highest):
            self._add(given, self.target.device(f"cuda:{highest}", highest), "data-parallel")
        elif self.target.redirects:
            self._add(given, (HANDLED, f"runs over the target's devices {numbers}", None),
                      "data-parallel")

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
            self._add(node, self._unless_caught(node, _CATCHES_BUILD, self._native_or("cuda", (
                CANNOT_RUN, f"builds a CUDA C++ extension ({', '.join(sources)}); under cudashim "
                            f"{builder}() raises UnsupportedCudaAPI",
                extensions.way_out(self.target)))), "cuda-extension")

    def _loaded_library(self, node) -> bool:
        for argument in node.args:
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                library = libraries.cuda_library_file(argument.value, bare_names=True)
                if library is not None:
                    verdict = self._native_or("cuda", (
                        CANNOT_RUN, f"loads the CUDA library '{library}' by hand",
                        "call the torch API the library call stands for (torch.cuda, which "
                        "cudashim redirects)"))
                    self._add(node, self._unless_caught(node, _CATCHES_MISSING_PROGRAM, verdict),
                              "cuda-library-file")
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
        self._precision_check(node)
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

    def visit_Assert(self, node):
        self.visit(node.test)
        if node.msg is not None:
            self._visit_as_prose(node.msg)

    def _precision_check(self, node) -> None:
        """``out.dtype == torch.float16`` where autocast runs: the policy may choose another."""
        operands = [node.left, *node.comparators]
        if not (self.uses_autocast and self.target.redirects and len(operands) == 2):
            return
        names = {self.qualify(operand) for operand in operands}
        if names & _HALF and any(isinstance(o, ast.Attribute) and o.attr == "dtype" for o in operands):
            self._add(node, (DIFFERS, "tests a tensor's dtype for float16 where autocast runs: "
                                      "cudashim's precision policy may compute autocast's float16 "
                                      "regions in another dtype on this target (--amp-dtype "
                                      "as-asked keeps float16)", None), "precision-check")

    def visit_Match(self, node):                 # match dev.type: case "cuda": ...
        device = self._device_string(node.subject)
        for case in node.cases if device is not None else ():
            pattern = case.pattern
            values = pattern.patterns if isinstance(pattern, ast.MatchOr) else [pattern]
            if any(isinstance(value, ast.MatchValue) and self._cuda_literal(value.value)
                   for value in values):
                self._add(pattern, self._string_match(device, node, case), "device-name-compare")
        self.visit(node.subject)
        for case in node.cases:                 # patterns are compared, not device arguments
            for part in (case.guard, *case.body):
                if part is not None:
                    self.visit(part)

    def _string_match(self, device, match, cuda_case):
        if not self.target.redirects:
            return HANDLED, "native CUDA", None
        test = (f"{ast.unparse(device.value)}.is_cuda"
                if isinstance(device, ast.Attribute) and device.attr == "device"
                else f"{ast.unparse(device)}.type == {self.torch_name}.device('cuda').type")
        what = (f"matches the device's name against 'cuda'; at run time it is "
                f"'{self.target.device_type}' on the '{self.target.name}' target")
        fallback = next((case for case in match.cases if isinstance(case.pattern, ast.MatchAs)
                         and case.pattern.pattern is None and case.guard is None), None)
        stop = self._stops(fallback.body) if fallback is not None else None
        if stop:
            return NEEDS_CHANGE, f"{what}, and the case taken {stop}", f"test `if {test}:` before the match"
        return (DIFFERS, f"{what}: {_summary(cuda_case.body, 'skipped')}"
                + (f", and {_summary(fallback.body, 'run instead')}" if fallback else ""),
                f"test `if {test}:` before the match")

    def _string_compare(self, node, device, literal: str, negated: bool, substring: bool) -> None:
        target = self.target
        if not target.redirects:
            self._add(node, (HANDLED, "native CUDA", None), "device-name-compare")
            return
        what = (f"compares the device's name with {literal!r} as a string, which no shim "
                f"redirects (on the '{target.name}' target the device is the real "
                f"'{target.device_type}')")
        fix = self._compare_fix(node, device, literal, negated, substring)
        kind, consequence = self._branch_on_target(node, holds=negated)
        self._add(node, (kind, f"{what}: {consequence}", fix), "device-name-compare")

    def _compare_fix(self, node, device, literal: str, negated: bool, substring: bool) -> str:
        if isinstance(device, ast.Attribute) and device.attr == "device" and literal == "cuda" \
                and (substring or isinstance(node, ast.Call) or isinstance(node, ast.Compare)
                     and _simple_equality(node)):
            fix = f"{'not ' if negated else ''}{ast.unparse(device.value)}.is_cuda"
        else:
            stand_in = (f'{self.torch_name}.device("cuda").type' if literal == "cuda"
                        else f'str({self.torch_name}.device("{literal}"))')
            fix = ast.unparse(_ReplaceLiteral(literal, stand_in).visit(copy.deepcopy(node)))
        return fix

    def _branch_on_target(self, node, holds: bool) -> Tuple[str, str]:
        """What the program does with the compare's value on the target (``holds``): it blocks
        where the path taken raises, fails an assertion or exits; else it differs, and says how."""
        value: Optional[bool] = holds
        child, parent = node, self.parents.get(node)
        while isinstance(parent, (ast.UnaryOp, ast.BoolOp)):
            if isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not):
                value = None if value is None else not value
            elif isinstance(parent, ast.BoolOp):        # and/or: decided only by a short circuit
                decisive = isinstance(parent.op, ast.And) and value is False \
                    or isinstance(parent.op, ast.Or) and value is True
                value = value if decisive else None
            child, parent = parent, self.parents.get(parent)
        shown = "True" if value else "False"
        if isinstance(parent, ast.Assert) and parent.test is child:
            if value is False:
                return NEEDS_CHANGE, "the assertion fails on the target"
            return DIFFERS, "the assertion's outcome depends on the other conditions" \
                if value is None else "the assertion holds on the target"
        if isinstance(parent, (ast.If, ast.While)) and parent.test is child:
            if value is None:
                return DIFFERS, "the test's outcome depends on the other conditions"
            taken, skipped = (parent.body, parent.orelse) if value else (parent.orelse, parent.body)
            stop = self._stops(taken)
            if stop:
                return NEEDS_CHANGE, f"the test is {shown} on the target, and the branch taken {stop}"
            what = f"the test is {shown} on the target: {_summary(skipped, 'skipped')}"
            return DIFFERS, what + (f", and {_summary(taken, 'run instead')}" if taken else "")
        if isinstance(parent, ast.IfExp) and parent.test is child:
            chosen = parent.body if value else parent.orelse
            return DIFFERS, (f"on the target it is {shown}: the expression gives "
                             f"`{ast.unparse(chosen)[:60]}`") if value is not None else \
                "the expression's value depends on the other conditions"
        where = ast.unparse(parent)[:80] if parent is not None else ""
        return DIFFERS, f"it is {shown if value is not None else 'decided by the other conditions'} " \
                        f"on the target, in `{where}`"

    def _stops(self, statements) -> Optional[str]:
        """How a branch ends the program, if its own statements raise, assert False or exit."""
        for statement in statements:
            if isinstance(statement, ast.Raise):
                return "raises"
            if isinstance(statement, ast.Assert) and _literal(statement.test) in (False, 0, None):
                return "fails an assertion"
            if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
                call = statement.value
                name = self.qualify(call.func) or (call.func.id if isinstance(call.func, ast.Name)
                                                   else "")
                if name in _EXITS or (isinstance(call.func, ast.Attribute)
                                      and call.func.attr == "error" and "pars" in
                                      ast.unparse(call.func.value).lower()):
                    return f"exits ({ast.unparse(call)[:60]})"
        return None

    # --- strings the runtime reads ------------------------------------------------------------
    def visit_JoinedStr(self, node):
        if self.prose:                                      # prose: only its code counts
            for value in node.values:
                if isinstance(value, ast.FormattedValue):
                    self.visit(value.value)
            return
        head = node.values[0] if node.values else None
        if isinstance(head, ast.Constant) and head.value == "cuda:" and len(node.values) == 2:
            index = "{" + ast.unparse(node.values[1].value) + "}"
            self._add(node, self.target.device(f"cuda:{index}", index), "device-spec")
            return                                          # f"cuda:{rank}"
        self.generic_visit(node)

    def visit_Constant(self, node):
        text = node.value
        if not isinstance(text, str) or not text or self.prose:
            return
        device = cuda_device(text)
        if device is not None:
            self._add(node, self.target.device(*device), "device-spec")
        elif process_group_spec(text):
            self._add(node, self.target.process_group(text), "process-group")
        elif text == "CUDA_VISIBLE_DEVICES":
            self._add(node, self.target.visible_devices(), "visible-devices")
        elif nccl_environment.is_nccl_variable(text):
            self._add(node, self.target.nccl_variable(text), "nccl-environment")
        elif _DEVICE_TEMPLATE.fullmatch(text):
            self._add(node, self.target.device(text, text[len("cuda:"):]), "device-spec")
        elif text.startswith("torch.cuda."):
            kind, what, fix = self.target.cuda_name(text)
            self._add(node, (kind, f"{text}: {what}", fix), _cuda_rule(text))
        elif libraries.cuda_tool(text) and self.target.redirects:
            tool = libraries.cuda_tool(text)
            caught = self._caught(node, _CATCHES_MISSING_PROGRAM) or self._looked_up(node)
            self._add(node, (DIFFERS if caught else NEEDS_CHANGE,
                             f"runs NVIDIA's {tool}, which the target does not have"
                             + (f"; the program {caught}" if caught else ""),
                             "ask torch.cuda (device_count, get_device_name, mem_get_info), which "
                             "cudashim answers for the target" if tool == "nvidia-smi"
                             else extensions.way_out(self.target)), "cuda-toolkit")
        elif libraries.cuda_toolkit_path(text) and self.target.redirects:
            self._add(node, (NEEDS_CHANGE, "names the CUDA toolkit, which the target does not have",
                             "build and run without the CUDA toolkit"), "cuda-toolkit")
        elif libraries.cuda_library_file(text, bare_names=False):
            self._add(node, self._native_or("cuda", (
                CANNOT_RUN, f"names the CUDA library '{libraries.cuda_library_file(text, False)}'",
                "call the torch API the library call stands for")), "cuda-library-file")


# The version answers cudashim gives the program, by name: the runtime's own by-caller table
# (patches/version_gates.py), with what each answers said the way a reader needs it.
_ANSWERED = {"torch.backends.cudnn.version": "the cuDNN torch's wheels of that CUDA line ship "
                                             "(never None)"}
VERSION_ANSWERS = {gate.api_name: _ANSWERED.get(gate.api_name, gate.became if isinstance(
    gate.became, str) else "the CUDA build's answer") for gate in version_gates.BY_CALLER}

# DataParallel's entry points that take CUDA devices, from the runtime's table of device
# parameters, and the subclasses programs bring (Synchronized-BatchNorm's)
_DATA_PARALLEL = frozenset(
    {key.partition(":")[2].split(".")[0].partition("(")[0]
     for key in device_parameters.DELEGATED_TO if key.startswith("torch.nn.parallel:")}
    | {"DataParallelWithCallback"})
_HALF = frozenset({"torch.float16", "torch.half"})
# What running a program that is not installed raises, and what catches it.
_LOOKUPS = frozenset({"shutil.which", "os.path.exists", "os.path.isfile", "os.access"})
_CATCHES_MISSING_PROGRAM = frozenset({"FileNotFoundError", "OSError", "Exception", "BaseException",
                                      "CalledProcessError", "SubprocessError", "EnvironmentError"})
# What catches a library that is not installed, and an extension build cudashim refuses.
_CATCHES_IMPORT = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})
_CATCHES_BUILD = frozenset({"RuntimeError", "UnsupportedCudaAPI", "Exception", "BaseException",
                            "OSError", "CalledProcessError", "SubprocessError"})


def _gap_dtypes() -> Dict[str, str]:
    """"torch.<function>" -> the dtypes its CUDA kernel takes and the CPU's refuse: the main
    table's, and those only some releases' CPUs refuse, with the release named (the scan does
    not know which torch the program will run on)."""
    described = {f"torch.{name}": ", ".join(dtypes) for name, (dtypes, _) in dtype_gaps.GAPS.items()}
    for release, table in dtype_gaps_by_release.BEYOND.items():
        for name, (dtypes, _) in table.items():
            on_release = f"{', '.join(dtypes)} (torch {release})"
            key = f"torch.{name}"
            described[key] = f"{described[key]}; {on_release}" if key in described else on_release
    return described


_GAP_DTYPES = _gap_dtypes()
_GAP_FUNCTIONS = frozenset(_GAP_DTYPES)
_GAP_ONLY_WITH = {f"torch.{name}": keyword for name, keyword in dtype_gaps.ONLY_WITH.items()}
# "torch._C:_cuda_getDeviceCount()" -> "torch._C._cuda_getDeviceCount"
_PRIVATE_ENTRIES = {key.partition("(")[0].replace(":", "."): entry
                    for key, entry in device_parameters.PRIVATE_ENTRY_POINTS.items()
                    if not key.startswith("torch.cuda:")}     # torch.cuda's: the proxy's rules


def _summary(statements, fate: str) -> str:
    """'lines 12-14 (pin_memory, synchronize) are skipped'."""
    if not statements:
        return f"nothing is {fate}"
    first, last = statements[0].lineno, statements[-1].end_lineno or statements[-1].lineno
    calls = []
    for statement in statements:
        for node in ast.walk(statement):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else \
                    getattr(node.func, "id", None)
                if name and name not in calls:
                    calls.append(name)
    lines = f"line {first}" if first == last else f"lines {first}-{last}"
    return f"{lines}{' (' + ', '.join(calls[:4]) + ')' if calls else ''} {'is' if first == last else 'are'} {fate}"


def _cuda_rule(name: str) -> str:
    """The rule for a torch.cuda name: graphs and private names have their own."""
    last = name.rpartition(".")[2]
    if last in _GRAPH_NAMES or name.startswith("torch.cuda.graphs"):
        return "cuda-graphs"
    if name == "torch.cuda.comm" or name.startswith("torch.cuda.comm."):
        return "data-parallel"
    return "private-entry-point" if last.startswith("_") else "cuda-api"


def _in_place_method(name: str) -> bool:
    """torch's in-place methods end in one underscore (``add_``, ``copy_``, ``zero_``)."""
    return name.endswith("_") and not name.startswith("_") and len(name) > 1


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


def _a_parameter(node: ast.AST) -> bool:
    """Whether ``node`` plainly reads a module's parameter (``<x>.weight``, ``<x>.bias``,
    ``next(<x>.parameters())``) or is a module by its name (``model``, ``self.unet``,
    ``ema_model``), whose ``.device`` is its parameters' (Hugging Face's ``model.device``)."""
    if isinstance(node, (ast.Name, ast.Attribute)) and \
            _MODULE_NAME.search(node.id if isinstance(node, ast.Name) else node.attr):
        return True
    if isinstance(node, ast.Attribute):
        return node.attr in ("weight", "bias")
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "next"
            and len(node.args) == 1 and isinstance(node.args[0], ast.Call)
            and isinstance(node.args[0].func, ast.Attribute) and node.args[0].func.attr == "parameters")
