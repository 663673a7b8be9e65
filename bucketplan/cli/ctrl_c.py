"""The command line's Ctrl-C: the first one stops the command, the ones after it never cut the
save of what the command keeps short, and the exit status after one is 130.

Imports only the standard library (it is installed before anything else loads).
"""

from __future__ import annotations

import math
import os
import sys


class CtrlC:
    """SIGINT as the command line takes it: the first Ctrl-C raises KeyboardInterrupt, and every
    command then stops its search and saves the best verified result it has; a Ctrl-C during
    that wind-down is only counted. A second KeyboardInterrupt would land in the middle of the
    save, and the result the user waited for would be lost. The wind-down is bounded (CP-SAT
    stops within seconds, solve-dir waits ``STOP_WAIT_S`` for its solves); past ``WIND_DOWN_S`` a
    Ctrl-C raises again, and SIGTERM or SIGKILL end the process at once.

    A KeyboardInterrupt that lands where Python cannot raise it (a weakref callback, ``__del__``:
    "Exception ignored in ...") is dropped by Python; ``_on_unraisable`` delivers it again."""

    # longer than any wind-down: solve-dir waits 30 s (``STOP_WAIT_S``) for its solves to save
    WIND_DOWN_S = 40.0

    def __init__(self, previous) -> None:
        self.previous, self.count = previous, 0
        self.raised_at: float | None = None
        self.previous_hook = None
        self.deferring = False  # inside a native module's import: a Ctrl-C waits for its end
        self.deferred = False  # one came meanwhile
        self.finder = None

    @classmethod
    def install(cls) -> "CtrlC":
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():  # main() called from a thread
            return cls(None)
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started to ignore Ctrl-C (`nohup`, `cmd &` in a script)
            return cls(None)
        latch = cls(signal.getsignal(signal.SIGINT))
        signal.signal(signal.SIGINT, latch._on_sigint)
        latch.previous_hook, sys.unraisablehook = sys.unraisablehook, latch._on_unraisable
        latch.finder = _NativeImports(latch)
        sys.meta_path.insert(0, latch.finder)
        return latch

    def _on_sigint(self, signum, frame) -> None:
        import time

        if self.deferring:  # raised now, it would cross C++ that cannot pass it on: see _NativeImports
            self.deferred = True
            return
        self.count += 1
        if self.raised_at is None or self.raised_at + self.WIND_DOWN_S < time.monotonic():
            self.raised_at = time.monotonic()
            raise KeyboardInterrupt
        left = self.raised_at + self.WIND_DOWN_S - time.monotonic()
        # os.write, not print: this may run inside a print to stderr, which is not reentrant
        os.write(2, f"bucketplan: stopping; the best verified result is being kept (Ctrl-C again after "
                    f"{left:.0f} s forces the stop; SIGTERM ends it now)\n".encode())

    def _on_unraisable(self, unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and self.raised_at not in (None, math.inf):
            import _thread
            import threading

            self.raised_at = None
            # our handler again, from a thread a moment later: called from here it would run at
            # this hook's next instruction and be dropped the same way
            again = threading.Timer(0.01, _thread.interrupt_main)
            again.daemon = True
            again.start()
            return
        self.previous_hook(unraisable)

    def uninstall(self, exiting: bool = False) -> None:
        """The caller's handlers back; ``exiting`` (the process ends next), SIGINT stays ignored
        instead: the work is done or kept, and a Ctrl-C during the interpreter's shutdown must not
        turn its exit status (130 after a Ctrl-C) into death by SIGINT."""
        import signal

        self.raised_at = math.inf  # from here on a Ctrl-C is only counted (math.inf: never past the wind-down)
        if self.previous is None:
            return
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        sys.unraisablehook = self.previous_hook
        signal.signal(signal.SIGINT, signal.SIG_IGN if exiting else self.previous)
        if exiting and self.count:
            _forget_handled_keyboard_interrupt()


class _NativeImports:
    """A finder that defers Ctrl-C while a torch module is first imported. torch's C++ calls back
    into Python as it registers its types; a KeyboardInterrupt raised there meets pybind11 code
    that cannot pass it on, and the process aborts ("terminate called after throwing an instance
    of 'pybind11::error_already_set'", SIGABRT): measured, `bucketplan workloads` sent SIGINT at
    about 1.2 s, inside torch.distributed's import. So the signal is held until the module has
    loaded and raised then, in Python, where the command line reports it (exit 130)."""

    PREFIXES = ("torch",)

    def __init__(self, latch: CtrlC):
        self.latch = latch

    def find_spec(self, name, path, target=None):
        import importlib.util

        if self.latch.deferring or name.split(".")[0] not in self.PREFIXES:
            return None
        sys.meta_path.remove(self)  # the real spec, from the finders after this one
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Deferring(spec.loader, self.latch)
        return spec


class _Deferring:
    """A loader that runs the real one with Ctrl-C deferred (``_NativeImports``)."""

    def __init__(self, loader, latch: CtrlC):
        self.loader, self.latch = loader, latch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.latch.deferring = True
        try:
            self.loader.exec_module(module)
        finally:
            self.latch.deferring = False
        if self.latch.deferred:
            import threading

            self.latch.deferred = False
            if threading.current_thread() is threading.main_thread():
                self.latch._on_sigint(None, None)  # the Ctrl-C that came meanwhile, raised here
            else:  # another thread imported: the handler runs again in the main thread, as a signal would
                import _thread

                _thread.interrupt_main()

    def __getattr__(self, name):  # get_code, is_package, ...: the real loader's
        return getattr(self.loader, name)


def _forget_handled_keyboard_interrupt() -> None:
    """CPython (3.10, 3.11) sets a process-wide flag when a KeyboardInterrupt passes through Python
    code that an extension runs with PyRun_String, even when our code then catches it, and at exit
    turns any exit status into death by SIGINT: measured, exit -2 after "interrupted while
    starting" for a Ctrl-C while the solver's packages load, about one in three between 0.75 and
    0.9 s. The Ctrl-C was handled; the flag is cleared. (Where the symbol is not there, nothing.)"""
    import ctypes

    try:
        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0
    except (ValueError, AttributeError):
        pass
