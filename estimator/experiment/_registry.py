"""Names in experiment files -> Python objects.

Two ways to name a thing:
- an import path, `package.module:function` or `path/to/file.py:function`
  (a file path is relative to the experiment file's directory, else to the
  current directory);
- for strategies, hooks, exporters and saving listeners, a bare name
  (`MirroredStrategy`, `LoggingTensorHook`, `BestExporter`), looked up when the
  experiment is loaded in the `distribute`, `hooks` and `estimator` packages,
  so a class added there works in YAML without touching this module.

Failures raise `RefError` whose message says what is wrong and how to fix it.
"""
from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import sysconfig
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple


class RefError(Exception):
    """A name or import path cannot be resolved; the message holds the fix."""


class _Kind(NamedTuple):
    noun: str                        # "strategy"
    packages: Tuple[str, ...]        # where bare names are looked up
    accepts: Callable[[str, object], bool]


def _is_subclass(module: str, base: str):
    def accepts(name, obj):
        try:
            base_cls = getattr(importlib.import_module(module), base)
        except (ImportError, AttributeError):
            return False
        return inspect.isclass(obj) and issubclass(obj, base_cls) and obj is not base_cls
    return accepts


def _is_hook(name, obj):
    if name.startswith("_"):
        return False
    if inspect.isfunction(obj):
        return name.endswith("_hook")
    return _is_subclass("hooks", "SessionRunHook")(name, obj)


def _is_exporter(name, obj):
    if not inspect.isclass(obj) or name.startswith("_"):
        return False
    try:
        base = getattr(importlib.import_module("estimator"), "Exporter")
    except AttributeError:
        return name.endswith("Exporter") and name != "Exporter"
    return issubclass(obj, base) and obj is not base


def _is_listener(name, obj):
    try:
        base = importlib.import_module("hooks").CheckpointSaverListener
    except (ImportError, AttributeError):
        return False
    return inspect.isclass(obj) and issubclass(obj, base) and not name.startswith("_")


def _is_estimator(name, obj):
    """A canned estimator (est.DNNClassifier, ...) or another Estimator subclass."""
    try:
        base = importlib.import_module("estimator").Estimator
    except (ImportError, AttributeError):
        return False
    return inspect.isclass(obj) and issubclass(obj, base) and obj is not base


def _is_head(name, obj):
    """A head of the estimator package (est.MultiLabelHead), for `head:` of a
    head-taking canned estimator."""
    return (inspect.isclass(obj) and name.endswith("Head") and not name.startswith("_")
            and obj.__module__.split(".")[0] == "estimator")


def _is_sdca(name, obj):
    """An optimizer object of the estimator package (est.experimental.LinearSDCA),
    for `optimizer:` of a linear estimator (a TF1 name there is a string)."""
    return name == "LinearSDCA" and inspect.isclass(obj)


KINDS: Dict[str, _Kind] = {
    "strategy": _Kind("strategy", ("distribute",), _is_subclass("distribute", "Strategy")),
    "hook": _Kind("hook", ("hooks", "estimator", "estimator.experimental"), _is_hook),
    "exporter": _Kind("exporter", ("estimator", "estimator.exporter"), _is_exporter),
    "saving_listener": _Kind("saving listener", ("hooks",), _is_listener),
    "estimator": _Kind("estimator", ("estimator",), _is_estimator),
    "head": _Kind("head", ("estimator",), _is_head),
    "optimizer": _Kind("optimizer", ("estimator.experimental",), _is_sdca),
    "cross_device_ops": _Kind("cross-device ops", ("distribute",),
                              _is_subclass("distribute", "CrossDeviceOps")),
}


def _packages(kind: _Kind):
    for name in kind.packages:
        try:
            yield importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:      # the package exists but something it imports does not
                raise


def names(kind: str) -> List[str]:
    """Every bare name of this kind that the packages define now."""
    k = KINDS[kind]
    found = set()
    for package in _packages(k):
        for name in dir(package):
            if not name.startswith("_") and k.accepts(name, getattr(package, name, None)):
                found.add(name)
    return sorted(found)


