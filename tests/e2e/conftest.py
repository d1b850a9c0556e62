"""The embedded model, loaded once per module for the tests that each build an engine on it:
a load is the model read, packed and its head quantized again, and no test changes it."""

from __future__ import annotations

import pytest
from wschat.server.engine.local.loader import LoadedModel, load_model


@pytest.fixture(scope="module")
def embedded() -> LoadedModel:
    return load_model("embedded")  # converts the GGUF on first use (about a minute)
