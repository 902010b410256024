"""Scoring modules with the Azure batch-scoring contract: ``init()`` then ``run(mini_batch)``.

A module is registered per model name. ``run`` receives a list of file paths and returns one
output line (string) per scored row; ``append_row`` output concatenates them.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType


class ScoringRegistry:
    """Maps model names to importable scoring modules, initialising each module once."""

    def __init__(self) -> None:
        self._modules: dict[str, str] = {}
        self._loaded: dict[str, ModuleType] = {}
        self._lock = threading.Lock()

    def register(self, model_name: str, module_path: str) -> None:
        with self._lock:
            self._modules[model_name] = module_path
            self._loaded.pop(model_name, None)

    def load(self, model_name: str) -> ModuleType:
        with self._lock:
            if model_name not in self._loaded:
                module_path = self._modules.get(model_name)
                if module_path is None:
                    raise LookupError(f"no scoring module registered for model {model_name!r}")
                module = importlib.import_module(module_path)
                if hasattr(module, "init"):
                    module.init()
                self._loaded[model_name] = module
            return self._loaded[model_name]
