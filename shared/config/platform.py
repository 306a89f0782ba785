"""Where the app runs: in Azure (platform markers set) or on a local host."""

from __future__ import annotations

from collections.abc import Mapping

AZURE_MARKERS = ("WEBSITE_INSTANCE_ID", "WEBSITE_SITE_NAME", "WEBSITE_HOSTNAME")
"""Set by the platform on every App Service / Functions instance."""


def in_azure(env: Mapping[str, str]) -> bool:
    return any(env.get(name) for name in AZURE_MARKERS)
