"""YAML with locations: loading an experiment file so that every value knows
its file and line, `--set key.path=value` overrides, `${a.b}` interpolation,
and dumping the resolved result back.

The experiment schema lives in `estimator.experiment`; this module only knows
about YAML trees. Every problem is an `ExperimentError` naming where it is
(`file:line`, or the `--set` that introduced the value), the key path and the fix.
"""
from __future__ import annotations

import copy
import logging
import os
import re
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import yaml

Path = Tuple[Any, ...]   # keys (str) and list indices (int) from the root


class Location(NamedTuple):
    """Where a value came from: `source` is a file path or `--set k=v`; `line` is 1-based."""

    source: str
    line: Optional[int] = None

    def __str__(self):
        return f"{self.source}:{self.line}" if self.line else self.source


class Problem(NamedTuple):
    location: Location
    path: str          # e.g. "train_spec.hooks[0].LoggingTensorHook"
    message: str       # what is wrong and the fix

    def __str__(self):
        return f"{self.location}: {self.path}: {self.message}" if self.path else \
            f"{self.location}: {self.message}"


class ExperimentError(ValueError):
    """An experiment file (or an override) is wrong. `problems` lists each
    mistake with its location, key path and fix; `str()` gives one per line."""

    def __init__(self, problems: List[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


def format_path(path: Path) -> str:
    """("train_spec", "hooks", 0, "X") -> "train_spec.hooks[0].X"; a key with
    a dot or bracket in it (a hook named by import path) is quoted."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        key = f'"{part}"' if re.search(r"[.\[\]]", str(part)) else str(part)
        out += f".{key}" if out else key
    return out


_PIECE = re.compile(r"""(?:"([^"]*)"|'([^']*)'|([^.\[\]"']*))((?:\[\d+\])*)""")


def parse_path(text: str) -> Path:
    """"train_spec.hooks[0].X" or "train_spec.hooks.0.X" -> ("train_spec", "hooks", 0, "X");
    a key with dots in it quoted: 'train_spec.hooks[0]."mypkg.hooks:MyHook".every'."""
    parts: List[Any] = []
    pos = 0
    while True:
        m = _PIECE.match(text, pos)
        quoted = m.group(1) if m.group(1) is not None else m.group(2)
        bare, indices = m.group(3), m.group(4)
        if quoted is None and not bare and not indices:
            raise ValueError(f"malformed key path {text!r}")
        if quoted is not None:
            parts.append(quoted)
        elif bare:
            parts.append(int(bare) if bare.isdigit() else bare)
        parts += [int(i) for i in re.findall(r"\[(\d+)\]", indices)]
        pos = m.end()
        if pos == len(text):
            return tuple(parts)
        if text[pos] != ".":
            raise ValueError(f"malformed key path {text!r}")
        pos += 1


logger = logging.getLogger(__name__)


# -- loading -------------------------------------------------------------------------
class _Loader(yaml.SafeLoader):
    """SafeLoader (no Python objects) that also reads `1e-3` as a float, as YAML 1.2."""


_FLOAT_1_2 = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2, list("-+0123456789"))


class Tree:
    """A plain YAML value (`data`) plus the location of every key path in it,
    and the `problems` found reading it (duplicate keys, tags: reported with
    the file's other mistakes, all at once)."""

    def __init__(self, data: Any, marks: Dict[Path, Location], source: str,
                 problems: Sequence[Problem] = ()):
        self.data = data
        self.marks = marks
        self.source = source
        self.problems = list(problems)

    def where(self, path: Path) -> Location:
        """The location of `path`, or of its nearest ancestor that has one."""
        path = tuple(path)
        while path not in self.marks and path:
            path = path[:-1]
        return self.marks.get(path, Location(self.source, 1))

    def get(self, path: Path, default=None):
        node = self.data
        for part in path:
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                node = node[part]
            else:
                return default
        return node


