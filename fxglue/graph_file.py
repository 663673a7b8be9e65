"""Graphs from anywhere: read and write FX graphs in torch's repro format.

Why this exists: users meet collectives in graphs they already have -- torch's minifier and AOT
repro files (``torch._dynamo.repro.after_aot.save_graph_repro``: a ``Repro`` module, a
``load_args(reader)`` function and, for distributed graphs, ``setup_fake_process_groups({...})``
under ``__main__``), graphs other tools dump (AutoParallel's overlap simulator keeps its
``get_pg_config()`` and ``get_colls_estimations_file()`` beside them), the forward and the
backward graph a compile produces separately, mostly of CUDA runs. ``load_graph`` turns such a
file into a ``TracedWorkload`` that goes through the same ``fxglue.pipeline.prepare`` as a
built-in workload; ``save_graph`` writes a traced workload in that format (torch's own writer,
plus what bucketplan needs to read it back as it was: the groups' roles, the parameter names and
the transformer blocks).

How a file is read:
- It is Python and is executed as a module (never as ``__main__``, so its ``run_repro`` does not
  run), with the permissions of whoever loads it: the file is trusted code, and the command line
  says so before running it. ``_FileCode`` contains what can be contained in-process: the file's
  code -- its import, ``Repro()``, ``get_pg_config()``, ``load_args`` and its forward as traced --
  runs under a time limit (``LOAD_TIMEOUT_S``; kept by a watchdog thread when the file ignores,
  replaces or cancels its alarm), an exit from it (``sys.exit``, ``os._exit``) or any other
  exception, BaseExceptions included, is a refusal rather than the end of the run (a
  KeyboardInterrupt ends the command as a Ctrl-C does), and what it changes is put back: after
  each piece of its code the signal handlers and mask, the interval timers, the standard streams
  (which it cannot close meanwhile), ``sys``'s hooks and the builtins; after loading the working
  directory, the environment variables and the torch configs.
- ``Repro`` is built with every non-CPU device literal (``.to("cuda:0")``, ``device='cuda:0'``,
  ``.cuda()``: what torch's writer emits for parameters, buffers and constants) sent to the meta
  device, so nothing needs a GPU or memory; its forward is traced by ``torch.fx`` with every op
  of literals alone recorded as a node rather than run (``_ConstantOpsAsNodes``: the tensors a
  graph makes -- ``full``, ``empty``, ``zeros``, ``arange``, ``scalar_tensor``, ``empty_strided``,
  ``new_*``, 0-d scalars that ``index_put`` takes --, which torch.fx alone would run on a GPU
  this machine lacks or bake in as real constants), and every device literal in it
  (``device(type='cuda', index=0)``, ``'cuda:0'``, a bare CUDA index where the op's schema says
  Device) is mapped to the CPU, so the trace makes each a fake CPU tensor; every parameter, buffer
  and tensor constant becomes a fake CPU tensor of its shape and dtype, and ``load_args`` is
  answered by a reader that makes fake CPU tensors of the recorded shapes, strides and dtypes (no
  data is read: storages shared between inputs become separate tensors); then the graph is
  traced once more under that ``FakeTensorMode``, as built-in workloads are
  (``workloads.trace_step``). A tensor of ``planner.core.problem.MAX_BYTES`` or more is refused by name;
  an op that does not trace (a bool mask's data-dependent ``index``) is one line naming its
  node as the file names it, its op and its line (``_trace_failure``).
- Process groups: ``--group NAME=SIZE[@RANKS_PER_NODE][:dp|tp]`` flags, else the file's
  ``get_pg_config()`` (``{name: {"size": N, "role": "tp", "ranks_per_node": R}}``, role and ranks
  per node optional), else the ``setup_fake_process_groups({...})`` literal torch writes. Every
  group a collective names must be sized by one of them, at the size its all_gathers and
  reduce_scatters name (the graph's shapes are those of that size). Groups are data-parallel
  unless marked ``tp``; ranks per node default to the cluster preset's layout for that role.
- Measured collectives: a file with ``get_colls_estimations_file()`` names a table of collective
  times (AutoParallel's format, ``planner.cost.measured``; a path relative to the file), read when
  the file is loaded and recorded in the workload's meta (``collectives_table``);
  ``fxglue.pipeline.prepare`` prices the groups it covers by it, under any measurement the
  caller gave (``--collectives``, ``--profile``). A table that is not there (a file copied alone)
  is a warning, recorded as ``collectives_table_missing``: the groups are priced as with none.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import importlib.machinery
import importlib.util
import io
import logging
import math
import os
import re
import signal
import sys
import threading
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.fx as fx
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from fxglue.models.base import Groups, TracedWorkload, WorkloadError

ROLES = ("dp", "tp")
_CONFIGS = ("torch._dynamo.config", "torch._inductor.config", "torch._functorch.config",
            "torch.fx.experimental._config")
_GROUP_FLAG = re.compile(r"^(?P<name>[^=\s]+)=(?P<size>\d+)(?:@(?P<per_node>\d+))?(?::(?P<role>\w+))?$")
# Ranks in one group: beyond any cluster built (the largest train on ~10^5 GPUs) with room to
# spare; torch's ProcessGroup takes the size as a C int, so a size like 10**12 would otherwise
# fail inside torch rather than be refused here.
MAX_GROUP_SIZE = 1 << 20
# Loading runs the file's own code, and a file that never returns (a loop at import, in Repro()
# or in load_args) must not hang a sweep or a CI job. A real file's code does little: measured on
# 2 shared cores, the saved 32-layer llama3-8b-fsdp step's (import, Repro(), get_pg_config(),
# load_args, its forward traced by torch.fx) takes 3.5 s, about 0.1 s a layer, so 300 s is far
# beyond any real step while a stuck file still ends. The variable overrides it (0: no limit).
LOAD_TIMEOUT_S = 300.0
LOAD_TIMEOUT_ENV = "BUCKETPLAN_GRAPH_LOAD_TIMEOUT_S"
# The alarm ends a file's code at the limit; the watchdog (``_Watchdog``) steps in this much later,
# and then once a second, for a file that defeated the alarm.
WATCHDOG_GRACE_S = 1.0


class GraphFileError(WorkloadError):
    """A graph file that cannot be planned: one line naming the file and what is wrong."""


@dataclass(frozen=True)
class GroupSpec:
    """A process group of a graph file: its name in the graph, size, role and ranks per node."""

    name: str
    size: int
    role: str = "dp"
    ranks_per_node: int | None = None  # None: the cluster preset's layout for the role


def parse_group(text: str) -> GroupSpec:
    """``--group NAME=SIZE[@RANKS_PER_NODE][:dp|tp]``."""
    m = _GROUP_FLAG.match(text)
    if not m or int(m["size"]) < 1 or (m["per_node"] is not None and int(m["per_node"]) < 1):
        raise GraphFileError(f"--group {text!r}: give NAME=SIZE[@RANKS_PER_NODE][:dp|tp], sizes positive "
                             "(e.g. 0=64 or 3=8@8:tp)")
    if max(int(m["size"]), int(m["per_node"] or 1)) > MAX_GROUP_SIZE:
        raise GraphFileError(f"--group {text!r}: more than {MAX_GROUP_SIZE} ranks, beyond any cluster")
    role = m["role"] or "dp"
    if role not in ROLES:
        raise GraphFileError(f"--group {text!r}: role {role!r} is not one of {', '.join(ROLES)}")
    per_node = int(m["per_node"]) if m["per_node"] else None
    why = _layout_error(int(m["size"]), per_node)
    if why:
        raise GraphFileError(f"--group {text!r}: {why}")
    return GroupSpec(m["name"], int(m["size"]), role, per_node)


def _layout_error(size: int, per_node: int | None) -> str | None:
    """Why ``size`` ranks cannot lie ``per_node`` to a node: the ranks of a group that share a node
    are at most all of them, and the group fills whole nodes. None: they can (or no layout given)."""
    if per_node is None:
        return None
    if per_node > size:
        return f"{per_node} ranks per node, more than the group's {size}"
    if size % per_node:
        return f"{size} ranks do not fill whole nodes of {per_node} (give ranks per node that divide the size)"
    return None


@dataclass(frozen=True)
class GraphFile:
    """A graph file as a workload: ``fxglue.pipeline.prepare`` loads it afresh each time (the
    scheduler reorders a traced graph in place, so one load serves one problem)."""

    path: str
    groups: tuple[GroupSpec, ...] | None = None  # None: the file's own

    @property
    def name(self) -> str:
        return f"graph:{Path(self.path).name}"

    def load(self) -> TracedWorkload:
        return load_graph(self.path, None if self.groups is None else list(self.groups))


# ---------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------


def _first_line(e: BaseException) -> str:
    try:
        text = str(e)
    except KeyboardInterrupt:
        raise
    except BaseException:  # an exception of the file's whose __str__ fails: its type names it
        text = ""
    text = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _refuse_bytes(path: Path, what: str, shape, stride, dtype: torch.dtype) -> None:
    """A tensor whose storage is ``planner.core.problem.MAX_BYTES`` or more, refused by name: no
    problem can record it (its collectives' bytes and its matmuls' times pass the schema's
    bounds), and it is named here, where the graph says it."""
    from planner.core.problem import MAX_BYTES

    try:
        dims = [int(d) for d in shape]
        steps = [int(s) for s in stride] if stride is not None else None
    except (TypeError, ValueError):  # not a plain shape: torch says what is wrong when it makes the tensor
        return
    elements = math.prod(dims)
    if steps is not None and elements:  # a strided tensor's storage spans its largest offset
        elements = max(elements, 1 + sum((d - 1) * abs(s) for d, s in zip(dims, steps)))
    if elements * dtype.itemsize >= MAX_BYTES:
        raise GraphFileError(f"{path}: {what}: shape {tuple(dims)} of {str(dtype).removeprefix('torch.')} is "
                             f"{elements * dtype.itemsize:.3g} bytes, beyond what a problem records (< 2**62)")


class _FakeInputReader:
    """What ``load_args(reader)`` calls, answered with fake CPU tensors (under the caller's
    FakeTensorMode) of the recorded shapes and dtypes; devices are ignored. A tensor too large
    for a problem is refused by its position, and remembered, so a ``load_args`` that catches
    the error is refused all the same."""

    def __init__(self, path: Path):
        self.path = path
        self.args: list = []
        self.refused: GraphFileError | None = None

    def storage(self, storage_hash, nbytes, *, device=None, dtype_hint=None):
        return (nbytes, dtype_hint)

    def tensor(self, storage, shape, stride=None, *, storage_offset=None, dtype=None, requires_grad=None,
               is_leaf=None, **metadata):
        dtype = dtype or torch.float32
        try:
            _refuse_bytes(self.path, f"load_args: input {len(self.args)}", shape, stride, dtype)
        except GraphFileError as e:
            self.refused = self.refused or e
            raise
        t = (torch.empty(tuple(shape), dtype=dtype) if stride is None
             else torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype))
        self.args.append(t)
        return t

    def symint(self, val):
        self.args.append(val)
        return val


class _Expired(BaseException):
    """Raised in the file's code at the time limit: a BaseException, so the file's own
    ``except Exception`` does not swallow it."""


def _load_timeout() -> float:
    """Seconds the file's code may run: ``LOAD_TIMEOUT_S`` unless the environment says otherwise."""
    text = os.environ.get(LOAD_TIMEOUT_ENV)
    if text is None:
        return LOAD_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise GraphFileError(f"{LOAD_TIMEOUT_ENV}={text!r}: give the seconds a graph file may take to load "
                             "(0: no limit)")
    return value


