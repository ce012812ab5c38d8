"""The engine flags, one per :class:`~pagedkv_core.config.EngineConfig` field.

Each flag's type, default, bounds and help are read from the field itself (its type hint and
:func:`~pagedkv_core.config.setting_spec`), so a default or a bound is written once, in the
config, and every command that builds an engine shows the same flags. The flags only parse:
the values are checked by ``EngineConfig``, which names the bad one in a one-line ConfigError.

``--contiguous-policy`` is the one flag that is not a field: it picks among the contiguous
allocators of :data:`~pagedkv_core.kv.registry.CONTIGUOUS_POLICIES` when ``--allocator
contiguous`` is given.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing

from ..kv.registry import ALLOCATORS, CONTIGUOUS_POLICIES, allocator_kind
from ..config import ConfigError, EngineConfig, SettingSpec, setting_spec

# Fields without a flag: the longest sequence is the model's business (LLM reads it from the model).
NOT_FLAGS = ("max_model_len",)
ENGINE_FLAGS = tuple(f.name for f in dataclasses.fields(EngineConfig) if f.name not in NOT_FLAGS)
_METAVARS = {"block_size": "B", "watermark": "F", "seed": "S"}  # other numbers: N
# The first policy is the plain "--allocator contiguous" (Orca (Max)); the others refine it.
DEFAULT_POLICY = next(iter(CONTIGUOUS_POLICIES))
_PLAIN_CONTIGUOUS = CONTIGUOUS_POLICIES[DEFAULT_POLICY]


def flag(name: str) -> str:
    """The command-line spelling of a setting: ``pool_slots`` -> ``--pool-slots``."""
    return "--" + name.replace("_", "-")


def _value_type(name: str) -> type:
    """int, float, str or bool: the field's type hint without its ``| None``."""
    hint = typing.get_type_hints(EngineConfig)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _choices(spec: SettingSpec) -> tuple:
    if spec.choices:
        return spec.choices
    return tuple(ALLOCATORS) if spec.name == "allocator" else ()  # the registry is the allocator's rule


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def _help(spec: SettingSpec, note: str | None) -> str:
    text = spec.help
    choices = _choices(spec)
    if choices:
        text += ": " + " | ".join(map(str, choices))
    elif spec.lo is not None and spec.hi is not None:
        text += f", in [{_number(spec.lo)}, {_number(spec.hi)}{')' if spec.hi_open else ']'}"
    elif spec.lo is not None:
        text += f", >= {_number(spec.lo)}"
    if note is not None:
        text += f" ({note})"
    elif spec.default is not None:
        text += f" (default {spec.default})"
    return text.replace("%", "%%")


def add_engine_args(
    parser: argparse.ArgumentParser, pool_default: int | None = None, *, default_notes: dict[str, str] | None = None
) -> None:
    """Adds the engine flags (group "engine") to ``parser``.

    ``--pool-slots`` defaults to ``pool_default`` (None: decided by :func:`config_from_args`'s
    caller, else EngineConfig's default). ``default_notes`` replaces the "(default X)" of a
    flag's help, for a command whose default differs (generate's random sampling seed)."""
    notes = dict(default_notes or {})
    if pool_default is not None:
        notes.setdefault("pool_slots", f"default {pool_default}")
    g = parser.add_argument_group("engine")
    for name in ENGINE_FLAGS:
        spec = setting_spec(name)
        kind = _value_type(name)
        if kind is bool:
            words = name.replace("_", " ")
            if spec.default:
                g.add_argument(flag("no_" + name), dest=name, action="store_false", default=True,
                               help=f"turn off {words}, on by default: {spec.help}".replace("%", "%%"))
            else:
                g.add_argument(flag(name), dest=name, action="store_true", default=False,
                               help=f"turn on {words}, off by default: {spec.help}".replace("%", "%%"))
            continue
        default = pool_default if name == "pool_slots" else spec.default
        metavar = None if kind is str else _METAVARS.get(name, "N")
        g.add_argument(flag(name), type=kind, default=default, metavar=metavar, help=_help(spec, notes.get(name)))
        if name == "allocator":
            mapping = ", ".join(f"{k} = {v}" for k, v in CONTIGUOUS_POLICIES.items())
            g.add_argument("--contiguous-policy", default=None, metavar="POLICY",
                           help=f"with --allocator {_PLAIN_CONTIGUOUS}: how a reservation is sized, "
                                f"{' | '.join(CONTIGUOUS_POLICIES)} (default {DEFAULT_POLICY}), naming the "
                                f"allocators {mapping}; ignored with --allocator paged")


def resolve_allocator(allocator: str, policy: str | None) -> str:
    """The registry name the flags select. ``--allocator contiguous --contiguous-policy P`` is
    ``CONTIGUOUS_POLICIES[P]``; a paged allocator ignores the policy; another contiguous name
    stands as given, and a policy that names a different allocator is a ConfigError."""
    if policy is None:
        return allocator
    if policy not in CONTIGUOUS_POLICIES:
        raise ConfigError(f"--contiguous-policy must be one of {', '.join(CONTIGUOUS_POLICIES)}, got {policy!r}")
    if allocator == _PLAIN_CONTIGUOUS:
        return CONTIGUOUS_POLICIES[policy]
    if allocator_kind(allocator) == "contiguous" and CONTIGUOUS_POLICIES[policy] != allocator:
        raise ConfigError(f"--contiguous-policy {policy} selects {CONTIGUOUS_POLICIES[policy]}, but --allocator "
                          f"is {allocator}: give --allocator {_PLAIN_CONTIGUOUS} with the policy, or drop the policy")
    return allocator


def engine_settings(args: argparse.Namespace) -> dict:
    """The EngineConfig fields that the flags of :func:`add_engine_args` set (pool size aside).
    A flag a command left at None (generate's seed) gets the config's default."""
    settings = {}
    for name in ENGINE_FLAGS:
        if name == "pool_slots":
            continue
        value = getattr(args, name)
        settings[name] = setting_spec(name).default if value is None else value
    settings["allocator"] = resolve_allocator(args.allocator, args.contiguous_policy)
    return settings


def config_from_args(args: argparse.Namespace, pool_slots: int | None = None, **overrides) -> EngineConfig:
    """EngineConfig from the flags of :func:`add_engine_args`; ``pool_slots`` is the pool size
    when ``--pool-slots`` was not given. Raises ConfigError."""
    pool = args.pool_slots if args.pool_slots is not None else pool_slots
    kwargs = engine_settings(args)
    if pool is not None:
        kwargs["pool_slots"] = pool
    kwargs.update(overrides)
    return EngineConfig(**kwargs)