def _line_without_colon(error: yaml.MarkedYAMLError, lines: list, opened) -> Optional[int]:
    """The index of the line of a mapping that has no ':' (`lr 0.1`), where
    PyYAML's error is about the line after it: a key it could not finish
    there, or the next key's ':' taken for a second one on a line."""
    if error.context == "while scanning a simple key" and opened is not None:
        return opened.line if opened.line < len(lines) else None
    mark = error.problem_mark
    if mark is None or not (error.problem == "mapping values are not allowed here" or (
            error.problem or "").startswith("expected <block end>")):
        return None
    before = [i for i in range(min(mark.line, len(lines))) if lines[i].strip()
              and not lines[i].lstrip().startswith("#")]
    if not before:
        return None
    line = lines[before[-1]].split(" #")[0].strip()
    return before[-1] if ":" not in line and not line.startswith(("-", "[", "{")) else None


def _syntax_error(source: str, text: str, error: yaml.MarkedYAMLError) -> ExperimentError:
    mark, opened = error.problem_mark or error.context_mark, error.context_mark
    what = error.problem or error.context or "cannot parse"
    earlier = opened is not None and mark is not None and opened.line < mark.line
    context = ""
    if error.context and error.problem:
        context = f" ({error.context}" + (
            f" started on line {opened.line + 1}" if earlier else "") + ")"
    column = f" at column {mark.column + 1}" if mark else ""
    lines = text.splitlines()
    marked = [lines[m.line] for m in (mark, opened) if m and m.line < len(lines)]
    no_colon = _line_without_colon(error, lines, opened if earlier else None)
    if no_colon is not None:   # (PyYAML says so at the next line)
        return ExperimentError([Problem(Location(source, no_colon + 1), "", (
            f"malformed YAML: {lines[no_colon].strip()!r} is not a 'key: value' pair; put "
            "': ' after the key (or, for a value continued from the line above, indent it "
            "under that key)"))])
    if any("${" in line for line in marked):
        fix = ("quote a ${...} reference inside {...} or [...] ('${a.b}'): unquoted, its "
               "braces are YAML's")
    elif "'\\t'" in what:
        fix = "indent with spaces: YAML does not take tabs for indentation"
    elif earlier and "flow" in error.context:   # (a bracket left open)
        fix = (f"close the bracket opened on line {opened.line + 1}, or fix the YAML syntax "
               "on this line")
    else:
        fix = ("fix the YAML syntax on this line (indentation, ':' after each key, closed "
               "quotes and brackets)")
    return ExperimentError([Problem(Location(source, mark.line + 1 if mark else None), "",
                                    f"malformed YAML: {what}{context}{column}; {fix}")])


# What an experiment file may hold: far more than any real one, far less than
# what would exhaust memory or the stack (an alias bomb, deep nesting).
MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_VALUES = 100_000


class _TooMany(Exception):
    """Aliases expand past MAX_VALUES values; `node` is where it happened."""

    def __init__(self, node):
        super().__init__()
        self.node = node


def _limit(text: str, source: str) -> None:
    """Size and nesting depth, checked on the event stream (no recursion)."""
    if len(text) > MAX_BYTES:
        raise ExperimentError([Problem(Location(source, 1), "", (
            f"the file holds {len(text)} characters; experiment files are limited to "
            f"{MAX_BYTES} (keep data in files the input_fn reads)"))])
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise ExperimentError([Problem(Location(source, event.start_mark.line + 1), "",
                                               f"nested more than {MAX_DEPTH} levels deep; "
                                               "experiment files are flat configuration")])
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def load_text(text: str, source: str) -> Tree:
    """Parse YAML text into a Tree; syntax errors and files past the limits
    (size, depth, alias expansion) are ExperimentErrors located in `source`,
    duplicate keys and unsafe tags the Tree's `problems`."""
    loader = _Loader(text)
    try:
        try:
            _limit(text, source)
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as e:
            raise _syntax_error(source, text, e) from None
        marks: Dict[Path, Location] = {}
        problems: List[Problem] = []
        if node is None:
            return Tree(None, {(): Location(source, 1)}, source)
        try:
            data = _build(loader, node, (), marks, source, problems, [MAX_VALUES])
        except _TooMany as e:
            raise ExperimentError([Problem(Location(source, e.node.start_mark.line + 1), "", (
                f"its aliases expand to more than {MAX_VALUES} values (an alias bomb?); "
                "write the values out or use fewer nested aliases"))]) from None
    finally:
        loader.dispose()
    return Tree(data, marks, source, problems)