class _MetaDevices(TorchFunctionMode):
    """Every non-CPU device literal of the file's tensors (``device='cuda:0'``, ``.to("cuda:0")``,
    ``.cuda()``, as torch's repro writer emits parameters, buffers and constants) sent to the meta
    device: no GPU is needed and no memory taken; only shapes and dtypes are kept (``_fake_state``)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0].to("meta")  # this mode is off inside its own handler
        if _off_cpu(kwargs.get("device")):
            kwargs["device"] = torch.device("meta")
        if func is torch.Tensor.to and len(args) > 1 and _off_cpu(args[1]):
            args = (args[0], torch.device("meta"), *args[2:])
        return func(*args, **kwargs)


def _off_cpu(device) -> bool:
    """Whether ``device`` names a device other than the CPU and meta (a bare int is a CUDA index)."""
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError:
            return False
    if isinstance(device, int) and not isinstance(device, bool):
        return True
    return isinstance(device, torch.device) and device.type not in ("cpu", "meta")


_STREAMS = ("stdin", "stdout", "stderr", "__stdin__", "__stdout__", "__stderr__")
_HOOKS = ("excepthook", "unraisablehook", "displayhook")
_ITIMERS = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)
_CATCHABLE = sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP})


def _itimer_clocks() -> dict[int, float]:
    """What each interval timer counts down: wall time, user CPU time, all CPU time."""
    return {signal.ITIMER_REAL: time.monotonic(), signal.ITIMER_VIRTUAL: os.times().user,
            signal.ITIMER_PROF: time.process_time()}


class _ProcessState:
    """What code run in this process changes for everything run after it, as it was when made: the
    signal handlers (main thread only: only it can set them) and mask, the interval timers, the
    standard streams, ``sys``'s hooks and the builtins. ``restore`` puts it back, each timer less
    the time since."""

    def __init__(self):
        main = threading.current_thread() is threading.main_thread()
        self.handlers = {s: signal.getsignal(s) for s in _CATCHABLE} if main else {}
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
        self.timers = {t: signal.getitimer(t) for t in _ITIMERS}
        self.clocks = _itimer_clocks()
        self.sys_names = {n: getattr(sys, n, None) for n in _STREAMS + _HOOKS}
        self.builtins = dict(vars(builtins))

    def restore(self) -> None:
        # the alarm and a Ctrl-C wait until all is back: blocked, they arrive when the mask is restored
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGINT})
        for s, handler in self.handlers.items():
            if signal.getsignal(s) != handler:  # None: a handler set outside Python, which it cannot set back
                signal.signal(s, signal.SIG_DFL if handler is None else handler)
        now = _itimer_clocks()
        for t, (left, interval) in self.timers.items():
            signal.setitimer(t, max(left - (now[t] - self.clocks[t]), 1e-3) if left > 0 else 0, interval)
        for n, value in self.sys_names.items():
            setattr(sys, n, value)
        names = vars(builtins)
        for n in set(names) - set(self.builtins):
            del names[n]
        names.update(self.builtins)
        signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)


class _KeptOpen:
    """A standard stream as the file's code sees it: closing it only flushes it, so the stream the
    command prints to afterwards is still open (Python's own ``sys.stdout`` is the very object a
    file's ``sys.stdout.close()`` would close)."""

    def __init__(self, stream):
        self._stream = stream

    def close(self) -> None:
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def __iter__(self):
        return iter(self._stream)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _quiet_expiry(previous):
    """``sys.unraisablehook`` that drops ``_Expired``: the limit can land in a finalizer the
    garbage collector runs inside the file's code, where Python prints it as "Exception ignored"
    and goes on; the file's code is interrupted again a second later."""
    def hook(unraisable) -> None:
        if not (isinstance(unraisable.exc_type, type) and issubclass(unraisable.exc_type, _Expired)):
            previous(unraisable)
    return hook


def _keep_streams_open() -> None:
    for n in _STREAMS:
        stream = getattr(sys, n, None)
        if stream is not None:
            setattr(sys, n, _KeptOpen(stream))


def _raise_in_thread(ident: int, exc: type[BaseException] | None) -> None:
    """CPython's ``PyThreadState_SetAsyncExc``: ``exc`` raised in thread ``ident`` at its next
    bytecode; None withdraws one not raised yet."""
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None if exc is None else ctypes.py_object(exc))