def suggest(name: str, candidates: Sequence[str]) -> Optional[str]:
    """The closest candidate (case-insensitive, difflib), or None."""
    by_lower: Dict[str, str] = {}
    for c in candidates:
        by_lower.setdefault(str(c).lower(), str(c))
    close = difflib.get_close_matches(str(name).lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[close[0]] if close else None


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def lookup(kind: str, name: str, base_dir: str):
    """The class or factory called `name` (a bare name or an import path)."""
    k = KINDS[kind]
    if ":" in name:
        obj = import_ref(name, base_dir)
        if not callable(obj):
            raise RefError(f"{name!r} is not a class or function; a {k.noun} is built by "
                           f"calling it with the arguments given")
        return obj
    for package in _packages(k):
        obj = getattr(package, name, None)
        if obj is not None:
            if k.accepts(name, obj):
                return obj
            hint = ("; a model_fn of your own is a top-level key: `model_fn: "
                    "path/to/file.py:model_fn`" if kind == "estimator" and name == "model_fn"
                    else "")
            raise RefError(f"{package.__name__}.{name} is not {_a(k.noun)}; known {k.noun} "
                           f"names: {', '.join(names(kind)) or 'none yet'}{hint}")
    known = names(kind)
    close = suggest(name, known)
    if close:
        raise RefError(f"unknown {k.noun} {name!r}; did you mean {close!r}?")
    listing = f"known: {', '.join(known)}" if known else \
        f"none is defined in {' or '.join(k.packages)} yet"
    raise RefError(f"unknown {k.noun} {name!r}; {listing} (a class of your own is named "
                   f"by import path, package.module:Class)")


# -- import paths ------------------------------------------------------------------
def import_ref(ref: str, base_dir: str):
    """The object at `package.module:attr` or `path/to/file.py:attr`."""
    if not isinstance(ref, str):
        raise RefError(f"expected an import path string, got {type(ref).__name__}")
    module_part, sep, attr = ref.rpartition(":")
    if not sep or not module_part or not attr or any(not a.isidentifier()
                                                     for a in attr.split(".")):
        raise RefError(f"{ref!r} is not an import path; write package.module:function or "
                       "path/to/file.py:function")
    if module_part.endswith(".py") or "/" in module_part or os.sep in module_part:
        module = _import_file(module_part, base_dir)
        shown = module_part
    else:
        module = _import_module(module_part)
        shown = f"module {module_part}"
    obj = module
    for i, a in enumerate(attr.split(".")):
        if not hasattr(obj, a):
            owner = shown if i == 0 else ".".join(attr.split(".")[:i])
            candidates = [n for n in dir(obj) if not n.startswith("_")]
            close = suggest(a, candidates)
            hint = f"did you mean {close!r}?" if close else \
                f"it defines: {', '.join(c for c in candidates if callable(getattr(obj, c)))[:300]}"
            top = module_part.split(".")[0]
            if i == 0 and sep and top in _LIBRARY_PACKAGES and "/" not in module_part:
                files = [f for f in {os.path.join(d, top + ".py") for d in (base_dir, os.getcwd())}
                         if os.path.isfile(f)]
                if files:
                    hint += (f" ({files[0]} is not what {module_part!r} imports: the library's "
                             f"own package {top!r} has that name; name the file by its path, "
                             f"{os.path.basename(files[0])}:{attr}, or rename it)")
            raise RefError(f"cannot import {ref!r}: {owner} has no {a!r}; {hint}")
        obj = getattr(obj, a)
    return obj


_LIBRARY_PACKAGES = ("estimator", "hooks", "distribute")   # (a user's hooks.py is not these)


def resolved_file(module_part: str, base_dir: str) -> Optional[str]:
    """The absolute file a `path/to/file.py` reference means, or None."""
    for path in _candidates(module_part, base_dir):
        if os.path.isfile(path):
            return path
    return None


def _candidates(module_part: str, base_dir: str) -> List[str]:
    path = os.path.expanduser(module_part)
    if os.path.isabs(path):
        return [path]
    out = []
    for base in (base_dir, os.getcwd()):
        p = os.path.abspath(os.path.join(base, path))
        if p not in out:
            out.append(p)
    return out


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            raise RefError(f"cannot import {name!r}: no module named {e.name!r}; install it or "
                           "put its directory on PYTHONPATH, or name the file instead "
                           "(path/to/file.py:function)") from None
        raise RefError(f"importing {name!r} failed: {_describe(e)}") from None
    except Exception as e:  # noqa: BLE001  (any error the user's module raises on import)
        raise RefError(f"importing {name!r} failed: {_describe(e)}; fix that module") from None


def _import_file(module_part: str, base_dir: str):
    path = resolved_file(module_part, base_dir)
    if path is None:
        looked = " and ".join(_candidates(module_part, base_dir))
        raise RefError(f"cannot import from {module_part!r}: no such file (looked for {looked}); "
                       "a file path is relative to the experiment file's directory or the "
                       "current directory")
    package = _in_package(path)
    if package is not None:   # (its own imports name the package: `from . import model`)
        return _import_package_file(module_part, path, *package)
    name = _module_name(path)
    version = _version(path)
    if name in sys.modules and _loaded.get(name) in (None, version):
        return sys.modules[name]   # (a file changed since is executed again, below)
    directory = os.path.dirname(path)
    if directory not in sys.path:
        # so that processes a strategy starts can import the same module by name
        sys.path.append(directory)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001
        del sys.modules[name]
        _loaded.pop(name, None)
        if isinstance(e, ImportError) and "no known parent package" in str(e):
            raise RefError(
                f"importing {module_part!r} ({path}) failed: {_describe(e)}: a file is imported "
                "as a module of its package where its directories hold __init__.py; name a "
                "namespace package's module by import path (package.module:function)") from None
        raise RefError(f"importing {module_part!r} ({path}) failed: {_describe(e)}; fix that "
                       "file") from None
    _loaded[name] = version
    return module


def _in_package(path: str) -> Optional[tuple]:
    """(`trainer.task`, the directory above `trainer/`) for a file of a
    package (its directories hold `__init__.py`), else None."""
    directory, parts = os.path.dirname(path), [os.path.splitext(os.path.basename(path))[0]]
    while os.path.isfile(os.path.join(directory, "__init__.py")):
        directory, package = os.path.split(directory)
        parts.insert(0, package)
    if len(parts) == 1 or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts), directory


