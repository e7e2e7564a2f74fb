"""One Hydra compose per distinct choice of config groups in a sweep, not one per job.

Hydra's launcher composes every job's config from scratch as the job starts
(``ConfigLoaderImpl.load_sweep_config``): the defaults tree, every config
file, then the job's overrides; about 0.1 s of the main process a job,
between points, while the ranks wait (the default sweep's 160 jobs share five
choices of groups). :func:`reuse_composes` keeps the first compose of each
choice and builds a later job with the same choice from a copy of it: the
job's plain overrides (a schema key assigned a value that is no mapping, so
the earlier job's value is replaced whole, as the default would be) set on
the copy, and Hydra's record of the job (``hydra.overrides.task``,
``hydra.job.override_dirname``) written for this job. Every other override
(a group, ``+``/``++``/``~`` keys, a mapping value) must be the same, line for
line, as the kept compose's; a job where one touches a plain key is composed
by Hydra, as before.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from .config import KEYS


def is_plain(ov: Any, groups: Any) -> bool:
    """An override that only assigns a value to a key of the schema: no config
    group (``groups(name)``: ``engine`` and ``workload`` are both keys and
    groups), no package, no add or delete, no mapping (merged into the value
    before it, not assigned)."""
    from hydra.core.override_parser.types import OverrideType

    return (ov.package is None and ov.key_or_group in KEYS and ov.type == OverrideType.CHANGE
            and not ov.is_sweep_override() and not ov.is_hydra_override() and not groups(ov.key_or_group)
            and not isinstance(ov.value(), dict))


def job_config(template: DictConfig, parsed: list[Any], plain: list[bool]) -> DictConfig:
    """``template`` (a job's composed config with the same other overrides and
    the same plain keys) made this job's: its plain overrides (``parsed[i]``
    where ``plain[i]``) set, and Hydra's record of its overrides."""
    from hydra._internal.config_loader_impl import get_overrides_dirname

    cfg = copy.deepcopy(template)
    for ov, p in zip(parsed, plain):
        if p:
            OmegaConf.update(cfg, ov.key_or_group, ov.value(), merge=True)
    task = [ov for ov in parsed if not ov.is_hydra_override()]
    with open_dict(cfg.hydra):
        cfg.hydra.overrides.task = ListConfig([ov.input_line for ov in task])
        named = cfg.hydra.job.config.override_dirname
        cfg.hydra.job.override_dirname = get_overrides_dirname(
            overrides=task, kv_sep=named.kv_sep, item_sep=named.item_sep, exclude_keys=list(named.exclude_keys))
    return cfg


def _key(hydra_lines: tuple[str, ...], parsed: list[Any], plain: list[bool]) -> tuple[Any, ...] | None:
    """What a job shares with the jobs its compose serves (None: it is composed alone)."""
    keys = {ov.key_or_group for ov, p in zip(parsed, plain) if p}
    for ov, p in zip(parsed, plain):
        name = ov.key_or_group.lstrip("+~")
        if not p and any(name == k or name.startswith(f"{k}.") for k in keys):
            return None
    return hydra_lines, tuple(ov.key_or_group if p else ov.input_line for ov, p in zip(parsed, plain))


@contextmanager
def reuse_composes() -> Iterator[dict[tuple[Any, ...], DictConfig]]:
    """Within: the launcher composes each distinct choice of config groups
    once (see the module's docstring). Yields the kept composes, by key."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    load = ConfigLoaderImpl.load_sweep_config
    kept: dict[tuple[Any, ...], DictConfig] = {}
    parser = OverridesParser.create()

    def load_sweep_config(self: Any, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        hydra_lines = tuple(OmegaConf.to_container(master_config.hydra.overrides.hydra))  # type: ignore[arg-type]
        parsed = parser.parse_overrides(list(sweep_overrides))
        plain = [is_plain(ov, self.repository.group_exists) for ov in parsed]
        key = _key(hydra_lines, parsed, plain)
        template = kept.get(key) if key is not None else None
        if template is None:
            cfg = load(self, master_config, sweep_overrides)
            if key is not None:
                kept[key] = copy.deepcopy(cfg)
            return cfg
        cfg = job_config(template, parsed, plain)
        OmegaConf.copy_cache(from_config=master_config, to_config=cfg)
        return cfg

    ConfigLoaderImpl.load_sweep_config = load_sweep_config  # type: ignore[method-assign]
    try:
        yield kept
    finally:
        ConfigLoaderImpl.load_sweep_config = load  # type: ignore[method-assign]