def load_file(path: str) -> Tree:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ExperimentError([Problem(Location(path), "", "no such experiment file; check the "
                                       "path (relative to the current directory "
                                       f"{os.getcwd()})")]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ExperimentError([Problem(Location(path), "", f"cannot read the experiment file: "
                                       f"{e}")]) from None
    return load_text(text, path)


_PLAIN_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")


def _build(loader, node, path: Path, marks, source, problems, budget):
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooMany(node)
    marks[path] = Location(source, node.start_mark.line + 1)
    if not isinstance(node, yaml.ScalarNode) and node.tag not in _PLAIN_TAGS:
        problems.append(Problem(marks[path], format_path(path),
                                f"the tag {node.tag!r} is not allowed; experiment files hold "
                                "plain YAML values only (no Python tags)"))
        return None
    if isinstance(node, yaml.MappingNode):
        seen: Dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or \
                    not isinstance(key_node, yaml.ScalarNode):
                continue
            key, line = key_node.value, key_node.start_mark.line + 1
            if key in seen:
                problems.append(Problem(Location(source, line), format_path(path + (key,)),
                                        f"duplicate key (first given on line {seen[key]}); "
                                        "keep only one of them"))
            seen.setdefault(key, line)
        loader.flatten_mapping(node)   # YAML merge keys (<<: *anchor)
        out = {}
        for key_node, value_node in node.value:
            key = _scalar(loader, key_node, path, source, problems, warn=False)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                problems.append(Problem(Location(source, key_node.start_mark.line + 1),
                                        format_path(path), "keys must be plain names"))
                continue
            if isinstance(key, bool) or key is None:
                # YAML 1.1 reads `on:`/`yes:`/`null:` keys as booleans/None; keep their text
                key = key_node.value
            out[key] = _build(loader, value_node, path + (key,), marks, source, problems,
                              budget)
            marks[path + (key,)] = Location(source, key_node.start_mark.line + 1)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(loader, item, path + (i,), marks, source, problems, budget)
                for i, item in enumerate(node.value)]
    return _scalar(loader, node, path, source, problems)


_OCTAL_1_1 = re.compile(r"^[-+]?0[0-7_]+$")
_TAGS = "tag:yaml.org,2002:"


def _retyped(node, value) -> Optional[str]:
    """What YAML 1.1 made of plain scalar `node` (`value`) where YAML 1.2 and
    most readers take it otherwise: `no`/`on` booleans, `0123` octal, `12:30`
    base 60, `2024-01-02` a date."""
    if node.style is not None or isinstance(value, str):
        return None
    text, tag = node.value, node.tag[len(_TAGS):] if node.tag.startswith(_TAGS) else ""
    if tag == "bool" and text.lower() not in ("true", "false"):
        return f"{text} is read as the boolean {str(value).lower()} (YAML 1.1)"
    if tag == "int" and _OCTAL_1_1.match(text) and value != int(text.replace("_", ""), 10):
        return f"{text} is read as the octal number {value} (YAML 1.1)"
    if tag in ("int", "float") and ":" in text:
        return f"{text} is read as the base-60 number {value} (YAML 1.1)"
    if tag == "timestamp":
        return f"{text} is read as the date {value!r} (YAML 1.1)"
    return None


def _warn_retyped(loader, node, where: str, path: Path) -> None:
    """Warn of each plain scalar under `node` (values, not keys) that YAML 1.1
    reads otherwise than YAML 1.2; `where`: the file and line, or the --set."""
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _warn_retyped(loader, item, where, path + (i,))
    elif isinstance(node, yaml.MappingNode):
        for key, item in node.value:
            _warn_retyped(loader, item, where, path + (key.value,))
    elif isinstance(node, yaml.ScalarNode):
        said = _retyped(node, loader.construct_object(node))
        if said:
            at = f"{where}: {format_path(path)}" if path else where
            logger.warning("%s: %s; quote it ('%s') for the text as written", at, said,
                           node.value)


