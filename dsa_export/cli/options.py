"""Shared click parameter types and helpers for the subcommands."""

from __future__ import annotations

import click


class IntList(click.ParamType):
    """A comma-separated list of positive integers, e.g. ``16,64,256``."""

    name = "N,N,..."

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            items = tuple(int(v) for v in str(value).split(",") if v.strip())
        except ValueError:
            self.fail(f"'{value}' is not a comma-separated list of integers.", param, ctx)
        if not items or min(items) < 1:
            self.fail(f"'{value}' must list integers >= 1.", param, ctx)
        return items


INT_LIST = IntList()
