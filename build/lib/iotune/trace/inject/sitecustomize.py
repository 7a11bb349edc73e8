"""iotune's startup hook for traced Python processes.

`iotune trace` puts this directory first on PYTHONPATH of the command it
runs (unless --no-inject), so Python imports this module at startup in every
process of the job, DeepSpeed launcher ranks included. It does nothing unless
IOTUNE_EVENTS_DIR is set; then `_iotune_hooks` records training phases and
DeepSpeed swap I/O (see there). It never changes what the job computes, and
any failure here disables the hooks instead of breaking the job.

Then it runs the sitecustomize this one shadows, if there is one.
"""

import os
import sys


def _install() -> None:
    if not os.environ.get("IOTUNE_EVENTS_DIR"):
        return
    try:
        import _iotune_hooks

        _iotune_hooks.install()
    except Exception as e:  # noqa: BLE001 - the job must run regardless
        sys.stderr.write(f"iotune: attribution hooks disabled ({type(e).__name__}: {e})\n")


def _chain() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_install()
_chain()
