"""Tests that need one of rlstore's extras skip without it, with a reason that names it."""

import importlib.util

import pytest


def requires_extra(extra: str, *modules: str) -> list[pytest.MarkDecorator]:
    """Marks for a test that needs rlstore[extra]: it skips, naming the extra, when one of
    `modules` does not import, and carries the `extra` marker, so that CI can run exactly
    these once it has installed the extras (`python -m pytest -m extra`), and, where Ray is
    one of them, the `ray` marker. Use as a module's
    `pytestmark` or through `needs`."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    reason = f'needs rlstore[{extra}] ({", ".join(missing)} missing): pip install -e ".[{extra}]"'
    marks = [pytest.mark.extra, pytest.mark.skipif(bool(missing), reason=reason)]
    # Ray's tests start Rays of their own, which must not meet: CI runs them one at a time
    return marks + ([pytest.mark.ray] if "ray" in modules else [])


def needs(extra: str, *modules: str):
    """A test decorator: requires_extra's marks."""

    def decorate(test):
        for mark in requires_extra(extra, *modules):
            test = mark(test)
        return test

    return decorate