def _scalar(loader, node, path, source, problems, warn=True):
    if not isinstance(node, yaml.ScalarNode):
        problems.append(Problem(Location(source, node.start_mark.line + 1), format_path(path),
                                "a key must be a plain name, not a list or mapping"))
        return None
    try:
        value = loader.construct_object(node, deep=True)
        if warn:
            _warn_retyped(loader, node, str(Location(source, node.start_mark.line + 1)), path)
        return value
    except yaml.constructor.ConstructorError as e:
        problems.append(Problem(Location(source, node.start_mark.line + 1), format_path(path),
                                f"{e.problem}; experiment files hold plain YAML values only "
                                "(no Python tags)"))
        return None


# -- overrides -----------------------------------------------------------------------
def parse_scalar(text: str, source: str):
    """A `--set` value read as YAML (`100` int, `1e-3` float, `true`, `[16, 16]`, `null`)."""
    try:
        if not text.strip():
            return ""
        loader = _Loader(text)
        node = loader.get_single_node()
        value = loader.construct_document(node) if node is not None else None
        if node is not None and source:   # (not a hint's own reading of a value)
            _warn_retyped(_Loader(""), node, source, ())
        return value
    except yaml.YAMLError as e:
        raise ExperimentError([Problem(Location(source), "", f"the value is not valid YAML "
                                       f"({getattr(e, 'problem', e)}); quote it, e.g. "
                                       f"--set key='text'")]) from None


def apply_override(tree: Tree, text: str) -> None:
    """Apply one `key.path=value` to `tree` in place; the new values are located
    at `--set key.path=value`."""
    source = f"--set {text}"
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ExperimentError([Problem(Location(source), "", "expected --set key.path=value, "
                                       "e.g. --set train_spec.max_steps=100")])
    try:
        path = parse_path(key)
    except ValueError as e:
        raise ExperimentError([Problem(Location(source), "", f"{e}; write the path as dotted "
                                       "keys, e.g. train_spec.hooks[0].LoggingTensorHook")]) \
            from None
    value = parse_scalar(raw, source)
    if tree.data is None:
        tree.data = {}
    node = tree.data
    for i, part in enumerate(path[:-1]):
        where = format_path(path[:i]) or "the top level"
        if isinstance(node, dict):
            _check_component_name(node, path, i, source)
            if part not in node or node[part] is None:
                if isinstance(path[i + 1], int):
                    raise ExperimentError([Problem(Location(source), format_path(path[:i + 1]),
                                                   f"{format_path(path[:i + 1])} is not in the "
                                                   f"experiment, so it has no item "
                                                   f"[{path[i + 1]}]; set the whole list, e.g. "
                                                   f"--set '{format_path(path[:i + 1])}=[...]'")])
                node[part] = {}
            node = node[part]
        elif isinstance(node, list):
            if not isinstance(part, int) or not 0 <= part < len(node):
                raise ExperimentError([Problem(Location(source), format_path(path[:i + 1]),
                                               f"{where} is a list of {len(node)} items; index "
                                               f"it with 0..{len(node) - 1}")])
            node = node[part]
        else:
            raise ExperimentError([Problem(Location(source), format_path(path[:i + 1]),
                                           f"{where} is {_kind(node)}, not a mapping; set "
                                           f"{where} itself instead")])
    last = path[-1]
    if isinstance(node, list):
        if not isinstance(last, int) or not 0 <= last < len(node):
            raise ExperimentError([Problem(Location(source), format_path(path),
                                           f"{format_path(path[:-1])} is a list of {len(node)} "
                                           f"items; index it with 0..{len(node) - 1}")])
    elif not isinstance(node, dict):
        raise ExperimentError([Problem(Location(source), format_path(path),
                                       f"{format_path(path[:-1])} is {_kind(node)}, not a "
                                       "mapping; set it as a whole instead")])
    else:
        _check_component_name(node, path, len(path) - 1, source)
    node[last] = value
    for p in [p for p in tree.marks if p[:len(path)] == path]:
        del tree.marks[p]
    for i in range(1, len(path) + 1):
        tree.marks.setdefault(path[:i], Location(source))
    _mark_all(value, path, tree.marks, Location(source))