class _Watchdog:
    """The time limit for a file that defeats the alarm (ignores SIGALRM, replaces its handler,
    cancels the timer): from ``WATCHDOG_GRACE_S`` after the limit, once a second while the file's
    code runs, a thread raises ``_Expired`` in the main thread as an asynchronous exception.

    Why that: re-arming the alarm from the thread would be undone by the file as before, and a
    signal (``pthread_kill``, ``_thread.interrupt_main``) reaches only the handler the file left,
    while an asynchronous exception is raised at the file's next bytecode whatever it did to
    signals. A call blocked in C runs no bytecode: while our handler is still installed (the file
    only cancelled the timer) SIGALRM is sent too, which ends the call. Nothing is raised outside
    the file's code (``enter`` / ``leave``): the process is put back after it, not by it."""

    def __init__(self, code: "_FileCode", first_s: float):
        self._code = code
        self._main = threading.main_thread().ident
        self._lock = threading.Lock()
        self._inside = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(first_s,), name="bucketplan-graph-file-limit",
                                        daemon=True)
        self._thread.start()

    def enter(self) -> None:
        with self._lock:
            self._inside = True

    def leave(self) -> None:
        with self._lock:
            self._inside = False
            _raise_in_thread(self._main, None)

    def stop(self) -> None:
        self.leave()
        self._done.set()
        self._thread.join()

    def _watch(self, first_s: float) -> None:
        wait = first_s
        while not self._done.wait(wait):
            with self._lock:
                if self._inside:
                    self._code.expired = True
                    if signal.getsignal(signal.SIGALRM) == self._code.on_alarm:
                        signal.pthread_kill(self._main, signal.SIGALRM)
                    _raise_in_thread(self._main, _Expired)
            wait = 1.0


