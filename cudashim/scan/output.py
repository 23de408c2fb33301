"""How a scan is shown: a summary first, then each finding; or JSON for tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

from .. import __version__
from . import ScanResult, catalog
from .findings import BLOCKERS, CLASSES, DIFFERS, NEEDS_CHANGE


# A blocker's fix is needed; a different path's is there to take CUDA's path where it matters.
_FIX_LABELS = {NEEDS_CHANGE: "fix", DIFFERS: "if it matters"}


def as_text(result: ScanResult) -> str:
    target, counts = result.target, result.counts()
    files = len(result.files)
    lines: List[str] = [
        f"cudashim scan: {files} file{'s' if files != 1 else ''} for the '{target.name}' backend "
        f"(device type '{target.device_type}', {target.how_chosen})", ""]
    width = max(len(kind) for kind in CLASSES)
    lines += [f"  {kind:<{width}}  {counts.get(kind, 0)}" for kind in CLASSES]
    blocked = result.blocked_files()
    if blocked:
        lines += ["", "files with blockers:"]
        lines += [f"  {path}  ({count})" for path, count in sorted(blocked.items())]
    if result.errors:
        lines += ["", "could not be read:"] + [f"  {error}" for error in result.errors]
    for kind in CLASSES:
        found = [finding for finding in result.findings if finding.kind == kind]
        if not found:
            continue
        lines += ["", f"{kind}:"]
        for finding in found:
            lines.append(f"  {finding.path}:{finding.line}:{finding.column}  {finding.code}")
            lines.append(f"      {finding.what}  [{finding.rule}]")
            if finding.fix:
                label = _FIX_LABELS.get(kind, "way out")
                lines.append(f"      {label}: {finding.fix}")
    return "\n".join(lines) + "\n"


def as_json(result: ScanResult) -> str:
    return json.dumps(result.as_dict(), indent=2) + "\n"


def explain(name_or_id: str) -> str:
    """``--explain RULE``: what the rule means and what decides it at run time."""
    rule = catalog.rule(name_or_id)
    return (f"{rule.id} ({rule.name})\n\n{rule.explanation}\n\n"
            f"decided at run time by: {rule.decided_by}\n")


def _uri(path: str) -> str:
    """A finding's file as SARIF wants it: relative to where the scan ran, or a file URI."""
    shown = Path(path)
    return shown.as_uri() if shown.is_absolute() else shown.as_posix()


# SARIF levels: what blocks the run is an error; a different path a note; handled, none.
_LEVELS = {kind: "error" for kind in BLOCKERS}
_LEVELS[DIFFERS] = "note"


def as_sarif(result: ScanResult) -> str:
    """SARIF 2.1.0, as code-scanning services read it: one run, the rules, a result per finding
    that blocks or runs differently (handled usages are not problems)."""
    used = sorted({finding.rule for finding in result.findings})
    rules = [{"id": rule.id, "name": rule.name,
              "shortDescription": {"text": rule.explanation.split(". ")[0].rstrip(".") + "."},
              "fullDescription": {"text": rule.explanation},
              "help": {"text": f"{rule.explanation} Decided at run time by: {rule.decided_by}."}}
             for rule in (catalog.RULES[rule_id] for rule_id in used)]
    results = []
    for finding in result.findings:
        if finding.kind not in _LEVELS:
            continue
        message = finding.what + (f" Fix: {finding.fix}" if finding.fix else "")
        results.append({
            "ruleId": finding.rule, "ruleIndex": used.index(finding.rule),
            "level": _LEVELS[finding.kind], "message": {"text": message},
            "properties": {"class": finding.kind},
            "locations": [{"physicalLocation": {
                "artifactLocation": {"uri": _uri(finding.path)},
                "region": {"startLine": finding.line, "startColumn": finding.column,
                           "snippet": {"text": finding.code}}}}]})
    log = {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
           "runs": [{"tool": {"driver": {"name": "cudashim scan", "version": __version__,
                                         "rules": rules}},
                     "properties": {"backend": result.target.name,
                                    "deviceType": result.target.device_type},
                     "invocations": [{"executionSuccessful": not result.errors,
                                      "toolExecutionNotifications": [
                                          {"level": "error", "message": {"text": error}}
                                          for error in result.errors]}],
                     "results": results}]}
    return json.dumps(log, indent=2) + "\n"
