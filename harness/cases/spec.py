"""Case files: declarative TOML in, validated and expanded frozen cases out.

``[defaults]`` merges into every ``[[case]]``; a ``[case.sweep]`` table expands as a product, each
point a case with a readable id (``decode_gqa/head_dim=80/block_size=5``) validated on its own."""

import collections
import difflib
import hashlib
import itertools
import json
import math
import os
import re
import stat
import sys
import tomllib
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator, model_validator

from harness.cases import vocab
from harness.cases.inputs import shared_prefix_blocks
from harness.cases.variants import CASE_FIELDS, VariantFields, turned_on
from harness.cases.vocab import INT32_MAX, DTypeName, Float, Int
from kernels.contract import MAX_BLOCK_SIZE, MAX_HEAD_DIM, MIN_BLOCK_SIZE, MIN_HEAD_DIM
from kernels.tiling import cdiv

Length = Annotated[int, Strict(), Field(le=INT32_MAX)]  # seq_lens and q_lens are int32 tensors
MAX_FILE_BYTES = 4 * 2**20  # a case file is a few KB; anything past this is not one
# A sweep is a product, so a small file can expand to millions of cases: the points (and all their
# sequences, SEQUENCES_PER_POINT a point of the limit) are counted before any is built.
MAX_SWEEP_POINTS = 10_000
MAX_SEQS = 4096
SEQUENCES_PER_POINT = 100
ENV_MAX_SWEEP_POINTS = "HARNESS_MAX_SWEEP_POINTS"  # overrides it (harness run --max-sweep-points sets it)


class CaseFileError(ValueError):
    """A case file is unreadable or a case in it is invalid; the message names file, case and field."""


class FieldError(ValueError):
    """A cross-field check that fails, tagged with the field to blame in the message."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class _Range(BaseModel):
    """A table with ``min`` and ``max`` (its subclass declares them, with their bounds): min <= max."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _ordered(self):
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class SeqLenGenerator(_Range):
    """Seeded ragged lengths: ``count`` sequences with lengths in [min, max]."""

    count: Int = Field(ge=1, le=MAX_SEQS)
    min: Int = Field(ge=1, le=INT32_MAX)
    max: Int = Field(ge=1, le=INT32_MAX)
    distribution: Literal["uniform", "lognormal", "fixed"] = "uniform"


class QLenGenerator(_Range):
    """Seeded query lengths in [min, max], each capped at its sequence's length."""

    min: Int = Field(ge=0, le=INT32_MAX)
    max: Int = Field(ge=0, le=INT32_MAX)


class Tolerance(BaseModel):
    model_config = ConfigDict(extra="forbid")
    atol: Float = Field(ge=0)
    rtol: Float = Field(ge=0)