def _restore_places(cwd: str | None, environ: dict, configs: dict, saved: dict) -> None:
    """The working directory, the environment variables and torch's configs as they were."""
    if cwd is not None:
        try:
            os.chdir(cwd)
        except OSError:  # the file removed it
            pass
    os.environ.clear()
    os.environ.update(environ)
    with warnings.catch_warnings():  # restoring a deprecated key warns; it is only put back
        warnings.simplefilter("ignore", FutureWarning)
        for c, m in configs.items():
            m.load_config(saved[c])


class _FileCode:
    """The graph file's own code, run contained (module docstring, *How a file is read*):
    ``call`` runs one piece of it, turns what it raises -- an error, an exit, any other
    BaseException, the time limit -- into one line naming the file, and puts back what it changed
    in the process (``_ProcessState``); leaving ``contained()`` puts the process back as it was.
    KeyboardInterrupt is left to propagate: the command ends as at any Ctrl-C."""

    def __init__(self, path: Path):
        self.path = path
        self.limit = _load_timeout()
        self.expired = False
        self._timer = False
        self._watchdog: _Watchdog | None = None

    @contextmanager
    def contained(self):
        import importlib

        process = _ProcessState()  # the caller's, before the alarm is ours
        environ = dict(os.environ)
        configs = {c: importlib.import_module(c) for c in _CONFIGS}
        saved = {c: m.save_config() for c, m in configs.items()}
        try:
            cwd = os.getcwd()
        except OSError:  # the directory is gone: there is none to go back to
            cwd = None
        real_exit, pid = os._exit, os.getpid()

        def exit_refused(code):
            if os.getpid() != pid:  # a child the file forked ends as it asked
                real_exit(code)
            raise SystemExit(code)

        # SIGALRM reaches the main thread only; elsewhere (a caller's worker thread) there is no limit
        self._timer = (self.limit > 0 and hasattr(signal, "setitimer")
                       and threading.current_thread() is threading.main_thread())
        if self._timer:
            sys.unraisablehook = _quiet_expiry(sys.unraisablehook)
            signal.signal(signal.SIGALRM, self.on_alarm)
            # repeating each second: a file that swallows one alarm is interrupted again
            signal.setitimer(signal.ITIMER_REAL, self.limit, 1.0)
            self._watchdog = _Watchdog(self, self.limit + WATCHDOG_GRACE_S)
        os._exit = exit_refused
        try:
            yield self
        except _Expired:  # it fired between two calls of the file's code
            raise self._expired_error("loading") from None
        finally:
            try:
                self._put_back(process, stop=True)  # first: no alarm cuts short what follows
            finally:
                os._exit = real_exit
                _restore_places(cwd, environ, configs, saved)

    def on_alarm(self, signum, frame) -> None:
        self.expired = True
        raise _Expired

    def _disarm(self) -> None:
        if self._timer:
            signal.setitimer(signal.ITIMER_REAL, 0)

    def _put_back(self, state: _ProcessState, *, stop: bool = False) -> None:
        """``state`` restored and the watchdog told the file's code has ended (``stop``: the watchdog
        and the alarm stopped), whatever arrives meanwhile: the alarm only marks the limit passed,
        and a Ctrl-C is raised once all is back."""
        interrupted = None
        while True:
            try:
                if self._watchdog is not None and stop:
                    self._watchdog.stop()
                elif self._watchdog is not None:
                    self._watchdog.leave()
                if stop:
                    self._disarm()
                state.restore()
                break
            except _Expired:
                self.expired = True
            except KeyboardInterrupt as e:
                interrupted = e
        if interrupted is not None:
            raise interrupted

    def _expired_error(self, failed: str) -> GraphFileError:
        self._disarm()
        return GraphFileError(f"{self.path}: {failed}: its code still ran at the time limit of {self.limit:g} s "
                              f"({LOAD_TIMEOUT_ENV} sets another; 0: none)")

    def call(self, failed: str, fn, *args, devices: bool = False):
        """``fn(*args)``, the file's code (``devices``: under ``_MetaDevices``); what it raises
        is one line, ``FILE: {failed}: ...``."""
        try:
            result = self._run(fn, args, devices)
        except (GraphFileError, KeyboardInterrupt):
            raise
        except _Expired:
            raise self._expired_error(failed) from None
        except SystemExit as e:
            raise GraphFileError(f"{self.path}: {failed}: its code exited (SystemExit({e.code!r}) or os._exit); "
                                 "a graph file defines Repro and load_args and must not end the run") from None
        except BaseException as e:  # an error, GeneratorExit, the file's own BaseException
            raise GraphFileError(f"{self.path}: {failed}: {_first_line(e)}") from None
        if self.expired:  # it caught the alarm and carried on
            raise self._expired_error(failed)
        return result

    def _run(self, fn, args: tuple, devices: bool):
        """``fn(*args)`` with the standard streams kept open and the watchdog watching while it
        runs, and the process state it changed put back after it."""
        state = _ProcessState()
        try:
            _keep_streams_open()
            if self._watchdog is not None:
                self._watchdog.enter()
            with _MetaDevices() if devices else nullcontext():
                return fn(*args)
        finally:
            self._put_back(state)


# torch-level factories a dumped forward may call with literals only (the repro format calls
# ``torch.ops.aten.*``); recorded as nodes like the ops, so their device literal is mapped too
_TORCH_FACTORIES = frozenset(
    getattr(torch, name) for name in ("empty", "empty_strided", "zeros", "ones", "full", "arange", "scalar_tensor",
                                      "tensor", "eye", "linspace", "rand", "randn", "randint"))


class _ConstantOpsAsNodes(TorchFunctionMode):
    """``torch.fx`` records an op only when a Proxy is among its arguments: an op of literals alone
    -- every factory of a repro graph (``full([], 0, ..., device=...)``, ``empty.memory_format(...,
    device=device(type='cuda', index=0))``, ``arange``, ``scalar_tensor``, ...) -- would run for real
    while the forward is traced, on a GPU this machine does not have, and its result would be baked
    in as a constant. Here such a call becomes a node of the graph like any other, so its device
    literal is mapped to the CPU and the trace makes it a fake tensor of the trace's own mode."""

    def __init__(self, tracer: fx.Tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))
        if (op or func in _TORCH_FACTORIES) and not _has_proxy((args, kwargs)):
            return self.tracer.create_proxy("call_function", func, args, kwargs)
        return func(*args, **kwargs)


