"""The two storage accounts a logic test runs on (pytest params only: cheap to import in conftest).

`memory` is unmarked, so the fast tier runs it; `azurite` is marked `azurite` and `integration`, so
`make test` runs it and the fast tier does not. `tests/integration/backends.py` builds them.
"""

from __future__ import annotations

import pytest

MEMORY = "memory"
AZURITE = "azurite"
STORAGE_BACKENDS = [
    pytest.param(MEMORY, id=MEMORY),
    pytest.param(AZURITE, id=AZURITE, marks=[pytest.mark.azurite, pytest.mark.integration]),
]
