"""A Ctrl-C during a torch module's import is held until the import ends (``ctrl_c._NativeImports``):
a module whose body sends itself SIGINT, then finishes, loaded through the deferring loader, raises
KeyboardInterrupt only after its last line. Prints what happened, one fact a line."""

import importlib.util
import pathlib
import tempfile

from bucketplan.cli.ctrl_c import CtrlC, _Deferring

latch = CtrlC.install()
body = pathlib.Path(tempfile.mkdtemp()) / "slow_native.py"
body.write_text("import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.2)\nFINISHED = True\n")
spec = importlib.util.spec_from_file_location("slow_native", body)
spec.loader = _Deferring(spec.loader, latch)
module = importlib.util.module_from_spec(spec)
try:
    spec.loader.exec_module(module)
    print("not raised")
except KeyboardInterrupt:
    print("raised after the body", getattr(module, "FINISHED", False))
print("torch deferred", type(latch.finder.find_spec("torch", None).loader).__name__ == "_Deferring")
print("json left alone", latch.finder.find_spec("json", None) is None)
latch.uninstall()
print("finder removed", latch.finder not in __import__("sys").meta_path)