class _FileTracer(fx.Tracer):
    """``fx.Tracer`` that remembers, for every node, where in the graph file it was made
    (``graph_file_at``: the forward's code and instruction offset; ``_file_line`` turns it into
    a line), so a node that does not trace is named as the file names it. The file's forward runs
    in one frame for the whole trace: it is found once, and only its instruction offset is read
    for each node -- a line number is computed by scanning the code's line table, and per node
    on a forward of 8,000 lines that tripled the time of the trace."""

    def __init__(self, filename: str):
        super().__init__()
        self.filename = filename
        self._forward = None

    def trace(self, root, *args, **kwargs):
        try:
            return super().trace(root, *args, **kwargs)
        finally:
            self._forward = None  # the frame holds the forward's locals

    def create_proxy(self, kind, target, args, kwargs, *rest, **more):
        proxy = super().create_proxy(kind, target, args, kwargs, *rest, **more)
        if self._forward is None:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename != self.filename:
                frame = frame.f_back
            self._forward = frame  # None before the forward runs (its inputs): looked for again
        if self._forward is not None:
            proxy.node.meta["graph_file_at"] = (self._forward.f_code, self._forward.f_lasti)
        return proxy


def _file_line(node: fx.Node) -> int | None:
    """The line of the graph file that made ``node`` (``_FileTracer``), if it is known."""
    at = node.meta.get("graph_file_at")
    if at is None:
        return None
    code, offset = at
    return next((line for start, end, line in code.co_lines() if start <= offset < end), None)


def _has_proxy(tree) -> bool:
    return any(isinstance(x, fx.Proxy) for x in tree_flatten(tree)[0])


def _symbolic_trace(repro: torch.nn.Module, filename: str) -> fx.GraphModule:
    """``fx.symbolic_trace`` with the ops of literals recorded as nodes (``_ConstantOpsAsNodes``)
    and each node's line of the file remembered (``_FileTracer``)."""
    tracer = _FileTracer(filename)
    with _ConstantOpsAsNodes(tracer):
        graph = tracer.trace(repro)
    return fx.GraphModule(tracer.root, graph, type(repro).__name__)


def _assigned_names(source: str) -> dict[int, str]:
    """Line -> the name a simple assignment on it binds (``index_put_3 = torch.ops...``): how the
    file names each node."""
    names = {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return names
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                names.setdefault(line, node.targets[0].id)
    return names


@contextmanager
def _plain_graph_module_calls():
    """A GraphModule called as any module. torch's wrapper around its call prints the generated
    code to stderr when an error is raised in that code itself (an index out of range in a
    ``getitem``), and strips the error's traceback; a graph file that does not trace is one line,
    and the traceback is what names its node (``_failing_node``)."""
    from torch.fx.graph_module import _WrappedCall

    wrapped = _WrappedCall.__call__

    def plain(self, obj, *args, **kwargs):
        if self.cls_call is not None:
            return self.cls_call(obj, *args, **kwargs)
        return super(self.cls, obj).__call__(*args, **kwargs)

    _WrappedCall.__call__ = plain
    try:
        yield
    finally:
        _WrappedCall.__call__ = wrapped


def _failing_node(e: BaseException) -> fx.Node | None:
    """The graph node whose op raised ``e``: the innermost frame of a GraphModule's generated
    forward in the traceback, mapped to its node by the module's own line map."""
    node = None
    tb = e.__traceback__
    while tb is not None:
        gm = tb.tb_frame.f_locals.get("self")
        if (isinstance(gm, fx.GraphModule) and getattr(gm, "_lineno_map", None)
                and tb.tb_frame.f_code.co_name == "forward"):
            index = gm._lineno_map.get(tb.tb_lineno - getattr(gm, "_prologue_start", 0))
            nodes = list(gm.graph.nodes)
            if index is not None and 0 <= index < len(nodes):
                node = nodes[index]
        tb = tb.tb_next
    return node


def _trace_failure(path: Path, e: BaseException, source: str) -> GraphFileError:
    """One line for a graph that does not trace: the node (as the file names it, where it can be
    told) and its op, then the first line of what torch raised."""
    node = _failing_node(e)
    where = ""
    if node is not None:
        line = _file_line(node)
        name = _assigned_names(source).get(line, node.name) if line is not None else node.name
        target = node.target
        op = (f"{target.namespace}.{target._opname}.{target._overloadname}" if isinstance(target, torch._ops.OpOverload)
              else getattr(target, "__name__", str(target)))
        where = f"node {name} ({op}{f', line {line}' if line is not None else ''}): "
    return GraphFileError(f"{path}: the graph does not trace on fake CPU tensors: {where}{_first_line(e)}")


def _exec_module(path: Path):
    """The file run as a module, not as ``__main__`` (inside ``_FileCode.call``)."""
    name = "bucketplan_graph_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    # a source loader whatever the suffix (a dumped graph is not always named .py)
    spec = importlib.util.spec_from_loader(name, importlib.machinery.SourceFileLoader(name, str(path)))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _main_block_groups(source: str) -> dict | None:
    """The literal torch's repro passes to ``setup_fake_process_groups`` under ``__main__``."""
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
                == "setup_fake_process_groups" and node.args):
            try:
                return ast.literal_eval(node.args[0])
            except ValueError:
                return None
    return None


