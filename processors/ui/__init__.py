"""`runfold ui`: the web UI over the run index (docs/ui.md)."""

from processors.ui.app import UiConfig, create_app

__all__ = ["UiConfig", "create_app"]
