"""The case suites that ship inside the package: a case argument that is no existing path but names one
(``cpu``, ``cases/cpu.toml``) resolves to the packaged file."""

from pathlib import Path

SUITES_DIR = Path(__file__).resolve().parent / "suites"


def packaged_suites() -> dict[str, Path]:
    return {path.stem: path for path in sorted(SUITES_DIR.glob("*.toml"))}


def resolve_case_arg(arg: str | Path) -> str | Path:
    """A case file or folder as given when it exists, else the packaged suite it names."""
    if Path(arg).exists():
        return arg
    suite = packaged_suites().get(Path(arg).name.removesuffix(".toml"))
    return suite if suite is not None and Path(arg).parent.name in ("", "cases", "suites") else arg