def _config_groups(path: Path, code: _FileCode, module, source: str) -> tuple[list[GroupSpec], str]:
    """The groups the file itself sizes: ``get_pg_config()``, else torch's
    ``setup_fake_process_groups``; and which of them said so."""
    config, said = None, "get_pg_config()"
    if callable(getattr(module, "get_pg_config", None)):
        config = code.call("get_pg_config() failed", module.get_pg_config)
    if config is None:
        config, said = _main_block_groups(source) or {}, "setup_fake_process_groups"
    if not isinstance(config, dict):
        raise GraphFileError(f"{path}: get_pg_config() returned {type(config).__name__}, not a dict of groups")

    def ranks(n) -> bool:  # a count of ranks: bool is an int to Python, not to us
        return isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_GROUP_SIZE

    groups = []
    for name, info in config.items():
        info = {"size": info} if isinstance(info, int) else info
        size, role, per_node = (info.get("size"), info.get("role", "dp"), info.get("ranks_per_node")
                                ) if isinstance(info, dict) else (None, None, None)
        if not ranks(size) or role not in ROLES or not (per_node is None or ranks(per_node)):
            raise GraphFileError(f"{path}: {said}: group {name!r}: {info!r} is not {{'size': N[, 'role': 'dp'|'tp', "
                                 f"'ranks_per_node': R]}} with N and R from 1 to {MAX_GROUP_SIZE} ranks")
        why = _layout_error(size, per_node)
        if why:
            raise GraphFileError(f"{path}: {said}: group {name!r}: {why}")
        groups.append(GroupSpec(str(name), size, role, per_node))
    return groups, said


def _is_device_type(t) -> bool:
    """Whether a schema argument's type is ``Device`` or ``Device?``."""
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch.DeviceObjType)


def _map_devices(gm: fx.GraphModule) -> int:
    """Every device literal of the graph on the CPU (a trace here has no GPU); how many were mapped.
    A ``torch.device`` is mapped wherever it stands; a string (``'cuda:0'``) or a bare index (``0``,
    a CUDA device to torch) only where the op's schema says the argument is a device, so no other
    string or int argument is touched."""
    from torch.utils._pytree import tree_map

    mapped = 0
    cpu = torch.device("cpu")

    def to_cpu(x):
        nonlocal mapped
        if isinstance(x, torch.device) and x.type != "cpu":
            mapped += 1
            return cpu
        return x

    def literal_to_cpu(x):
        nonlocal mapped
        if isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool)):
            try:
                device = torch.device(x)
            except (RuntimeError, TypeError):
                return x  # not a device: torch says what is wrong when the op runs
            if device.type != "cpu":
                mapped += 1
                return cpu
        return x

    for n in gm.graph.nodes:
        args, kwargs = tree_map(to_cpu, n.args), tree_map(to_cpu, n.kwargs)
        schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
        if n.op == "call_method" and n.target == "to" and len(args) > 1:  # x.to('cuda:0', ...)
            args = (args[0], literal_to_cpu(args[1]), *args[2:])
        if schema is not None:
            for i, a in enumerate(schema.arguments):
                if not _is_device_type(a.type):
                    continue
                if i < len(args) and not a.kwarg_only:
                    args = (*args[:i], literal_to_cpu(args[i]), *args[i + 1:])
                if a.name in kwargs:
                    kwargs = {**kwargs, a.name: literal_to_cpu(kwargs[a.name])}
        elif "device" in kwargs:  # a torch-level factory or a method (torch.empty(..., device='cuda'))
            kwargs = {**kwargs, "device": literal_to_cpu(kwargs["device"])}
        n.args, n.kwargs = args, kwargs
    gm.recompile()
    return mapped


def _fake_state(path: Path, gm: fx.GraphModule, fake_mode) -> None:
    """Every parameter, buffer and tensor attribute of the traced module, as a fake CPU tensor of
    its shape, strides and dtype in the trace's mode: ``make_fx`` refuses real tensors beside the
    fake inputs, and the meta ones ``_MetaDevices`` made are on no device the graph runs on. A
    tensor shared by two names stays shared."""
    made: dict[int, torch.Tensor] = {}
    kept = []  # the originals, so no id is reused while ``made`` is keyed by them

    def fake(name: str, t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            kept.append(t)
            try:
                _refuse_bytes(path, f"tensor {name!r} of the Repro module", t.shape, t.stride(), t.dtype)
                with fake_mode:
                    f = torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype)
                    made[id(t)] = torch.nn.Parameter(f, requires_grad=t.requires_grad) if isinstance(
                        t, torch.nn.Parameter) else f
            except GraphFileError:
                raise
            except Exception as e:
                raise GraphFileError(f"{path}: tensor {name!r} of the Repro module: {_first_line(e)}") from None
        return made[id(t)]

    for prefix, mod in gm.named_modules():
        at = f"{prefix}." if prefix else ""
        for table in (mod._parameters, mod._buffers):
            for name, t in list(table.items()):
                if t is not None:
                    table[name] = fake(at + name, t)
        for name, t in list(vars(mod).items()):
            if isinstance(t, torch.Tensor):
                vars(mod)[name] = fake(at + name, t)


def _op_group_sizes(path: Path, gm: fx.GraphModule) -> dict[str, tuple[str, int]]:
    """The size each group's collectives give it -- all_gather and reduce_scatter name their
    group's size, and the graph's shapes are those of that size -- as (first collective, size);
    collectives on one group that disagree are refused."""
    from torch._inductor.fx_passes.overlap_scheduling import get_group_name

    from fxglue.estimator import collective_kind

    sizes: dict[str, tuple[str, int]] = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or collective_kind(n) is None:
            continue
        names = [a.name for a in getattr(getattr(n.target, "_schema", None), "arguments", ())]
        if "group_size" not in names:  # all_reduce: its group's size is in no argument
            continue
        i = names.index("group_size")
        size = n.args[i] if i < len(n.args) else n.kwargs.get("group_size")
        group = get_group_name(n)
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_GROUP_SIZE:
            raise GraphFileError(f"{path}: collective {n.name!r} on group {group!r} gives a group size of {size!r}, "
                                 f"not a count of ranks from 1 to {MAX_GROUP_SIZE}")
        first = sizes.setdefault(group, (n.name, size))
        if first[1] != size:
            raise GraphFileError(f"{path}: collectives on group {group!r} disagree on its size: {first[0]!r} "
                                 f"gives {first[1]} ranks, {n.name!r} {size}")
    return sizes


