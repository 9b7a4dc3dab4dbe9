"""The integration tests use the end-to-end tests' process helpers (``e2e.process_support``,
``e2e.loop_support``), which import their neighbours by module name (``wan_proxy``): their
folder is put on the path here, so that an integration test file also runs on its own."""

from __future__ import annotations

import sys
from pathlib import Path

E2E = str(Path(__file__).resolve().parents[1] / "e2e")
if E2E not in sys.path:
    sys.path.insert(0, E2E)
