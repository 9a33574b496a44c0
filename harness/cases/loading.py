"""Case files to cases: read and validate every file, keep the tagged ones, refuse what would not fit in memory."""

from collections.abc import Callable
from pathlib import Path

from harness.cases.memory import too_large
from harness.cases.spec import Case, CaseFileError, load_case_file, resolve_case_paths


def load_cases(paths: list[str | Path], device: str | None = "cpu", tags: list[str] | None = None,
               backends: list[str] | None = None, keep: Callable[[str], bool] | None = None) -> list[Case]:  # fmt: skip
    """Load, validate and expand case files; keep cases with any of ``tags`` and whose id passes ``keep``; check
    the memory of those alone on ``device`` (None: no check; ``backends`` None: all built-ins). CaseFileError
    listing every problem found."""
    cases, errors = [], []
    for file in resolve_case_paths(paths):
        try:
            cases.extend(load_case_file(file))
        except CaseFileError as error:
            errors.append(str(error))
    if errors:
        raise CaseFileError("\n".join(errors))
    cases = [c for c in cases if (not tags or set(tags) & set(c.tags)) and (keep is None or keep(c.id))]
    if device is not None and (errors := too_large(cases, device, backends)):
        raise CaseFileError("\n".join(errors))
    return cases