def graph_group_names(gm: fx.GraphModule) -> list[str]:
    """The process-group names the graph's collectives use, in order of first use."""
    from torch._inductor.fx_passes.overlap_scheduling import get_group_name

    from fxglue.estimator import collective_kind

    names: dict[str, None] = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and collective_kind(n) is not None:
            names[get_group_name(n)] = None
    return list(names)


def _register_groups(path: Path, groups: list[GroupSpec]) -> None:
    """The graph's group names registered on torch's fake process group (rank 0): a group as large
    as the world is the world group, a smaller one a new group of the first ranks. Names are
    often small integers ('0', '1'), and an earlier trace in this process may have left one
    registered at another size (a 2-D mesh's groups): then the fake world is started afresh, so
    what a file reads as does not depend on what ran before it."""
    from torch._C._distributed_c10d import _register_process_group
    from torch.distributed.distributed_c10d import _get_group_size_by_name

    from fxglue.models import workloads
    from fxglue.models.workloads import ensure_fake_world

    def registered(name: str) -> int | None:
        try:
            return _get_group_size_by_name(name)
        except Exception:  # not registered yet
            return None

    ensure_fake_world(max(g.size for g in groups))
    if dist.get_backend() == "fake" and any(registered(g.name) not in (None, g.size) for g in groups):
        world = dist.get_world_size()
        dist.destroy_process_group()
        workloads._MESH_CACHE.clear()
        ensure_fake_world(world)
    world = dist.get_world_size()
    for g in groups:
        size = registered(g.name)
        if size == g.size:
            continue
        if size is not None:
            raise GraphFileError(f"{path}: group {g.name!r} of {g.size} ranks: that name is taken by a group of "
                                 f"{size} ranks in this process (the world group is {dist.group.WORLD.group_name!r})")
        # a hashed name (use_local_synchronization), not the next of torch's counter ('1', '2', ...),
        # which is often the very name the file gives one of its groups
        pg = dist.group.WORLD if g.size == world else dist.new_group(list(range(g.size)),
                                                                     use_local_synchronization=True)
        _register_process_group(g.name, pg)
        if g.name.isdecimal():  # torch's counter names later groups: let it count past this one
            from torch.distributed import distributed_c10d

            distributed_c10d._world.group_count = max(distributed_c10d._world.group_count, int(g.name) + 1)


