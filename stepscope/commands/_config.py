"""Project settings for the gate: ``stepscope.toml`` or ``[tool.stepscope]`` in ``pyproject.toml``.

Looked up only where the user points (``--config FILE``), else in the current directory, which
is where CI runs the command from. Format (stepscope.toml; under ``[tool.stepscope]`` in
pyproject.toml the same keys)::

    [budgets]
    step_time = "+5%"
    comm_exposed = "+2ms"

    [floors]
    peak_memory = "64MiB"

    [compare]
    alpha = 0.05
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


def load_config(path: Path | None, cwd: Path | None = None) -> tuple[dict[str, Any], str | None]:
    """The settings table and where it came from (None when there is none)."""
    if path is not None:
        if not path.is_file():
            raise UsageError(f"{path}: no such config file")
        return _read(path), str(path)
    here = cwd or Path.cwd()
    own = here / "stepscope.toml"
    if own.is_file():
        return _read(own), str(own)
    pyproject = here / "pyproject.toml"
    if pyproject.is_file():
        table = _read(pyproject, section=("tool", "stepscope"))
        if table:
            return table, f"{pyproject} [tool.stepscope]"
    return {}, None


def _read(path: Path, section: tuple[str, ...] = ()) -> dict[str, Any]:
    try:
        data: Any = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: cannot read TOML ({exc})") from exc
    if path.name == "pyproject.toml" and not section:
        section = ("tool", "stepscope")
    for key in section:
        data = data.get(key, {}) if isinstance(data, dict) else {}
    if not isinstance(data, dict):
        raise UsageError(f"{path}: [{'.'.join(section)}] must be a table")
    return data


def config_budgets(config: dict[str, Any], where: str | None) -> list[str]:
    """Budget strings from the ``budgets`` table."""
    from stepscope.analysis.compare.budgets import budgets_from_mapping

    table = config.get("budgets", {})
    if not isinstance(table, dict):
        raise UsageError(f"{where}: [budgets] must be a table of METRIC = \"+N%\"")
    return budgets_from_mapping(table, f"{where} [budgets]")


def config_floors(config: dict[str, Any], where: str | None) -> list[str]:
    """Floor strings (``METRIC:AMOUNT``) from the ``floors`` table."""
    table = config.get("floors", {})
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise UsageError(f"{where}: [floors] must be a table of METRIC = \"AMOUNT\", e.g. peak_memory = \"64MiB\"")
    return [f"{metric}:{amount}" for metric, amount in table.items()]


def config_alpha(config: dict[str, Any], where: str | None) -> float | None:
    value = config.get("compare", {}).get("alpha")
    if value is None:
        return None
    if not isinstance(value, (int, float)) or not 0 < value < 1:
        raise UsageError(f"{where}: [compare] alpha must be a number between 0 and 1")
    return float(value)