def _import_package_file(module_part: str, path: str, name: str, root: str):
    """The file at `path` imported as module `name` of its package, as
    `python -m trainer.task` run from `root` imports it."""
    top = name.split(".")[0]
    loaded = sys.modules.get(top)
    if loaded is not None and os.path.join(root, top) not in [
            os.path.abspath(p) for p in getattr(loaded, "__path__", [])]:
        where = getattr(loaded, "__file__", None) or "built in"
        raise RefError(f"cannot import {module_part!r} as module {name} (its package's name): "
                       f"a module {top!r} is loaded already, from {where}; rename the package")
    if sys.path[:1] != [root]:   # (first: a same-named package elsewhere is not found)
        if root in sys.path:
            sys.path.remove(root)
        sys.path.insert(0, root)
    if any(_version(f) != v for f, v in _package_files.get(top, {}).items()
           if os.path.isfile(f)):   # (a file of it changed since: the package runs again)
        for loaded_name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
            del sys.modules[loaded_name]
    try:
        module = importlib.import_module(name)
    except Exception as e:  # noqa: BLE001
        raise RefError(f"importing {module_part!r} ({path}) as module {name} failed: "
                       f"{_describe(e)}; fix that file") from None
    found = os.path.abspath(getattr(module, "__file__", "") or "")
    if found != path:
        raise RefError(f"importing {module_part!r} as module {name} (its package's name) gave "
                       f"{found or 'a module without a file'}, another package of that name "
                       f"on sys.path; rename one, or name the module by import path")
    _package_files[top] = {f: _version(f) for n, m in list(sys.modules.items())
                           if (n == top or n.startswith(top + "."))
                           and (f := getattr(m, "__file__", None)) and os.path.isfile(f)}
    return module


# {package: {file: (mtime, size)}} of the packages loaded by a file of theirs
_package_files: dict = {}

# {module name: (mtime, size)} of the files loaded by path: an experiment loaded
# again in one process (a notebook, a test) runs the file as it is now.
_loaded: dict = {}


def _version(path: str) -> tuple:
    stat = os.stat(path)
    return stat.st_mtime_ns, stat.st_size


def _module_name(path: str) -> str:
    """The file's stem, unless that name already means another module."""
    stem = os.path.splitext(os.path.basename(path))[0]
    if stem.isidentifier():
        loaded = sys.modules.get(stem)
        if loaded is not None:
            if os.path.abspath(getattr(loaded, "__file__", "") or "") == path:
                return stem
        else:
            try:
                spec = importlib.util.find_spec(stem)
            except (ImportError, ValueError):
                spec = None
            if spec is None or (spec.origin and os.path.abspath(spec.origin) == path):
                return stem
    digest = hashlib.sha1(path.encode()).hexdigest()[:8]
    safe = "".join(c if c.isalnum() else "_" for c in stem)
    return f"_experiment_{safe}_{digest}"


def _describe(e: BaseException) -> str:
    """The error a module raised on import, with where: the file and line of
    the innermost frame in the user's code (else in what it called), past
    this package and Python's import machinery."""
    if isinstance(e, SyntaxError):
        return f"SyntaxError: {e.msg} ({e.filename}, line {e.lineno})"
    ours = os.path.dirname(os.path.abspath(__file__)) + os.sep
    library = tuple(os.path.abspath(sysconfig.get_paths()[k]) + os.sep
                    for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    frames, tb = [], e.__traceback__
    while tb is not None:
        filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not tb.tb_frame.f_code.co_filename.startswith("<") and not filename.startswith(ours):
            frames.append((not filename.startswith(library), tb.tb_frame.f_code.co_filename,
                           tb.tb_lineno))
        tb = tb.tb_next
    users = [f for f in frames if f[0]] or frames
    where = f" ({users[-1][1]}, line {users[-1][2]})" if users else ""
    return f"{type(e).__name__}: {e}{where}"