def load_graph(path: str | os.PathLike, groups: list[GroupSpec] | None = None) -> TracedWorkload:
    """A repro-format graph file as a traced workload, on fake CPU tensors (module docstring)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fxglue.models.workloads import trace_step
    from planner.core.io import read_regular_text

    path = Path(path)
    home = Path(os.path.abspath(path)).parent  # before the file's code runs: it may change directory
    t0 = time.perf_counter()
    try:
        source = read_regular_text(path, 256 << 20, "graph file")
    except (OSError, ValueError) as e:
        raise GraphFileError(f"{path}: cannot read the graph file: {e}") from None
    code = _FileCode(path)
    fake_mode = FakeTensorMode()
    reader = _FakeInputReader(path)
    with code.contained():
        module = code.call("does not load", _exec_module, path, devices=True)
        repro = getattr(module, "mod", None)
        if not isinstance(repro, torch.nn.Module):
            repro = getattr(module, "Repro", None)
            repro = (code.call("Repro() failed", repro, devices=True)
                     if isinstance(repro, type) and issubclass(repro, torch.nn.Module) else None)
        load_args = getattr(module, "load_args", None)
        if repro is None or not callable(load_args):
            raise GraphFileError(f"{path}: not a repro file: it needs a Repro module (or `mod`) and "
                                 "load_args(reader), as torch's save_graph_repro writes them")
        if getattr(load_args, "_version", 0) > 0:
            raise GraphFileError(f"{path}: load_args is version {load_args._version}; torch {torch.__version__} "
                                 "writes version 0")
        gm = code.call("the Repro module does not trace", _symbolic_trace, repro, str(path))
        mapped = _map_devices(gm)
        _fake_state(path, gm, fake_mode)
        used = graph_group_names(gm)
        if not used:
            raise GraphFileError(f"{path}: no collectives (all_gather, reduce_scatter, all_reduce) in the graph")
        op_sizes = _op_group_sizes(path, gm)
        given, said = (_config_groups(path, code, module, source) if groups is None else (groups, "--group"))
        specs = {g.name: g for g in given}
        missing = [name for name in used if name not in specs]
        if missing:
            named = "--group" if groups is not None else "get_pg_config() nor setup_fake_process_groups"
            raise GraphFileError(f"{path}: the graph's collectives use group {missing[0]!r}, which neither {named} "
                                 f"sizes: give --group {missing[0]}=SIZE")
        for name, (node, size) in op_sizes.items():
            if specs[name].size != size:
                raise GraphFileError(f"{path}: collective {node!r} runs on group {name!r} of {size} ranks, but "
                                     f"{said} sizes that group {specs[name].size} (the graph's shapes are those of "
                                     f"{size})")
        in_use = [specs[name] for name in used]
        _register_groups(path, in_use)
        with fake_mode:
            code.call("load_args(reader) failed", load_args, reader)
        if reader.refused is not None:  # load_args caught the refusal and went on
            raise reader.refused
        table = _collectives_table(path, home, code, module)
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)  # it logs an op's failure with its traceback; the failure is our one line
    try:
        with _plain_graph_module_calls():
            traced_gm = trace_step(gm, reader.args, fake_mode=fake_mode)
    except Exception as e:
        raise _trace_failure(path, e, source) from None
    finally:
        fake_log.setLevel(level)
    groups = _workload_groups(path, in_use)
    return TracedWorkload(name=GraphFile(str(path)).name, gm=traced_gm, fake_mode=fake_mode,
                          groups=groups, trace_s=time.perf_counter() - t0,
                          meta={**_saved_meta(module), "graph_file": str(path), "devices_mapped": mapped,
                                **_table_meta(path, table),
                                "groups": {"dp": groups.dp, "tp": groups.tp},  # as built-in workloads record them
                                "graph_groups": {g.name: {"size": g.size, "role": g.role} for g in in_use},
                                "group_ranks_per_node": {g.role: g.ranks_per_node for g in in_use
                                                         if g.ranks_per_node is not None}})


def _collectives_table(path: Path, home: Path, code: _FileCode, module) -> Path | None:
    """The measured collectives table the file names with ``get_colls_estimations_file()``, as
    AutoParallel's overlap-simulator repro files do (``planner.cost.measured``: its format): a path
    relative to the graph file (where AutoParallel keeps them, beside its repro files) or
    absolute, read here once so a bad table is refused while the file is loaded; one that is not
    there is returned unread (``_table_meta``). None: the file names none."""
    from planner.cost.measured import read_series

    name_table = getattr(module, "get_colls_estimations_file", None)
    if not callable(name_table):
        return None
    name = code.call("get_colls_estimations_file() failed", name_table)
    if not isinstance(name, (str, os.PathLike)) or not str(name).strip():
        raise GraphFileError(f"{path}: get_colls_estimations_file() returned {name!r}, not the path of a collectives "
                             "table")
    table = home / name  # an absolute name stays as it is
    if not table.exists():
        return table
    try:
        read_series(table)
    except (OSError, ValueError) as e:  # MeasuredError names the table and line; BadFileError the table
        raise GraphFileError(f"{path}: get_colls_estimations_file() names {str(name)!r}: {e}") from None
    return table


def _table_meta(path: Path, table: Path | None) -> dict:
    """The workload's meta for the table the file names: where it is; or, when it is not there (a
    repro file copied alone), where it was looked for, and a warning on stderr: the file's groups
    are then priced as with no table, so the user need not edit the file to plan it."""
    if table is None:
        return {}
    if table.exists():
        return {"collectives_table": str(table)}
    print(f"warning: {path}: get_colls_estimations_file() names {table}, which is not there; its groups are "
          "priced by --collectives or --profile where given, else by the cluster preset's model", file=sys.stderr)
    return {"collectives_table_missing": str(table)}


def _workload_groups(path: Path, groups: list[GroupSpec]) -> Groups:
    """``Groups`` of the graph: the tensor-parallel group, if one is marked, and the largest
    data-parallel one (every unmarked group is priced as data-parallel)."""
    tp = [g for g in groups if g.role == "tp"]
    if len(tp) > 1:
        raise GraphFileError(f"{path}: groups {', '.join(repr(g.name) for g in tp)} are all marked tp; one "
                             "tensor-parallel group is supported")
    dp = max((g for g in groups if g.role == "dp"), key=lambda g: g.size, default=None)
    per_role: dict[str, int] = {}
    for g in groups:
        if g.ranks_per_node is not None and per_role.setdefault(g.role, g.ranks_per_node) != g.ranks_per_node:
            raise GraphFileError(f"{path}: {g.role} groups give different ranks per node ({per_role[g.role]} and "
                                 f"{g.ranks_per_node}); one layout per role is supported")
    if dp is None:
        return Groups(dp=tp[0].name, dp_size=tp[0].size, tp=tp[0].name, tp_size=tp[0].size)
    return Groups(dp=dp.name, dp_size=dp.size, tp=tp[0].name if tp else None, tp_size=tp[0].size if tp else 1)


def _saved_meta(module) -> dict:
    """What ``save_graph`` recorded besides the graph (absent from other tools' files)."""
    meta = {}
    for key in ("parameters", "blocks", "workload"):
        value = getattr(module, f"bucketplan_{key}", None)
        if value is not None:
            meta[f"saved_{key}"] = value
    return meta


# ---------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------


def save_graph(traced: TracedWorkload, path: str | os.PathLike) -> Path:
    """Write a traced (not yet scheduled) workload as a repro file that ``load_graph`` reads back
    to the same graph: torch's ``save_graph_repro``, plus ``get_pg_config()`` with the groups'
    roles and, where the workload's module can be rebuilt, its parameter names and blocks."""
    from torch._dynamo.repro.after_aot import save_graph_repro

    from fxglue.blocks import block_source
    from planner.core.io import atomic_write_text

    path = Path(path)
    args = [n.meta["val"] for n in traced.gm.graph.find_nodes(op="placeholder")]
    buf = io.StringIO()
    with traced.fake_mode:
        save_graph_repro(buf, traced.gm, args, "inductor")
    text = buf.getvalue()
    main = "if __name__ == '__main__':"
    if main not in text:
        raise GraphFileError(f"{traced.name}: torch's repro writer wrote no __main__ block; cannot add the groups")
    from torch.distributed.distributed_c10d import _get_group_size_by_name

    roles = {traced.groups.tp: "tp"} if traced.groups.tp else {}
    config = {name: {"size": _get_group_size_by_name(name), "role": roles.get(name, "dp")}
              for name in graph_group_names(traced.gm)}
    ours = ["# bucketplan: the graph's process groups (name -> size, role); ranks per node come from the cluster",
            "def get_pg_config():", f"    return {config!r}", ""]
    try:
        names, plans = block_source(traced)
        ours += ["# bucketplan: the parameter each placeholder is, and the transformer blocks (per-block plans)",
                 f"bucketplan_parameters = {names!r}", f"bucketplan_blocks = {plans!r}", ""]
    except Exception:  # a module that cannot be rebuilt: no blocks, as when extracting it directly
        pass
    ours += [f"bucketplan_workload = {({k: v for k, v in traced.meta.items() if k != 'groups'})!r}", ""]
    text = text.replace(main, "\n".join(ours) + "\n" + main, 1)
    atomic_write_text(path, text)
    return path
