"""The torch releases cudashim is tested on, and where the running torch stands among them.

cudashim declares ``torch>=2.4``; users bring the torch their vendor ships. CI proves the range
release by release (CONTRIBUTING.md, "Every torch"): the main suite on one release's CPU wheel,
and the torch-range set on the oldest release the package declares, on one that the vendors'
extensions pin, and on the newest the package index serves, each the CUDA build pip installs
on a machine without a GPU. ``cudashim doctor`` says which of these the running torch is.

This module imports no torch: it compares version strings.
"""

from typing import Dict, Tuple

LOWEST = "2.4"      # what pyproject.toml declares (torch>=2.4)

# release -> how CI tests it (each the build named; tox.ini's environments install them)
TESTED: Dict[str, str] = {
    "2.4.1": "the torch-range set, CUDA build without a GPU (tox -e torch2.4)",
    "2.7.1": "the torch-range set, CUDA build without a GPU (tox -e torch2.7)",
    "2.13.0": "the whole suite, CPU wheel (tox)",
    "2.14.1": "the torch-range set, CUDA build without a GPU (tox -e torch2.14)",
}


def release(version: str) -> str:
    """'2.4.1+cu121' -> '2.4.1': the release, without its local build tag."""
    return version.split("+")[0]


def _key(version: str) -> Tuple[int, ...]:
    parts = []
    for part in release(version).split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit()) or "0"
        parts.append(int(digits))
        if not part.isdigit():          # 2.15.0a0, 2.15.0rc1, 2.15.0.dev: before 2.15.0's release
            break
    return tuple(parts)


def nearest(version: str, releases) -> Tuple[str, ...]:
    """The releases among ``releases`` that ``version`` is nearest to: itself where it is one,
    else the nearest older and the nearest newer of them (one, past either end). What a table
    made release by release says of a release between two it was made on."""
    if release(version) in releases:
        return (release(version),)
    ordered = sorted(releases, key=_key)
    older = [name for name in ordered if _key(name) < _key(version)]
    newer = [name for name in ordered if _key(name) > _key(version)]
    return tuple(older[-1:] + newer[:1])


def describe(version: str) -> str:
    """Where ``version`` stands: tested by CI, inside the tested range, or outside it."""
    tested = ", ".join(TESTED)
    name = release(version)
    if name in TESTED:
        return f"tested by CI: {TESTED[name]}"
    if _key(version) < _key(LOWEST):
        return f"older than the torch>={LOWEST} cudashim supports (CI tests {tested})"
    newest = max(TESTED, key=_key)
    if _key(version) > _key(newest):
        return (f"newer than any release CI tests ({tested}): not tested; "
                f"'./scripts/tox -e torch-newest' runs the torch-range set on it")
    return f"inside the tested range, not tested release by release (CI tests {tested})"