class CaseSpec(VariantFields):
    """One ``[[case]]`` table (or one expanded sweep point of it); the variants' fields: harness.cases.variants."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="unique within the file; ids derive from it")
    num_q_heads: Int = Field(ge=1, le=512)
    num_kv_heads: Int | None = Field(default=None, ge=1, le=512, description="give this or gqa_ratio")
    gqa_ratio: Int | None = Field(default=None, ge=1, le=512, description="num_q_heads // num_kv_heads")
    head_dim: Int = Field(ge=MIN_HEAD_DIM, le=MAX_HEAD_DIM)
    block_size: Int = Field(default=16, ge=MIN_BLOCK_SIZE, le=MAX_BLOCK_SIZE)
    seq_lens: (
        Annotated[list[Annotated[Length, Field(ge=1)]], Field(min_length=1, max_length=MAX_SEQS)] | SeqLenGenerator
    ) = Field(description="KV length per sequence, or a generator")
    q_lens: Length | list[Length] | QLenGenerator = Field(default=1, description="queries per sequence; 1 is decode")
    dtype: DTypeName = "float32"
    layout: vocab.Layout = "shuffled"
    input_scale: Float = Field(
        default=1.0, gt=0, le=1e4, description="q and K are scaled by it: logits grow as its square"
    )
    seed: Int = Field(default=0, ge=0, le=vocab.INT64_MAX)
    timeout_s: Float | None = Field(default=None, gt=0, description="per-call time limit of isolated backends")
    tolerance: dict[DTypeName, Tolerance] = Field(default_factory=dict, description="per-dtype overrides")
    backends: list[str] | None = Field(default=None, description="only these backends (default: all)")
    exclude_backends: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    sweep: dict[str, Annotated[list[Any], Field(min_length=1)]] = Field(
        default_factory=dict, description="field -> values, expanded as a product"
    )

    @field_validator("sweep")
    @classmethod
    def _sweepable(cls, value: dict[str, list[Any]]):
        for key in value:
            if key in ("name", "sweep") or key not in cls.model_fields:
                raise ValueError(f"cannot sweep {key!r}: not a case field{did_you_mean(key, cls.model_fields)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "CaseSpec":
        if self.sweep:  # checked per expanded point instead
            return self
        kv = self.resolved_num_kv_heads()
        if self.num_q_heads % kv:
            raise FieldError(
                "num_q_heads", f"num_q_heads ({self.num_q_heads}) must be a multiple of num_kv_heads ({kv})"
            )
        if isinstance(self.q_lens, list):
            if not isinstance(self.seq_lens, list) or len(self.q_lens) != len(self.seq_lens):
                raise FieldError("q_lens", "a q_lens list needs an explicit seq_lens list of the same length")
            for i, (q, s) in enumerate(zip(self.q_lens, self.seq_lens, strict=True)):
                if not 0 <= q <= s:
                    raise FieldError("q_lens", f"q_lens[{i}] = {q} must be between 0 and seq_lens[{i}] = {s}")
        elif isinstance(self.q_lens, int):
            shortest = min(self.seq_lens) if isinstance(self.seq_lens, list) else self.seq_lens.min
            if not 0 <= self.q_lens <= shortest:
                raise FieldError(
                    "q_lens", f"q_lens = {self.q_lens} must be between 0 and the shortest seq_len ({shortest})"
                )
        if isinstance(self.sinks, list) and len(self.sinks) != self.num_q_heads:
            raise FieldError(
                "sinks", f"sinks has {len(self.sinks)} values; it needs one per query head ({self.num_q_heads})"
            )
        if self.cascade:
            self._check_cascade()
        if self.kv_scale is not None and self.kv_dtype is None:
            raise FieldError("kv_scale", "kv_scale needs an fp8 kv_dtype (float8_e4m3fn or float8_e5m2)")
        if self.latent_kv and (self.head_dim_v is None or self.head_dim_v >= self.head_dim or self.kv_dtype):
            raise FieldError("latent_kv", "latent_kv = true needs head_dim_v below head_dim (V is K's first "
                             "head_dim_v columns) and a cache in q's dtype (no kv_dtype)")  # fmt: skip
        return self

    def _check_cascade(self) -> None:
        """A cascade needs a shared prefix that every query sits after, and no position-dependent option."""
        if self.layout != "shared_prefix":
            raise FieldError("cascade", f"cascade = true needs layout = 'shared_prefix', got {self.layout!r}")
        if self.sliding_window is not None or self.alibi:
            raise FieldError(
                "cascade", "cascade = true cannot take sliding_window or alibi (they need absolute positions)"
            )
        seq, q = _lengths(self)
        prefix = shared_prefix_blocks(seq, self.block_size, self.layout) * self.block_size
        if prefix == 0:
            raise FieldError("cascade", "cascade = true needs two or more sequences sharing at least one block")
        for i, (n, m) in enumerate(zip(seq, q, strict=True)):
            if n - m < prefix:
                raise FieldError("cascade", f"sequence {i} (seq_len {n}, q_len {m}) has a query inside the shared "
                                 f"prefix of {prefix} keys")  # fmt: skip

    def resolved_num_kv_heads(self) -> int:
        if (self.num_kv_heads is None) == (self.gqa_ratio is None):
            raise FieldError("num_kv_heads", "give exactly one of num_kv_heads and gqa_ratio")
        if self.num_kv_heads is not None:
            return self.num_kv_heads
        if self.num_q_heads % self.gqa_ratio:
            raise FieldError("gqa_ratio", f"gqa_ratio ({self.gqa_ratio}) must divide num_q_heads ({self.num_q_heads})")
        return self.num_q_heads // self.gqa_ratio


@dataclass(frozen=True)
class Case:
    """One expanded, validated case; ``spec``'s fields read through (``case.head_dim`` is ``case.spec.head_dim``)."""

    id: str
    file: str
    spec: CaseSpec = dataclass_field(repr=False, hash=False)
    num_kv_heads: int  # given, or num_q_heads // gqa_ratio
    seq_lens: tuple[int, ...]  # materialized from a list or a seeded generator
    q_lens: tuple[int, ...]
    sinks: tuple[float, ...] | None  # one per query head, materialized from the case file
    atol: float  # the dtype's default (harness.run.grading) or the case file's override
    rtol: float
    head_dim_v: int  # V's and the output's head dim: given, or head_dim (MLA: 512 under K's 576)

    def __getattr__(self, name: str) -> Any:
        """A case-file field not materialized above: ``head_dim``, ``dtype``, ``layout``, ``seed``, ..."""
        if name.startswith("_") or name == "spec":  # copy and pickle probe before ``spec`` exists
            raise AttributeError(name)
        return getattr(self.spec, name)

    def __str__(self) -> str:
        return self.id

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens)

    @property
    def group_size(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def element_bytes(self) -> int:
        return torch.finfo(getattr(torch, self.dtype)).bits // 8

    @property
    def kv_element_bytes(self) -> int:
        return 1 if self.kv_dtype is not None else self.element_bytes

    @property
    def blocks_needed(self) -> int:
        """Blocks that hold every sequence unshared: sum of ceil(seq_len / block_size)."""
        return sum(cdiv(n, self.block_size) for n in self.seq_lens)

    @property
    def variants(self) -> frozenset[str]:
        """The variants this case turns on (harness.cases.variants): what a backend must declare to run it."""
        return turned_on(self)

    def variant_fields(self) -> dict[str, Any]:
        """The variant arguments of harness.cases.inputs.make_inputs: every variant's case fields, by name."""
        return {name: getattr(self, name) for name in CASE_FIELDS}

    @property
    def prefix_blocks(self) -> int:
        return shared_prefix_blocks(self.seq_lens, self.block_size, self.layout)

    def wants(self, backend: str) -> bool:
        return (self.backends is None or backend in self.backends) and backend not in self.exclude_backends


def _lengths(spec: CaseSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
    gen = torch.Generator().manual_seed(spec.seed)
    if isinstance(spec.seq_lens, SeqLenGenerator):
        g = spec.seq_lens
        if g.distribution == "fixed":
            seq = [g.max] * g.count
        elif g.distribution == "uniform":
            seq = torch.randint(g.min, g.max + 1, (g.count,), generator=gen).tolist()
        else:  # lognormal around the geometric mean, most mass inside [min, max]
            mu, sigma = math.log(math.sqrt(g.min * g.max)), max(math.log(g.max / g.min) / 4, 1e-6)
            draws = torch.exp(mu + sigma * torch.randn(g.count, generator=gen, dtype=torch.float64))
            seq = draws.round().clamp(g.min, g.max).long().tolist()
    else:
        seq = list(spec.seq_lens)
    if isinstance(spec.q_lens, int):
        q = [spec.q_lens] * len(seq)
    elif isinstance(spec.q_lens, list):
        q = list(spec.q_lens)
    else:
        q = [int(torch.randint(min(spec.q_lens.min, n), min(spec.q_lens.max, n) + 1, (1,), generator=gen)) for n in seq]
    return tuple(seq), tuple(q)


def _sinks(spec: CaseSpec) -> tuple[float, ...] | None:
    """The case's sinks: its list, or ``mean + scale * N(0, 1)`` per query head drawn from its seed."""
    if spec.sinks is None or isinstance(spec.sinks, list):
        return None if spec.sinks is None else tuple(float(x) for x in spec.sinks)
    draws = torch.randn(spec.num_q_heads, generator=torch.Generator().manual_seed(spec.seed), dtype=torch.float64)
    return tuple(float(x) for x in (spec.sinks.mean + spec.sinks.scale * draws).to(torch.float32))


def _point_id(name: str, point: dict[str, Any]) -> str:
    def short(value: Any) -> str:
        if isinstance(value, list):
            if len(value) <= 4:
                return "x".join(map(str, value))
            digest = hashlib.sha1(json.dumps(value, sort_keys=True).encode()).hexdigest()[:6]
            return f"{len(value)}seqs-{digest}"  # two lists of the same length keep distinct ids
        return "-".join(f"{k}{v}" for k, v in value.items()) if isinstance(value, dict) else str(value)

    return "/".join([name, *(f"{k}={short(v)}" for k, v in point.items())])


def did_you_mean(key: str, known) -> str:
    """A suggestion, "; did you mean 'dtype'?", when ``key`` is a near miss of one of ``known`` (difflib); '' if none."""
    close = difflib.get_close_matches(key, [k for k in known if k != key], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


# The fields a table nested under a case field may hold, for the suggestion on an unknown one.
_NESTED_FIELDS = {"seq_lens": SeqLenGenerator, "q_lens": QLenGenerator, "tolerance": Tolerance}
_SHALLOW = {"int_type", "float_type", "list_type", "dict_type", "model_type", "model_attributes_type", "bool_type"}


def _unknown_field(path: str) -> str:
    """The message for a key no model declares: "not a case field", with a near miss suggested."""
    *parent, key = path.split(".")
    model = _NESTED_FIELDS.get(parent[0]) if parent else CaseSpec
    what = "a case field" if not parent else f"a field of {'.'.join(parent)}"
    return f"not {what}{did_you_mean(key, model.model_fields) if model else ''}"


def _format_errors(file: str, case_id: str, error: ValidationError,
                   inherited: frozenset[str] = frozenset()) -> list[str]:  # fmt: skip
    """One line per field (file, case id, field path, message) in a case author's words: of a union's failures
    the member past the type check wins, else one line lists what it may be; a ``[defaults]`` field says so."""

    def at_union_tag(item: dict) -> bool:  # a type mismatch with one member of a union
        last = item["loc"][-1] if item["loc"] else None
        return item["type"] in _SHALLOW and isinstance(last, str) and vocab.field_path((last,)) == ""

    by_top: dict[str, list[dict]] = {}
    for item in error.errors():
        by_top.setdefault(str(item["loc"][0]) if item["loc"] else "", []).append(item)
    lines = []
    for items in by_top.values():
        meant = [i for i in items if not at_union_tag(i)]
        if not meant:  # no member's type fits: one line listing what the value may be
            items = [{**items[0], "msg": " or ".join(dict.fromkeys(i["msg"] for i in items))}]
        for item in meant or items:
            cause = item.get("ctx", {}).get("error")
            field = vocab.field_path(item["loc"]) or getattr(cause, "field", "(case)")
            # pydantic's class names and "Value error, " prefix mean nothing here
            message = re.sub(r" or instance of \w+|^Value error, ", "", item["msg"])
            if item["type"] == "extra_forbidden":
                message = _unknown_field(field)
            where = " (set in [defaults])" if field.split(".")[0] in inherited else ""
            lines.append(f"{file}: case '{case_id}': field '{field}'{where}: {message}")
    return list(dict.fromkeys(lines))


def expand_spec(raw: dict[str, Any], file: str, inherited: frozenset[str] = frozenset()) -> list[Case]:
    """Validate one ``[[case]]`` table (defaults merged in; ``inherited``: the fields from them), expand its sweep."""
    name = str(raw.get("name", "?"))
    try:
        spec = CaseSpec.model_validate(raw)
    except ValidationError as error:
        raise CaseFileError("\n".join(_format_errors(file, name, error, inherited))) from None
    cases, errors = [], []
    for values in itertools.product(*spec.sweep.values()):  # one empty point when nothing is swept
        point = dict(zip(spec.sweep, values, strict=True))
        case_id = _point_id(spec.name, point)
        try:
            p = CaseSpec.model_validate({**raw, **point, "sweep": {}})
        except ValidationError as error:
            errors.extend(_format_errors(file, case_id, error, inherited - set(point)))
            continue
        seq, q = _lengths(p)
        atol, rtol = vocab.DEFAULT_TOLERANCES[p.dtype]
        if p.kv_dtype is not None:
            atol, rtol = vocab.FP8_KV_TOLERANCES.get(p.dtype, (atol, rtol))
        if p.dtype in p.tolerance:
            atol, rtol = p.tolerance[p.dtype].atol, p.tolerance[p.dtype].rtol
        head_dim_v = p.head_dim if p.head_dim_v is None else p.head_dim_v
        cases.append(Case(id=case_id, file=file, spec=p, num_kv_heads=p.resolved_num_kv_heads(), seq_lens=seq,
                          q_lens=q, sinks=_sinks(p), atol=atol, rtol=rtol, head_dim_v=head_dim_v))  # fmt: skip
    if errors:
        raise CaseFileError("\n".join(errors))
    return cases


def load_case_file(path: str | Path) -> list[Case]:
    path = Path(path)
    file = str(path)
    try:
        data = tomllib.loads(_read_case_text(path))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise CaseFileError(f"{file}: not valid TOML: {error}") from None
    except RecursionError:
        raise CaseFileError(f"{file}: not valid TOML: nested too deeply") from None
    if unknown := set(data) - {"defaults", "case"}:
        raise CaseFileError(f"{file}: unknown top-level key(s) {sorted(unknown)}; expected [defaults] and [[case]]")
    defaults = data.get("defaults", {})
    tables = data.get("case", [])
    if (not isinstance(defaults, dict) or not isinstance(tables, list) or not tables
            or not all(isinstance(t, dict) for t in tables)):  # fmt: skip
        raise CaseFileError(f"{file}: needs at least one [[case]] table (and [defaults] must be a table)")
    defaults, errors = known_defaults(file, defaults)
    count_sweep_points(file, [{**defaults, **table} for table in tables])
    cases: list[Case] = []
    for table in tables:
        try:
            cases.extend(expand_spec({**defaults, **table}, file, frozenset(defaults) - set(table)))
        except CaseFileError as error:
            errors.append(str(error))
    counts = collections.Counter(case.id for case in cases)
    errors += [f"{file}: case '{id_}': field 'name': the same id appears twice" for id_, n in counts.items() if n > 1]
    if errors:
        raise CaseFileError("\n".join(errors))
    return cases


def known_defaults(file: str, defaults: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``[defaults]`` without the keys (and sweep keys) that are no case field, and a line for each naming the
    table, with a near miss suggested (said once, not for every case it is merged into)."""
    lines = [f"{file}: [defaults]: field '{key}': {_unknown_field(str(key))}" for key in defaults
             if key not in CaseSpec.model_fields]  # fmt: skip
    known = {key: value for key, value in defaults.items() if key in CaseSpec.model_fields}
    if isinstance(sweep := known.get("sweep"), dict):
        bad = [key for key in sweep if key in ("name", "sweep") or key not in CaseSpec.model_fields]
        lines += [f"{file}: [defaults]: field 'sweep': cannot sweep '{key}': {_unknown_field(str(key))}" for key in bad]
        known["sweep"] = {key: values for key, values in sweep.items() if key not in bad}
    return known, lines


def max_sweep_points() -> int:
    """The most sweep points a case file may expand to: ``$HARNESS_MAX_SWEEP_POINTS``, else MAX_SWEEP_POINTS."""
    value = os.environ.get(ENV_MAX_SWEEP_POINTS, "").strip()
    if not value:
        return MAX_SWEEP_POINTS
    if not value.isdigit() or int(value) < 1:
        raise CaseFileError(
            f"{ENV_MAX_SWEEP_POINTS}={value!r}: give a positive integer (the default is {MAX_SWEEP_POINTS})"
        )
    return int(value)


def _sequences(seq_lens) -> int:
    """How many sequences a raw ``seq_lens`` value (a list or a generator table) gives, before validation."""
    if isinstance(seq_lens, list):
        return len(seq_lens)
    count = seq_lens.get("count") if isinstance(seq_lens, dict) else None
    return count if isinstance(count, int) and count > 0 else 1


def count_sweep_points(file: str, tables: list[dict[str, Any]]) -> None:
    """Count the cases ``tables`` (with defaults merged) expand to from the sweep lists' lengths, without
    building any; CaseFileError, with the count per field, past :func:`max_sweep_points`."""
    limit, shapes, sequences = max_sweep_points(), [], []
    for table in tables:
        sweep = table.get("sweep")
        lengths = {str(k): len(v) for k, v in sweep.items() if isinstance(v, list)} if isinstance(sweep, dict) else {}
        points = math.prod(lengths.values())
        if lengths:
            shapes.append((str(table.get("name", "?")), points, lengths))
        swept = sweep.get("seq_lens") if isinstance(sweep, dict) else None
        each = max(_sequences(v) for v in [table.get("seq_lens"), *(swept if isinstance(swept, list) else [])])
        sequences.append((points * each, str(table.get("name", "?")), points, each))
    if (total := sum(points for _, _, points, _ in sequences)) > limit:
        worst = sorted(shapes, key=lambda shape: -shape[1])[:3]
        detail = "; ".join(f"case '{name}': {points:,} = " + " x ".join(f"{field} {n}" for field, n in lengths.items())
                           for name, points, lengths in worst)  # fmt: skip
        raise CaseFileError(
            f"{file}: field 'sweep': {total:,} cases, more than the limit of {limit:,} a file ({detail}); "
            f"split the file, or raise the limit with --max-sweep-points or {ENV_MAX_SWEEP_POINTS}"
        )
    if sum(s[0] for s in sequences) > limit * SEQUENCES_PER_POINT:
        _, name, points, each = max(sequences)
        raise CaseFileError(
            f"{file}: case '{name}': field 'seq_lens': {points:,} case(s) of up to {each:,} sequences bring the "
            f"file past {limit * SEQUENCES_PER_POINT:,} sequences in all ({SEQUENCES_PER_POINT} a point of the "
            f"limit of {limit:,}); split the file, or raise the limit with --max-sweep-points or {ENV_MAX_SWEEP_POINTS}"
        )


def _read_case_text(path: Path) -> str:
    """The text of a regular file of at most MAX_FILE_BYTES; CaseFileError for anything else (a FIFO blocks)."""
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            raise CaseFileError(
                f"{path}: is a directory, not a case file (a folder given to run stands for its *.toml)"
            )
        if not stat.S_ISREG(info.st_mode):
            raise CaseFileError(f"{path}: not a regular file (a FIFO, device or socket); give a .toml file")
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise CaseFileError(f"{path}: no such case file") from None
    except OSError as error:
        raise CaseFileError(f"{path}: cannot read it: {error.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise CaseFileError(f"{path}: larger than {MAX_FILE_BYTES // 2**20} MiB; not a case file")
    return data.decode("utf-8")


def resolve_case_paths(paths: list[str | Path]) -> list[Path]:
    """Files as given; a directory stands for its *.toml, sorted (CaseFileError if none); a repeat is read once."""
    seen: dict[Path, Path] = {}  # resolved -> as given, in order
    for p in map(Path, paths):
        found = sorted(p.glob("*.toml")) if p.is_dir() else [p]
        if p.is_dir() and not found:
            raise CaseFileError(f"{p}: a directory with no *.toml case files in it")
        for f in found:
            key = f.resolve() if f.exists() else f
            if key in seen:
                print(f"note: {f} is given twice (as {seen[key]}); its cases are read once", file=sys.stderr)
                continue
            seen[key] = f
    return list(seen.values())


def check_backend_names(cases: list[Case], registered: list[str]) -> None:
    """CaseFileError naming file, case and field for each unregistered name in ``(exclude_)backends`` (after plugins)."""
    errors = [f"{case.file}: case '{case.id}': field '{field}': unknown backend {name!r}; registered: "
              f"{', '.join(registered)}" for case in cases
              for field, names in (("backends", case.backends or ()), ("exclude_backends", case.exclude_backends))
              for name in names if name not in registered]  # fmt: skip
    if errors:
        raise CaseFileError("\n".join(dict.fromkeys(errors)))


def case_file_schema() -> dict[str, Any]:
    """JSON Schema of a case file, for editors (taplo, VS Code Even Better TOML)."""
    case_schema = CaseSpec.model_json_schema()
    defs = case_schema.pop("$defs", {})
    defaults = {**case_schema, "required": [], "title": "Defaults"}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "Paged-attention harness case file",
            "type": "object", "additionalProperties": False,
            "properties": {"defaults": defaults, "case": {"type": "array", "minItems": 1, "items": case_schema}},
            "required": ["case"], "$defs": defs}  # fmt: skip
