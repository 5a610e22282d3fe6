"""Skips for the tests that need one of flare2's optional extras, each naming the extra that installs what is missing.

The ``test`` extra installs every one of them; these skips are for a Python that has only part of it."""

from __future__ import annotations

import importlib.util

import pytest

from flare2.core.env_making import missing_extra


def _reason(what: str, extra: str) -> str:
    return f'{what} needs flare2\'s {extra} extra: python -m pip install -e ".[{extra}]"'


def needs_env(env_id: str) -> pytest.MarkDecorator:
    """Skip where ``env_id`` cannot be made because an extra is missing (flare2's own table of what envs need)."""
    extra = missing_extra(env_id)
    return pytest.mark.skipif(extra is not None, reason=_reason(env_id, extra or ""))


def needs_modules(extra: str, *modules: str) -> pytest.MarkDecorator:
    """Skip where one of ``modules`` cannot be imported, naming ``extra``, which installs them."""
    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    return pytest.mark.skipif(bool(missing), reason=_reason(", ".join(missing), extra))


def skip_without(extra: str, *modules: str) -> None:
    """Skip the calling test (or module) unless every one of ``modules`` can be imported."""
    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    if missing:
        pytest.skip(_reason(", ".join(missing), extra), allow_module_level=True)
