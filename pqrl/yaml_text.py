"""YAML read the way users write configs: ``true``/``false`` are the only booleans.

PyYAML follows YAML 1.1, where ``on``, ``off``, ``yes``, ``no``, ``y`` and ``n`` are booleans too, so
``is_mode: off`` reached a string field as ``False`` and was refused with a message naming ``'off'``
as a valid value. Here those words stay strings (YAML 1.2's core schema); a boolean field still
takes them, since the config models read ``"off"`` or ``"yes"`` as a bool.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

__all__ = ["load_yaml"]


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2's booleans."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def load_yaml(text: str) -> Any:
    """The document in ``text`` (raises ``yaml.YAMLError`` as ``yaml.safe_load`` does)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
