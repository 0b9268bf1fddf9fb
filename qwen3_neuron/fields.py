"""Apply nested YAML values onto a tree of config dataclasses, checking every key and type.

OmegaConf cannot type torchtitan's dataclasses (``Literal``, callables, tuples), so the composed
YAML stays untyped and this module does the checking when it is written onto the dataclasses:
an unknown key names its full dotted path and the closest valid names, a wrong type names the
field and the type it expects. ``_target_`` in a section swaps the section's config class (as in
Hydra's instantiate), keeping the shared fields through torchtitan's own ``derive``.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any

from qwen3_neuron.errors import ConfigError


def apply_fields(node: Any, values: Mapping[str, Any], path: str, hint: Any = Any) -> Any:
    """Write ``values`` onto the dataclass ``node``; return the (re-validated) node.

    Nested mappings descend into nested dataclasses. Each node that received a value is
    rebuilt with ``dataclasses.replace`` so its ``__post_init__`` checks run again. ``hint`` is
    the annotation of the field holding ``node``: what a ``_target_`` class must fit.
    """
    values = dict(values)
    target = values.pop("_target_", None)
    if target is not None:
        node = _swap_class(node, target, path, hint)
    names = _field_names(type(node))
    for key, value in values.items():
        key_path = f"{path}.{key}" if path else key
        if key not in names:
            raise ConfigError(unknown_key_message(key_path, key, names))
        current = getattr(node, key)
        field_hint = _type_hints(type(node)).get(key, Any)
        if isinstance(value, Mapping) and _accepts_mapping(current, field_hint, value):
            if current is None and "_target_" not in value:
                current = _dataclass_arm(field_hint)()
            value = apply_fields(current, value, key_path, field_hint)
        else:
            value = check_type(value, field_hint, key_path)
        setattr(node, key, value)
    try:
        return dataclasses.replace(node) if values or target else node
    except (ValueError, TypeError, AssertionError) as e:
        raise ConfigError(f"{path or 'config'}: {e}") from e


def build_fields(cls: type, values: Mapping[str, Any], path: str) -> Any:
    """A flat config dataclass whose every field comes from ``values`` (a section whose defaults
    are written in its option's YAML only, the dataclass holding none): each key checked as
    `apply_fields` checks it, and every field given."""
    names = _field_names(cls)
    for key in values:
        if key not in names:
            raise ConfigError(unknown_key_message(f"{path}.{key}", key, names))
    missing = sorted(names - set(values))
    if missing:
        raise ConfigError(f"{path}.{missing[0]} is not set: the YAML that fills the {path} section names every key "
                          f"of it ({', '.join(sorted(names))}).")  # fmt: skip
    hints = _type_hints(cls)
    return cls(**{key: check_type(value, hints.get(key, Any), f"{path}.{key}") for key, value in values.items()})


def key_tree(node: Any) -> dict[str, Any]:
    """The keys `apply_fields` takes on the dataclass `node`: {name: the tree of the config it
    holds, or the value's type as `hint_text` writes it}, descending where `apply_fields` does."""
    tree = {}
    for name in sorted(_field_names(type(node))):
        value, hint = getattr(node, name), _type_hints(type(node)).get(name, Any)
        arm = _dataclass_arm(hint) if value is None else None
        try:
            value = arm() if arm is not None else value
        except TypeError:  # required fields: apply_fields cannot make one either
            pass
        tree[name] = key_tree(value) if dataclasses.is_dataclass(value) else hint_text(hint)
    return tree


def hint_text(hint: Any) -> str:
    """A field's annotation as text `hint_from_text` reads back without importing its module
    (the launcher's schema): the forms `check_type` checks by themselves. Any other class or a
    callable is `Any` there: the plan, which has the class, checks it."""
    hint = _strip_annotated(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None):
        return "None"
    if hint in (bool, int, float, str, list, tuple, dict):
        return hint.__name__
    if origin is typing.Literal and all(isinstance(a, (str, int, bool, type(None))) for a in args):
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin in (typing.Union, types.UnionType):
        arms = [hint_text(a) for a in args]
        return "Any" if "Any" in arms else " | ".join(arms)  # an Any arm accepts everything
    if origin is dict:
        return "dict"
    if origin in (list, tuple):
        items = ", ".join("..." if a is Ellipsis else hint_text(a) for a in args)
        return f"{origin.__name__}[{items}]" if args else origin.__name__
    return "Any"


# The names `hint_text` writes.
_HINT_NAMES = {"Any": Any, "Literal": typing.Literal, "bool": bool, "int": int, "float": float, "str": str,
               "list": list, "tuple": tuple, "dict": dict}  # fmt: skip


@cache
def hint_from_text(text: str) -> Any:
    """The annotation `hint_text` wrote (the project's own schema file: a Python type expression
    over `_HINT_NAMES`, evaluated with nothing else in reach)."""
    return eval(text, {"__builtins__": {}}, _HINT_NAMES)  # noqa: S307


def unknown_key_message(key_path: str, key: str, valid: typing.Iterable[str]) -> str:
    valid = sorted(valid)
    close = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"Unknown config key '{key_path}'.{hint} Valid keys here: {', '.join(valid)}."


def check_type(value: Any, hint: Any, key_path: str) -> Any:
    """Return ``value`` (coerced where lossless: int->float, list->tuple) or raise ConfigError."""
    ok, coerced = _match(value, hint)
    if not ok and typing.get_origin(hint) is typing.Literal:  # a choice: the value is wrong, not its type
        close = difflib.get_close_matches(str(value), [str(a) for a in typing.get_args(hint)], n=1, cutoff=0.6)
        guess = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"Wrong value for '{key_path}': expected {type_name(hint)}, got {value!r}.{guess}")
    if not ok:
        raise ConfigError(
            f"Wrong type for '{key_path}': expected {type_name(hint)}, "
            f"got {type(value).__name__} {value!r}."
        )
    return coerced


def type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "null"
    if origin is not None:
        return str(hint).replace("typing.", "")
    return getattr(hint, "__qualname__", str(hint))


def _match(value: Any, hint: Any) -> tuple[bool, Any]:
    if hint is Any or isinstance(hint, (str, typing.TypeVar)):
        return True, value  # unresolvable annotation: accept, torchtitan checks at build
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arm in args:
            ok, coerced = _match(value, arm)
            if ok:
                return True, coerced
        return False, value
    if origin is typing.Literal:
        return value in args, value
    if origin is typing.Annotated:
        return _match(value, args[0])
    if hint is type(None):
        return value is None, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if hint is str:
        return isinstance(value, str), value
    if origin in (list, tuple) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False, value
        items = _match_items(value, origin or hint, args)
        if items is None:
            return False, value
        return True, tuple(items) if (origin or hint) is tuple else list(items)
    if origin is dict or hint is dict:
        return isinstance(value, Mapping), dict(value) if isinstance(value, Mapping) else value
    if origin is not None or not isinstance(hint, type):
        return True, value  # Callable[...] and other exotic hints: left to torchtitan
    return isinstance(value, hint), value


def _match_items(value, container, args) -> list | None:
    if not args:
        return list(value)
    if container is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        if len(args) != len(value):
            return None
        arms = args
    else:
        arms = [args[0]] * len(value)
    out = []
    for item, arm in zip(value, arms):
        ok, coerced = _match(item, arm)
        if not ok:
            return None
        out.append(coerced)
    return out


def _accepts_mapping(current: Any, hint: Any, value: Mapping) -> bool:
    if dataclasses.is_dataclass(current):
        return True
    return current is None and (_dataclass_arm(hint) is not None or "_target_" in value)


def _dataclass_arm(hint: Any) -> type | None:
    """The one dataclass a hint allows (``X.Config | None`` -> ``X.Config``), else None."""
    classes = [a for a in _hint_classes(hint) if dataclasses.is_dataclass(a)]
    return classes[0] if len(classes) == 1 else None


def _hint_classes(hint: Any) -> list[type]:
    hint = _strip_annotated(hint)
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    arms = [_strip_annotated(a) for a in typing.get_args(hint)] if union else [hint]
    return [a for a in arms if isinstance(a, type) and a is not type(None)]


def _strip_annotated(hint: Any) -> Any:
    return typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint


def _swap_class(node: Any, target: str, path: str, hint: Any) -> Any:
    """Replace ``node`` (a config, or None) by an instance of ``target``, keeping shared fields."""
    from torchtitan.config.override import derive

    try:
        module_name, class_path = _split_target(target)
        cls: Any = importlib.import_module(module_name)
        for part in class_path.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"'{path}._target_': cannot import '{target}' ({e}).") from e
    allowed = _hint_classes(hint)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)) or (
        allowed and not issubclass(cls, tuple(allowed))
    ):
        expected = " | ".join(c.__qualname__ for c in allowed) or "a config dataclass"
        raise ConfigError(f"'{path}._target_': '{target}' does not fit here; expected {expected}.")
    return derive(node, cls) if node is not None else cls()


def _split_target(target: str) -> tuple[str, str]:
    """'pkg.mod.Outer.Config' -> ('pkg.mod', 'Outer.Config'): the longest importable module."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            importlib.import_module(module_name)
        except ImportError:
            continue
        return module_name, ".".join(parts[cut:])
    raise ValueError("no importable module in it")


@cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_"))


@cache
def _type_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception:  # forward references torchtitan never resolves at runtime
        return {f.name: f.type for f in dataclasses.fields(cls)}