def _check_component_name(node: dict, path: Path, i: int, source: str) -> None:
    """A list item `Name: {arguments}` (a hook, an exporter) reached by
    another name at path[i]: a misspelt name, which would add a second key."""
    if i == 0 or not isinstance(path[i - 1], int) or len(node) != 1 or path[i] in node:
        return
    (name,) = node
    fixed = format_path(path[:i] + (name,) + path[i + 1:])
    raise ExperimentError([Problem(Location(source), format_path(path[:i + 1]),
                                   f"{format_path(path[:i])} is {format_path((name,))}, not "
                                   f"{format_path((path[i],))}; did you mean --set "
                                   f"{fixed}=...? (to replace the item, set "
                                   f"{format_path(path[:i])} itself)")])


def _mark_all(value, path, marks, location):
    marks[path] = location
    if isinstance(value, dict):
        for k, v in value.items():
            _mark_all(v, path + (k,), marks, location)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _mark_all(v, path + (i,), marks, location)


def _kind(value) -> str:
    if value is None:
        return "null"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


# -- interpolation ---------------------------------------------------------------------
_REF = re.compile(r"\$(\$?)\{([^{}]*)\}")
_REF_OR_ESCAPED = re.compile(r"\$(\$?)\{([^{}]*)\}|\$\$\{")   # ($${ alone: a literal ${)


def interpolate(tree: Tree, suggest) -> List[Tuple[Problem, Optional[Path]]]:
    """Replace `${a.b}` with the value at key path a.b (keeping its type when the
    string is only the reference), `${env:NAME}` / `${env:NAME:-default}` with an
    environment variable; `$${...}` is a literal `${...}`. In place. Returns
    the references that failed, each (problem, the key path missing or None),
    their values left as written."""
    interpolator = _Interpolator(tree, suggest)
    interpolator.run()
    return interpolator.failed


class _Unresolved(ExperimentError):
    """A reference to a key path that is not there (`missing`: the path as
    far as the first key absent)."""

    def __init__(self, problems: List[Problem], missing: Path):
        super().__init__(problems)
        self.missing = missing


class _Interpolator:
    def __init__(self, tree: Tree, suggest):
        self.tree = tree
        self.suggest = suggest          # (path, missing key) -> " did you mean ...?" text
        self.done: Dict[Path, Any] = {}
        self.active: List[Path] = []
        self.failed: List[Tuple[Problem, Optional[Path]]] = []

    def run(self):
        self.tree.data = self.resolve(())

    def resolve(self, path: Path):
        if path in self.done:
            return self.done[path]
        if path in self.active:
            cycle = " -> ".join(format_path(p) for p in self.active[self.active.index(path):]
                                + [path])
            raise ExperimentError([Problem(self.tree.where(path), format_path(path),
                                           f"interpolation cycle: {cycle}; make one of these a "
                                           "plain value")])
        self.active.append(path)
        try:
            value = self.tree.get(path)
            if isinstance(value, dict):
                value = {k: self.resolve(path + (k,)) for k in value}
            elif isinstance(value, list):
                value = [self.resolve(path + (i,)) for i in range(len(value))]
            elif isinstance(value, str) and "${" in value:
                try:
                    value = self.substitute(path, value)
                except ExperimentError as e:   # (said with the others; the text kept)
                    self.failed += [(p, getattr(e, "missing", None)) for p in e.problems]
        finally:
            self.active.pop()
        self.done[path] = value
        return value

    def substitute(self, path: Path, text: str):
        whole = _REF.fullmatch(text)
        if whole and not whole.group(1):
            ref = whole.group(2).strip()
            value = self.lookup(path, ref)
            if ref.startswith("env:") and isinstance(value, str):   # `${env:STEPS:-100}` -> 100
                return parse_scalar(value, f"{self.tree.where(path)}: {format_path(path)}")
            return copy.deepcopy(value)

        def one(m):
            if m.group(2) is None:   # (`$${` that nothing closes)
                return "${"
            if m.group(1):
                return "${" + m.group(2) + "}"
            value = self.lookup(path, m.group(2).strip())
            if isinstance(value, (dict, list)):
                raise ExperimentError([Problem(
                    self.tree.where(path), format_path(path),
                    f"${{{m.group(2)}}} is {_kind(value)} and cannot be part of a string; use "
                    "it alone as the whole value")])
            return "null" if value is None else str(value).lower() if isinstance(value, bool) \
                else str(value)
        self.check_closed(path, text)
        return _REF_OR_ESCAPED.sub(one, text)

    def check_closed(self, path: Path, text: str) -> None:
        """A `${` no `}` closes (it was kept as text: a model_dir named
        `${run_config.seed`) is an error."""
        spans = [m.span() for m in _REF_OR_ESCAPED.finditer(text)]
        start = text.find("${")
        while start >= 0:
            if not any(a <= start < b for a, b in spans):
                raise ExperimentError([Problem(
                    self.tree.where(path), format_path(path),
                    f"{text!r}: the ${{ at character {start + 1} is not closed; close it "
                    f"with }} (a reference: ${{section.key}}), or write $${{ for a literal "
                    f"${{")])
            start = text.find("${", start + 2)

    def lookup(self, path: Path, ref: str):
        where, at = self.tree.where(path), format_path(path)
        if ref.startswith("env:"):
            name, _, default = ref[4:].partition(":-")
            value = os.environ.get(name)
            if value or value is not None and ":-" not in ref:
                return value
            if ":-" in ref:   # (unset or empty, as the shell's ${NAME:-default})
                return default
            raise ExperimentError([Problem(where, at, f"${{{ref}}}: environment variable "
                                           f"{name!r} is not set; set it, or give a default "
                                           f"as ${{env:{name}:-value}}")])
        try:
            target = parse_path(ref)
        except ValueError:
            raise ExperimentError([Problem(where, at, f"${{{ref}}} is not a key path; write "
                                           "${section.key}, e.g. ${run_config.model_dir}")]) \
                from None
        node = self.tree.data
        for i, part in enumerate(target):
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                node = node[part]
            else:
                hint = self.suggest(target[:i], part, node)
                raise _Unresolved([Problem(where, at, f"${{{ref}}} refers to "
                                           f"{format_path(target[:i + 1])!s}, which is not "
                                           f"in the experiment;{hint}")], target[:i + 1])
        return self.resolve(target)


# -- dumping ---------------------------------------------------------------------------
class _Dumper(yaml.SafeDumper):
    """Writes what _Loader and interpolation read back as it was: strings they
    would read as floats (`"1e-3"`) quoted, a literal `${...}` as `$${...}`."""


_Dumper.add_implicit_resolver(   # (so that such strings are quoted)
    "tag:yaml.org,2002:float", _FLOAT_1_2, list("-+0123456789"))


def _represent_list(dumper, data):
    flow = all(isinstance(x, (str, int, float, bool)) or x is None for x in data) \
        and len(data) <= 8
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _represent_str(dumper, data):
    return dumper.represent_str(_LITERAL_REF.sub(lambda m: "$" + m.group(0), data))


class Reference(str):
    """A string `dump` writes as it is: an interpolation (`${run_config.model_dir}/x`)."""


def _represent_reference(dumper, data):
    return dumper.represent_str(str(data))


_LITERAL_REF = re.compile(r"\$\{")   # what interpolation would read (written $${)
_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(Reference, _represent_reference)


def dump(data) -> str:
    """YAML text for a resolved experiment (key order kept, short lists inline)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=100)
